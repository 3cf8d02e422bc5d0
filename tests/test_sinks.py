"""Metric sinks: TensorBoard event files and offline W&B runs written by a real tiny
Trainer fit, read back with each package's own reader and compared with the store; a
missing or failing package costs one stderr line and never the run; W&B stays off the
network."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from _train_scripts import tiny
from cloudtrain.errors import DataError, UserError
from cloudtrain.runtime import Callback, Trainer
from cloudtrain.runtime.sinks import (
    STEP_SCALARS,
    MetricSinks,
    WandbSink,
    open_sinks,
    read_offline_wandb_run,
)
from cloudtrain.store import RunStore

TESTS_DIR = Path(__file__).resolve().parent


def _fit(callbacks=(), loss_fn=tiny.plain_loss, **overrides):
    cfg = tiny.config(**{"max_steps": 6, "log_every_steps": 2, "store": True, **overrides})
    trainer = Trainer(
        tiny.build_model(dropout=0.0),
        loss_fn,
        tiny.dataset(),
        config=cfg,
        eval_data=tiny.dataset(),
        callbacks=list(callbacks),
    )
    return trainer, trainer.fit()


def _store_steps(run_id: str):
    with RunStore.open() as store:
        return store.steps(run_id, rank=0)


def _cloudtrain_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("cloudtrain:")]


# ------------------------------------------------------------------ config, fan-out


def test_config_rejects_bad_sink_values_naming_the_field():
    for bad, field in [
        ({"wandb": 3}, "TrainConfig.wandb "),
        ({"wandb": ""}, "TrainConfig.wandb "),
        ({"wandb_project": "team/proj"}, "TrainConfig.wandb_project"),
        ({"wandb_project": "x" * 129}, "TrainConfig.wandb_project"),
        ({"wandb_project": ""}, "TrainConfig.wandb_project"),
        ({"tensorboard_dir": 5}, "TrainConfig.tensorboard_dir"),
    ]:
        with pytest.raises(UserError, match=field) as info:
            tiny.config(**bad)
        assert "\n" not in str(info.value)


def test_wandb_dir_defaults_to_the_checkpoints_then_the_cloudtrain_home(tmp_path, cloudtrain_home):
    assert tiny.config().wandb_dir() is None
    assert tiny.config(wandb=True).wandb_dir() == cloudtrain_home
    assert tiny.config(wandb=True, checkpoint_dir=tmp_path).wandb_dir() == tmp_path
    assert tiny.config(wandb=str(tmp_path / "w"), checkpoint_dir="c").wandb_dir() == tmp_path / "w"
    assert tiny.config(wandb=True).to_dict()["wandb"] is True


class _ListSink:
    """A user-written sink: keeps what it was given."""

    name = "list"

    def __init__(self, fail_at: int | None = None) -> None:
        self.rows: list[tuple[int, dict]] = []
        self.closed_with: str | None = None
        self.fail_at = fail_at

    def scalars(self, step, values) -> None:
        if step == self.fail_at:
            raise OSError("disk full")
        self.rows.append((step, dict(values)))

    def close(self, status="completed") -> None:
        self.closed_with = status


def test_the_fan_out_drops_nones_and_a_sink_that_fails_without_stopping_the_others(capsys):
    good, bad = _ListSink(), _ListSink(fail_at=2)
    sinks = MetricSinks([bad, good])
    sinks.scalars(1, {"train/loss": 0.5, "perf/mfu": None})
    sinks.scalars(2, {"train/loss": 0.25})
    sinks.scalars(3, {"train/loss": 0.125})
    sinks.close("preempted")
    sinks.close("preempted")  # twice is harmless
    assert good.rows == [
        (1, {"train/loss": 0.5}),
        (2, {"train/loss": 0.25}),
        (3, {"train/loss": 0.125}),
    ]
    assert bad.rows == [(1, {"train/loss": 0.5})] and bad.closed_with == "failed"
    assert good.closed_with == "preempted"
    lines = _cloudtrain_lines(capsys.readouterr().err)
    assert lines == ["cloudtrain: list failed at step 2 (OSError: disk full); no more list output"]


def test_ranks_other_than_0_open_no_sink(tmp_path):
    sinks = open_sinks(tensorboard_dir=tmp_path / "tb", wandb_dir=tmp_path / "wb", enabled=False)
    assert len(sinks) == 0
    assert list(tmp_path.iterdir()) == []


def test_missing_packages_cost_one_line_each_and_the_fit_completes(monkeypatch, tmp_path, capsys):
    for name in ("wandb", "tensorboard", "torch.utils.tensorboard"):
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    trainer, result = _fit(tensorboard_dir=tmp_path / "tb", wandb=tmp_path / "wb")
    assert result.steps == 6 and len(trainer.sinks) == 0
    assert sorted(_cloudtrain_lines(capsys.readouterr().err)) == [
        "cloudtrain: tensorboard is not installed (pip install tensorboard); no TensorBoard output",
        "cloudtrain: wandb is not installed (pip install wandb); no W&B output",
    ]
    assert _store_steps(result.run_id)[-1].step == 6  # the store still has every log step


# ---------------------------------------------------------------------- TensorBoard


def test_tensorboard_holds_the_scalars_the_store_recorded(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, result = _fit(tensorboard_dir=tmp_path / "tb")
    steps = _store_steps(result.run_id)
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("train/loss")] == [s.step for s in steps] == [2, 4, 6]
    for field, key in STEP_SCALARS.items():  # every field the store has, under its key
        recorded = [getattr(s, field) for s in steps]
        if recorded[0] is None:  # e.g. MFU and memory on CPU: not written at all
            assert key not in tags
            continue
        got = [e.value for e in events.Scalars(key)]
        assert got == pytest.approx(recorded, rel=1e-6), key  # TensorBoard keeps float32
    assert {"train/loss", "optim/lr", "time/step_s", "batch/micro_batch_size"} <= tags
    assert "perf/mfu" not in tags
    samples_per_sec = [s.metrics["throughput/samples_per_sec"] for s in steps]
    assert [e.value for e in events.Scalars("throughput/samples_per_sec")] == pytest.approx(
        samples_per_sec, rel=1e-6
    )
    [eval_event] = events.Scalars("eval/loss")
    assert eval_event.step == 6 and eval_event.value == pytest.approx(result.eval_loss, rel=1e-6)


# -------------------------------------------------------------------------- W&B


class _ModeDuringFit(Callback):
    def __init__(self) -> None:
        self.modes: set[str] = set()

    def on_step_end(self, trainer, step, loss) -> None:
        import wandb

        self.modes.add(wandb.setup().settings.mode)


@pytest.mark.timeout(60)
def test_an_offline_wandb_run_holds_the_steps_losses_and_config_of_the_store(tmp_path):
    wandb = pytest.importorskip("wandb")
    mode_before = wandb.setup().settings.mode
    during = _ModeDuringFit()
    _, result = _fit(wandb=tmp_path, callbacks=[during])
    assert during.modes == {"offline"}  # the process-wide mode, not only the run's
    assert wandb.setup().settings.mode == mode_before  # and put back after
    [run_dir] = (tmp_path / "wandb").glob("offline-run-*")
    run = read_offline_wandb_run(run_dir)
    assert run.project == "cloudtrain" and run.name == result.run_id
    assert run.config["cloudtrain_run_id"] == result.run_id
    assert run.config["resolved_precision"] == "fp32" and run.config["global_batch_size"] == 8

    steps = _store_steps(result.run_id)
    assert sorted(run.history) == [s.step for s in steps] == [2, 4, 6]
    for s in steps:
        row = run.history[s.step]
        for field, key in STEP_SCALARS.items():  # exact: W&B keeps the float64
            assert row.get(key) == getattr(s, field), key  # None: absent from the row
        assert row["throughput/samples_per_sec"] == s.metrics["throughput/samples_per_sec"]
    assert run.history[2]["train/loss"] != run.history[6]["train/loss"]  # the loss moved
    assert run.history[6]["eval/loss"] == result.eval_loss
    assert run.summary["train/loss"] == steps[-1].loss and run.summary["_step"] == 6
    assert run.exit_code == 0


@pytest.mark.timeout(60)
def test_a_failed_fit_finishes_its_wandb_run_as_failed(tmp_path):
    pytest.importorskip("wandb")

    def loss_fn(model, batch):
        if trainer_box and trainer_box[0].step == 3:
            raise RuntimeError("bad batch")
        return tiny.plain_loss(model, batch)

    trainer_box: list[Trainer] = []

    class _Grab(Callback):
        def on_fit_start(self, trainer) -> None:
            trainer_box.append(trainer)

    with pytest.raises(RuntimeError, match="bad batch"):
        _fit(wandb=tmp_path, loss_fn=loss_fn, callbacks=[_Grab()], log_every_steps=1)
    [run_dir] = (tmp_path / "wandb").glob("offline-run-*")
    run = read_offline_wandb_run(run_dir)
    assert sorted(run.history) == [1, 2, 3] and run.exit_code == 1  # 3: the last step done


@pytest.mark.timeout(60)
def test_sinks_that_fail_to_start_cost_one_line_each_and_never_the_fit(tmp_path, capsys):
    wandb = pytest.importorskip("wandb")
    mode_before = wandb.setup().settings.mode
    sink = WandbSink(tmp_path, project="team/proj")  # wandb itself refuses the name
    assert not sink.active and sink.run_dir is None
    [line] = _cloudtrain_lines(capsys.readouterr().err)
    assert line.startswith(f"cloudtrain: W&B could not start in {tmp_path} (UsageError: ")
    assert wandb.setup().settings.mode == mode_before

    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    trainer, result = _fit(wandb=not_a_dir, tensorboard_dir=not_a_dir)
    assert result.steps == 6 and len(trainer.sinks) == 0
    tensorboard_line, wandb_line = _cloudtrain_lines(capsys.readouterr().err)
    assert tensorboard_line.startswith(f"cloudtrain: TensorBoard could not start in {not_a_dir} (")
    assert wandb_line.startswith(f"cloudtrain: W&B could not start in {not_a_dir} (")


_OFFLINE_FIT = """
import sys
sys.path.insert(0, sys.argv[1])
from _train_scripts import tiny
from cloudtrain.runtime import Trainer
cfg = tiny.config(max_steps=4, log_every_steps=2, store=True, wandb=sys.argv[2])
trainer = Trainer(tiny.build_model(dropout=0.0), tiny.plain_loss, tiny.dataset(), config=cfg)
print(trainer.fit().steps)
"""


class _Tripwire:
    """A local TCP server that counts connections: every URL and proxy W&B could use
    points here, so any attempt to reach a server, direct or through a proxy, lands."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
        for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
            env[key] = self.url
        env.update(NO_PROXY="", no_proxy="", WANDB_BASE_URL=self.url)
        return env


