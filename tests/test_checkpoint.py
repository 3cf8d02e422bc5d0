"""Checkpoint files: atomic layout, keep-k, checksums, fallback, and no foreign code."""

from __future__ import annotations

import json
import math
import pickle
import random

import numpy as np
import pytest
import torch

from _train_scripts import tiny
from cloudtrain.runtime import CheckpointError, CheckpointManager, Trainer, young_interval_s
from cloudtrain.runtime.checkpoint import (
    capture_rng,
    load_checkpoint,
    restore_rng,
    sha256_file,
)
from cloudtrain.runtime.sharded import UnsafeMetadataError, load_sharded, save_sharded

CPU = torch.device("cpu")


def _save(manager: CheckpointManager, step: int, value: float = 0.0) -> None:
    state = {"model": {"w": torch.full((3,), value)}, "trainer": {"step": step}}
    manager.save(step, lambda: state, {"rng": capture_rng(CPU), "data": {"epoch": 0}})


def test_layout_latest_pointer_and_keep_last_k(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2)
    for step in (1, 2, 3):
        _save(manager, step, float(step))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["latest", "step_000000002", "step_000000003"]
    assert (tmp_path / "latest").read_text().strip() == "step_000000003"
    manifest = json.loads((tmp_path / "step_000000003" / "manifest.json").read_text())
    assert manifest["step"] == 3
    assert set(manifest["files"]) == {"state.pt", "rank_0.pt"}
    for name, digest in manifest["files"].items():
        assert sha256_file(tmp_path / "step_000000003" / name) == digest
    loaded = manager.load_latest()
    assert loaded.step == 3 and torch.equal(loaded.state["model"]["w"], torch.full((3,), 3.0))


def test_corrupt_newest_falls_back_to_previous_with_a_warning(tmp_path):
    manager = CheckpointManager(tmp_path, keep=3)
    _save(manager, 1, 1.0)
    _save(manager, 2, 2.0)
    state_file = tmp_path / "step_000000002" / "state.pt"
    data = bytearray(state_file.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit's worth of damage
    state_file.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="checksum mismatch"):
        loaded = manager.load_latest()
    assert loaded.step == 1


def test_partial_newest_without_manifest_is_skipped(tmp_path):
    manager = CheckpointManager(tmp_path)
    _save(manager, 1)
    _save(manager, 2)
    (tmp_path / "step_000000002" / "manifest.json").unlink()
    with pytest.warns(UserWarning, match="did not finish"):
        assert manager.load_latest().step == 1


