"""What a Trainer run leaves in the store for `cloudtrain diagnose`: monitor samples,
the config as resolved (not "auto"), and the last step even off the log grid."""

from __future__ import annotations

import time

import pytest

from _train_scripts import tiny
from cloudtrain.diagnose import diagnose_run
from cloudtrain.diagnose.rules import fp32_precision, tf32_off
from cloudtrain.diagnose.run import load_run_data
from cloudtrain.errors import UserError
from cloudtrain.monitor import STACK_DUMP_ENV
from cloudtrain.runtime import Callback, TrainConfig, Trainer
from cloudtrain.runtime.telemetry import RUN_ID_ENV
from cloudtrain.store import RunStore


def _fit(**overrides):
    cfg = tiny.config(**{"store": True, **overrides})
    trainer = Trainer(tiny.build_model(dropout=0.0), tiny.plain_loss, tiny.dataset(), config=cfg)
    return trainer, trainer.fit()


class _UntilSampled(Callback):
    """Holds the last step until the sampler has taken `count` readings (a busy machine
    can finish a tiny fit before the sampler thread runs twice)."""

    def __init__(self, last_step: int, count: int = 3) -> None:
        self.last_step, self.count = last_step, count

    def on_step_end(self, trainer, step, loss) -> None:
        deadline = time.monotonic() + 30.0
        while step == self.last_step and trainer.sampler.sample_count < self.count:
            assert time.monotonic() < deadline, "the sampler stopped sampling"
            time.sleep(0.01)


def test_a_fit_samples_the_host_into_its_run_and_diagnose_accounts_cpu_energy():
    cfg = tiny.config(max_steps=30, store=True, monitor_interval_s=0.05)
    trainer = Trainer(tiny.build_model(), tiny.plain_loss, tiny.dataset(), config=cfg,
                      callbacks=[_UntilSampled(30)])  # fmt: skip
    result = trainer.fit()
    assert trainer.sampler is None  # stopped at the end
    with RunStore.open() as store:
        samples = store.samples(result.run_id)
        assert len(samples) >= 2
        assert all(s.run_id == result.run_id for s in samples)
        assert all("host/cpu_pct" in s.metrics for s in samples)
        assert any(s.metrics.get("host/cpu_energy_j") for s in samples)
        diagnosis = diagnose_run(store, result.run_id)
    assert diagnosis.energy.cpu_kwh is not None and diagnosis.energy.cpu_kwh > 0
    assert diagnosis.energy.cpu_estimated in (True, False)
    assert diagnosis.run.summary["energy"]["cpu_kwh"] == diagnosis.energy.cpu_kwh


def test_monitor_off_or_store_off_samples_nothing():
    _, result = _fit(max_steps=3, monitor=False, monitor_interval_s=0.05)
    with RunStore.open() as store:
        assert store.samples(result.run_id) == []
    trainer, result = _fit(max_steps=3, store=False, monitor_interval_s=0.05)
    assert result.run_id is None and trainer.sampler is None


def test_a_run_that_cloudtrain_watch_samples_is_not_sampled_twice(monkeypatch, tmp_path):
    with RunStore.open() as store:
        run_id = store.create_run("watched", kind="train")
    monkeypatch.setenv(RUN_ID_ENV, run_id)
    monkeypatch.setenv(STACK_DUMP_ENV, str(tmp_path / "stacks.txt"))
    trainer, result = _fit(max_steps=3, monitor_interval_s=0.05)
    assert result.run_id == run_id and trainer.sampler is None
    with RunStore.open() as store:
        assert store.samples(run_id) == []
        assert store.get_run(run_id).config["resolved_precision"] == "fp32"  # merged in
    assert "cloudtrain stack dumps" in (tmp_path / "stacks.txt").read_text()  # registered


def test_the_sampler_stops_when_the_fit_fails():
    def broken(model, batch):
        if trainer.step == 2:
            raise RuntimeError("boom")
        return tiny.plain_loss(model, batch)

    cfg = tiny.config(max_steps=5, store=True, monitor_interval_s=0.05)
    trainer = Trainer(tiny.build_model(), broken, tiny.dataset(), config=cfg,
                      callbacks=[_UntilSampled(1, count=1)])  # fmt: skip
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit()
    assert trainer.sampler is None
    with RunStore.open() as store:
        assert store.get_run(trainer.recorder.run_id).status == "failed"
        assert store.samples(trainer.recorder.run_id)