@pytest.mark.timeout(60)
def test_a_fit_with_wandb_makes_no_network_connection(tmp_path):
    pytest.importorskip("wandb")
    tripwire = _Tripwire()
    done = subprocess.run(
        [sys.executable, "-c", _OFFLINE_FIT, str(TESTS_DIR), str(tmp_path)],
        env=tripwire.env(),
        capture_output=True,
        text=True,
        timeout=50,
    )
    tripwire.server.close()
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["4"] and _cloudtrain_lines(done.stderr) == []
    assert tripwire.connections == 0
    [run_dir] = (tmp_path / "wandb").glob("offline-run-*")
    assert sorted(read_offline_wandb_run(run_dir).history) == [2, 4]


@pytest.mark.timeout(60)
def test_the_reader_tells_an_unfinished_run_and_refuses_other_folders(tmp_path):
    pytest.importorskip("wandb")
    sink = WandbSink(tmp_path, name="open")
    sink.scalars(1, {"train/loss": 1.0})
    assert sink.run_dir.parent == tmp_path / "wandb"
    try:
        assert read_offline_wandb_run(sink.run_dir).exit_code is None
    finally:
        sink.close()
    run = read_offline_wandb_run(sink.run_dir)
    assert run.name == "open" and run.history[1]["train/loss"] == 1.0 and run.exit_code == 0
    with pytest.raises(DataError, match="not an offline W&B run folder"):
        read_offline_wandb_run(tmp_path)