def test_one_directory_loads_publicly_and_a_corrupt_one_is_refused(tmp_path):
    manager = CheckpointManager(tmp_path, keep=3)
    _save(manager, 1, 1.0)
    _save(manager, 2, 2.0)
    older = manager.load_path(tmp_path / "step_000000001")  # not the newest: still loads
    assert older.step == 1 and torch.equal(older.state["model"]["w"], torch.ones(3))
    same = load_checkpoint(tmp_path / "step_000000002")
    assert same.step == 2 and same.world_size == 1 and same.rank_state["data"] == {"epoch": 0}
    (tmp_path / "step_000000001" / "state.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="checksum"):
        load_checkpoint(tmp_path / "step_000000001")
    with pytest.raises(CheckpointError, match="manifest"):
        load_checkpoint(tmp_path / "step_000000009")


def test_leftover_temporary_directory_is_ignored(tmp_path):
    manager = CheckpointManager(tmp_path)
    _save(manager, 1)
    (tmp_path / ".tmp-step_000000002").mkdir()  # a save killed half-way
    assert manager.load_latest().step == 1


class _Payload:
    """Unpickling this runs code: it creates a marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _plant_malicious(tmp_path, manager, marker):
    """Replace the newest state.pt with a pickle carrying code; fix up the checksum so
    only the allow-list stands between the payload and its execution."""
    path = tmp_path / "step_000000002"
    torch.save({"model": _Payload(str(marker))}, path / "state.pt", pickle_module=pickle)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["state.pt"] = sha256_file(path / "state.pt")
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_malicious_pickle_is_refused_and_its_payload_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    manager = CheckpointManager(tmp_path / "ckpt")
    _save(manager, 1)
    _save(manager, 2)
    _plant_malicious(tmp_path / "ckpt", manager, marker)
    with pytest.warns(UserWarning, match="refused to load"):
        loaded = manager.load_latest()
    assert loaded.step == 1
    assert not marker.exists()
    # with nothing to fall back to, loading stops with an error
    for path in (tmp_path / "ckpt").glob("step_000000001"):
        import shutil

        shutil.rmtree(path)
    with pytest.warns(UserWarning), pytest.raises(CheckpointError, match="no loadable"):
        manager.load_latest()
    assert not marker.exists()
    # the trainer refuses too instead of silently starting over
    trainer = Trainer(
        tiny.build_model(),
        tiny.plain_loss,
        tiny.dataset(),
        config=tiny.config(max_steps=2, checkpoint_dir=tmp_path / "ckpt"),
    )
    with pytest.warns(UserWarning), pytest.raises(CheckpointError):
        trainer.fit()
    assert not marker.exists()
    # positive control: the planted payload is live when unpickled without the allow-list
    torch.load(tmp_path / "ckpt" / "step_000000002" / "state.pt", weights_only=False)
    assert marker.exists()


def test_rng_states_round_trip():
    state = capture_rng(CPU)
    expected = (random.random(), float(np.random.rand()), torch.rand(3))
    random.random(), np.random.rand(), torch.rand(5)  # move every generator on
    restore_rng(state, CPU)
    assert (random.random(), float(np.random.rand())) == expected[:2]
    assert torch.equal(torch.rand(3), expected[2])


def test_youngs_interval():
    assert young_interval_s(10.0, 3600.0) == pytest.approx(math.sqrt(2 * 10 * 3600))
    assert young_interval_s(40.0, 3600.0) == pytest.approx(2 * young_interval_s(10.0, 3600.0))


def test_async_save_writes_the_same_checkpoint(tmp_path):
    manager = CheckpointManager(tmp_path)
    tensor = torch.arange(4.0)
    manager.save(1, lambda: {"model": {"w": tensor}}, {"rng": capture_rng(CPU)}, async_write=True)
    tensor.add_(100)  # training goes on: the snapshot must not see this
    manager.wait()
    loaded = manager.load_latest()
    assert torch.equal(loaded.state["model"]["w"], torch.arange(4.0))


def test_trainer_async_and_time_based_checkpoints(tmp_path):
    cfg = tiny.config(
        max_steps=6,
        checkpoint_dir=tmp_path,
        checkpoint_every_steps=2,
        async_checkpoint=True,
        keep_checkpoints=2,
    )
    result = Trainer(tiny.build_model(), tiny.plain_loss, tiny.dataset(), config=cfg).fit()
    assert result.last_checkpoint.endswith("step_000000006")
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000000004", "step_000000006"]


def test_auto_interval_follows_the_measured_save_time():
    from cloudtrain.runtime.trainstate import CheckpointClock

    clock = CheckpointClock("auto", mtbf_s=7200.0, enabled=True)
    assert clock.interval_s == pytest.approx(young_interval_s(1.0, 7200.0))  # before a save
    clock.saved(8.0)
    assert clock.interval_s == pytest.approx(math.sqrt(2 * 8.0 * 7200.0))
    assert not clock.due()
    assert not CheckpointClock(None, 7200.0, enabled=True).enabled
    assert CheckpointClock(60.0, 7200.0, enabled=True).interval_s == 60.0


def _save_sharded(manager: CheckpointManager, step: int, model: torch.nn.Module) -> None:
    """A checkpoint whose model lives in DCP shards (what FSDP runs write)."""
    state = {"model": None, "trainer": {"step": step}}
    manager.save(
        step,
        lambda: state,
        {"rng": capture_rng(CPU), "data": {"epoch": 0}},
        sharded=lambda d: save_sharded({"model": model.state_dict()}, d),
    )


def test_sharded_files_are_in_the_manifest_and_load_in_one_process(tmp_path):
    model = tiny.build_model()
    manager = CheckpointManager(tmp_path)
    _save_sharded(manager, 1, model)
    manifest = json.loads((tmp_path / "step_000000001" / "manifest.json").read_text())
    assert manifest["sharded"] == "sharded"
    assert {"sharded/.metadata", "sharded/__0_0.distcp"} <= set(manifest["files"])
    loaded = manager.load_latest()
    assert loaded.sharded_path == tmp_path / "step_000000001" / "sharded"
    restored = loaded.model_state()
    assert all(torch.equal(restored[k], v) for k, v in model.state_dict().items())
    into = {"model": {k: torch.zeros_like(v) for k, v in model.state_dict().items()}}
    load_sharded(into, loaded.sharded_path)  # the in-place path the Trainer uses
    assert all(torch.equal(into["model"][k], v) for k, v in model.state_dict().items())


def test_a_corrupt_shard_falls_back_to_the_previous_checkpoint(tmp_path):
    manager = CheckpointManager(tmp_path)
    _save_sharded(manager, 1, tiny.build_model())
    _save_sharded(manager, 2, tiny.build_model())
    shard = tmp_path / "step_000000002" / "sharded" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="checksum mismatch"):
        assert manager.load_latest().step == 1


def test_malicious_dcp_metadata_is_refused_and_its_payload_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    manager = CheckpointManager(tmp_path / "ckpt")
    _save_sharded(manager, 1, tiny.build_model())
    _save_sharded(manager, 2, tiny.build_model())
    path = tmp_path / "ckpt" / "step_000000002"
    (path / "sharded" / ".metadata").write_bytes(pickle.dumps(_Payload(str(marker))))
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["sharded/.metadata"] = sha256_file(path / "sharded" / ".metadata")
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UnsafeMetadataError, match="refused"):
        load_checkpoint(path)
    with pytest.warns(UserWarning, match="refused"):
        assert manager.load_latest().step == 1
    assert not marker.exists()