def test_monitor_interval_must_be_positive():
    with pytest.raises(UserError, match="monitor_interval_s"):
        TrainConfig(max_steps=1, monitor_interval_s=0)


def test_the_stored_config_is_what_was_resolved():
    _, result = _fit(max_steps=2, micro_batch_size="auto")
    with RunStore.open() as store:
        config = store.get_run(result.run_id).config
    assert config["precision"] == config["resolved_precision"] == "fp32"
    assert config["tf32"] is False and config["compile"] is False
    assert config["channels_last"] is False and config["micro_batch_size"] == 8
    assert config["parallelism"] == "none" and config["world_size"] == 1
    assert config["device"] == "cpu" and config["device_name"]
    assert config["gpu_name"] is None and config["num_workers"] == 0
    assert config["requested"]["precision"] == "auto"
    assert config["requested"]["micro_batch_size"] == "auto"
    assert "auto" not in {config[k] for k in ("precision", "compile", "channels_last")}


def test_a_run_records_what_a_later_plan_learns_from():
    """The stored fingerprint is the one `profile_model` gives the same model and batch,
    so `cloudtrain plan --model` finds the run (plan/learned.py)."""
    from cloudtrain.plan.learned import measured_run
    from cloudtrain.profiling import profile_model

    _, result = _fit(max_steps=6, log_every_steps=1)
    with RunStore.open() as store:
        run = store.get_run(result.run_id)
        steps = store.steps(run.id)
    config = run.config
    x, y = tiny.dataset()[:8]
    traced = profile_model(tiny.build_model(dropout=0.0), (x, y), tiny.plain_loss,
                           precision=config["planner_precision"])  # fmt: skip
    assert config["model_fingerprint"] == traced.fingerprint
    assert config["planner_precision"] == "fp32"
    assert config["optimizer_name"] == "adamw" and config["optimizer_impl"] == "foreach"
    store_gpu = type(run)(**{**run.__dict__, "gpu_name": "H100-SXM"})  # as if on a GPU
    measured = measured_run(store_gpu, steps)
    assert measured is not None and measured.fingerprint == traced.fingerprint
    assert measured.micro_batch == config["micro_batch_size"] and measured.step_s > 0


def _on_gpu(store: RunStore, run_id: str, device_name: str):
    """The recorded run as if it had run on `device_name` (the config stays as recorded)."""
    store.update_run(run_id, gpu_name=device_name)
    return load_run_data(store, run_id)


def test_diagnose_flags_fp32_on_a_bf16_gpu_from_the_recorded_config():
    _, fp32 = _fit(max_steps=2)
    _, bf16 = _fit(max_steps=2, precision="bf16")
    with RunStore.open() as store:
        data = _on_gpu(store, fp32.run_id, "NVIDIA H100 80GB HBM3")
        assert data.precision() == "fp32" and data.tf32_enabled() is False
        assert fp32_precision(data) is not None
        assert tf32_off(data) is not None  # resolved tf32 is off on CPU, asked for True
        data = _on_gpu(store, bf16.run_id, "NVIDIA H100 80GB HBM3")
        assert data.precision() == "half" and fp32_precision(data) is None


def test_the_last_step_is_stored_off_the_log_grid():
    _, result = _fit(max_steps=23, log_every_steps=10)
    with RunStore.open() as store:
        steps = store.steps(result.run_id)
        run = store.get_run(result.run_id)
    assert [s.step for s in steps] == [10, 20, 23]
    assert steps[-1].loss is not None and steps[-1].step_s > 0  # mean of steps 21-23
    assert run.summary["steps"] == 23


def test_a_step_on_the_grid_is_stored_once():
    _, result = _fit(max_steps=20, log_every_steps=10)
    with RunStore.open() as store:
        assert [s.step for s in store.steps(result.run_id)] == [10, 20]
