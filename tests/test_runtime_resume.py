"""Exact resume: a run cut anywhere and resumed computes what the uncut run computed,
bit for bit. Negative controls show the comparison catches a resume that forgets the
RNG or the data position."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _train_scripts import tiny
from cloudtrain.runtime import EXIT_GRACE_EXPIRED, EXIT_PREEMPTED, Callback, Trainer
from cloudtrain.runtime.data import DataPosition

SCRIPT = Path(__file__).parent / "_train_scripts" / "tiny.py"
N_STEPS = 16  # 12 steps per epoch at global batch 8 (96 samples): crosses an epoch


def _run(steps: int, ckpt: Path | None, *, callbacks=(), every=None):
    model = tiny.build_model()
    log = tiny.LossLog()
    cfg = tiny.config(max_steps=steps, checkpoint_dir=ckpt, checkpoint_every_steps=every)
    Trainer(model, tiny.noisy_loss, tiny.dataset(), config=cfg, callbacks=[log, *callbacks]).fit()
    return model, log.losses


@pytest.fixture(scope="module")
def straight():
    """The uncut reference run."""
    return _run(N_STEPS, None)


@pytest.mark.parametrize("cut", [5, 12])  # mid-epoch, and exactly at the epoch boundary
def test_stop_and_resume_is_bit_identical(tmp_path, straight, cut):
    ref_model, ref_losses = straight
    _, first = _run(cut, tmp_path)
    model, second = _run(N_STEPS, tmp_path)
    assert sorted(second) == list(range(cut + 1, N_STEPS + 1))
    assert {**first, **second} == ref_losses
    assert tiny.same_params(model, ref_model)


class _ForgetRng(Callback):
    def on_fit_start(self, trainer):
        torch.manual_seed(999)  # as if the RNG state had not been restored


class _ForgetDataPosition(Callback):
    def on_fit_start(self, trainer):
        trainer.source.restore(DataPosition())  # as if the epoch restarted


@pytest.mark.parametrize("forget", [_ForgetRng, _ForgetDataPosition])
def test_negative_control_catches_a_sloppy_resume(tmp_path, straight, forget):
    ref_model, ref_losses = straight
    _, first = _run(5, tmp_path)
    model, second = _run(N_STEPS, tmp_path, callbacks=[forget()])
    assert {**first, **second} != ref_losses
    assert not tiny.same_params(model, ref_model)


def _augmented_run(steps: int, ckpt: Path | None, workers: int):
    model, log = tiny.build_model(), tiny.LossLog()
    cfg = tiny.config(max_steps=steps, checkpoint_dir=ckpt, num_workers=workers)
    data = tiny.AugmentedDataset()
    Trainer(model, tiny.noisy_loss, data, config=cfg, callbacks=[log]).fit()
    return model, log.losses


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_random_augmentation_resumes_exactly_with_or_without_workers(tmp_path, workers):
    """Main process: the fetch draws from the checkpointed RNGs, restored before the
    first batch is peeked at. Workers: each batch is fetched with the RNGs seeded by
    its place in the run."""
    ref_model, ref_losses = _augmented_run(N_STEPS, None, workers)
    _, first = _augmented_run(5, tmp_path, workers)
    model, second = _augmented_run(N_STEPS, tmp_path, workers)
    assert {**first, **second} == ref_losses
    assert tiny.same_params(model, ref_model)


def _fp16_run(steps: int, ckpt: Path | None):
    """fp16 autocast with a GradScaler (what older GPUs get); at step 3 the loss blows up
    to inf in the backward, so the scaler skips that step and halves its scale."""
    model, log = tiny.build_model(), tiny.LossLog()
    holder: dict[str, Trainer] = {}

    def loss_fn(m, batch):
        loss = tiny.noisy_loss(m, batch)
        return loss * 1e30 if holder["trainer"].step == 3 else loss

    cfg = tiny.config(max_steps=steps, checkpoint_dir=ckpt, precision="fp16")
    trainer = holder["trainer"] = Trainer(
        model, loss_fn, tiny.dataset(), config=cfg, callbacks=[log]
    )
    trainer.fit()
    return model, log.losses, trainer.scaler.get_scale()


def test_fp16_loss_scaling_survives_a_resume(tmp_path):
    ref_model, ref_losses, ref_scale = _fp16_run(N_STEPS, None)
    assert ref_scale == 65536.0 / 2  # the overflow at step 3 halved it
    _, first, _ = _fp16_run(5, tmp_path)
    model, second, scale = _fp16_run(N_STEPS, tmp_path)
    assert {**first, **second} == ref_losses and scale == ref_scale
    assert tiny.same_params(model, ref_model)


def _script(*args: str, check_rc: int | None = 0) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )
    if check_rc is not None:
        assert done.returncode == check_rc, done.stderr
    return done


@pytest.fixture(scope="module")
def straight_subprocess(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    _script(
        "--steps",
        str(N_STEPS),
        "--loss-log",
        str(out / "losses"),
        "--params-out",
        str(out / "params.pt"),
    )
    return tiny.read_losses(out / "losses"), torch.load(out / "params.pt", weights_only=True)


def _assert_matches(tmp_path: Path, reference) -> None:
    ref_losses, ref_params = reference
    assert tiny.read_losses(tmp_path / "losses") == ref_losses
    params = torch.load(tmp_path / "params.pt", weights_only=True)
    assert all(torch.equal(params[k], ref_params[k]) for k in ref_params)


@pytest.mark.slow
def test_sigterm_mid_accumulation_checkpoints_exits_75_and_resumes_exactly(
    tmp_path, straight_subprocess
):
    common = [
        "--ckpt",
        str(tmp_path / "ckpt"),
        "--steps",
        str(N_STEPS),
        "--loss-log",
        str(tmp_path / "losses"),
        "--params-out",
        str(tmp_path / "params.pt"),
    ]
    # SIGTERM while computing micro-batch 1 of 2 of step index 6: the step finishes
    done = _script(*common, "--signal-at", "6:1:SIGTERM", check_rc=EXIT_PREEMPTED)
    assert "SIGTERM received" in done.stderr
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "step_000000007"
    _script(*common)
    _assert_matches(tmp_path, straight_subprocess)


@pytest.mark.slow
def test_sigkill_after_a_checkpoint_resumes_exactly(tmp_path, straight_subprocess):
    common = [
        "--ckpt",
        str(tmp_path / "ckpt"),
        "--steps",
        str(N_STEPS),
        "--every",
        "4",
        "--loss-log",
        str(tmp_path / "losses"),
        "--params-out",
        str(tmp_path / "params.pt"),
    ]
    # killed without warning in the middle of step index 9 (last checkpoint: step 8)
    done = _script(*common, "--signal-at", "9:1:SIGKILL", check_rc=None)
    assert done.returncode == -signal.SIGKILL
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "step_000000008"
    _script(*common)
    _assert_matches(tmp_path, straight_subprocess)


@pytest.mark.slow
def test_second_signal_exits_at_once(tmp_path):
    done = _script(
        "--ckpt",
        str(tmp_path / "ckpt"),
        "--signal-at",
        "3:0:SIGUSR1:2",
        check_rc=128 + signal.SIGUSR1,
    )
    assert "second signal" in done.stderr
    assert not (tmp_path / "ckpt" / "latest").exists()


@pytest.mark.slow
def test_a_step_longer_than_the_grace_period_exits_76(tmp_path):
    done = _script(
        "--ckpt",
        str(tmp_path / "ckpt"),
        "--signal-at",
        "3:0:SIGTERM",
        "--grace",
        "0.5",
        "--sleep-after-signal",
        "3",
        check_rc=EXIT_GRACE_EXPIRED,
    )
    assert "grace period over" in done.stderr


class _SignalAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, trainer, step, loss):
        if step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_in_process_returns_when_asked_not_to_exit(tmp_path):
    cfg = tiny.config(max_steps=50, checkpoint_dir=tmp_path, exit_on_preemption=False)
    result = Trainer(
        tiny.build_model(), tiny.plain_loss, tiny.dataset(), config=cfg, callbacks=[_SignalAt(4)]
    ).fit()
    assert result.stopped_by == "signal" and result.steps == 4
    assert (tmp_path / "latest").read_text().strip() == "step_000000004"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers put back
