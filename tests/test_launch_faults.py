"""Fault injection for `cloudtrain run` (CPU, real processes): SIGKILL at random steps,
SIGTERM inside the grace period, and a budget stop, each ending in parameters
bit-identical to an uninterrupted run."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cloudtrain.launch.supervisor import EXIT_BUDGET, EXIT_FAILED, EXIT_INTERRUPTED
from cloudtrain.store import RunStore

SCRIPT = Path(__file__).parent / "_launch_scripts" / "trainer_train.py"


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "CLOUDTRAIN_HOME": str(home), "PYTHONUNBUFFERED": "1"}


def _cli(*args: str, home: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cloudtrain.cli", *args],
        capture_output=True, text=True, env=_env(home), timeout=timeout,
    )  # fmt: skip


def _baseline(tmp_path: Path, steps: int) -> torch.Tensor:
    """Parameters after `steps` uninterrupted steps, run directly without the supervisor."""
    out = tmp_path / f"baseline-{steps}.pt"
    env = {**os.environ, "CLOUDTRAIN_CHECKPOINT_DIR": str(tmp_path / f"baseline-{steps}")}
    subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", str(steps), "--out", str(out)],
        check=True, env=env, capture_output=True, timeout=120,
    )  # fmt: skip
    return torch.load(out)


def _latest_step(ckpt: Path) -> int:
    return int((ckpt / "latest").read_text().strip().removeprefix("step_"))


def _store(home: Path) -> RunStore:
    return RunStore.open(home / "store.db")


@pytest.mark.slow
def test_sigkill_at_random_steps_still_gives_identical_parameters(tmp_path, cloudtrain_home):
    steps = 24
    kills = sorted(random.Random(1234).sample(range(1, steps), 4))
    out, ckpt = tmp_path / "final.pt", tmp_path / "ckpt"
    done = _cli(
        "run", "--max-restarts", "6", "--backoff-s", "0", "--checkpoint-dir", str(ckpt),
        "--json", "--", str(SCRIPT), "--steps", str(steps), "--out", str(out),
        "--kill-at", ",".join(map(str, kills)), home=cloudtrain_home,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout)
    assert [a["reason"] for a in outcome["attempts"]] == ["crash"] * 4 + ["completed"]
    assert torch.equal(torch.load(out), _baseline(tmp_path, steps))
    with _store(cloudtrain_home) as store:
        run = store.get_run(outcome["run_id"])
        assert run.status == "completed" and run.summary["attempts"] == 5
        assert len(store.attempts(run.id)) == 5
        assert len(store.events(run.id, kind="restart")) == 4


def _wait_for_progress(ckpt: Path, step: int, proc: subprocess.Popen, timeout_s: float = 60):
    progress = ckpt / "progress"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if progress.exists() and progress.read_text() and int(progress.read_text()) >= step:
            return
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    raise AssertionError(f"training did not reach step {step} in {timeout_s} s")


@pytest.mark.slow
def test_sigterm_checkpoints_inside_the_grace_period_and_resumes_exactly(tmp_path, cloudtrain_home):
    ckpt, grace_s = tmp_path / "ckpt", 10.0
    proc = subprocess.Popen(
        [sys.executable, "-m", "cloudtrain.cli", "run", "--grace-s", str(grace_s),
         "--checkpoint-dir", str(ckpt), "--json", "--", str(SCRIPT), "--steps", "1000",
         "--every", "1000", "--step-sleep", "0.05", "--out", str(tmp_path / "unused.pt")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(cloudtrain_home),
    )  # fmt: skip
    _wait_for_progress(ckpt, 5, proc)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    took_s = time.monotonic() - sent
    assert proc.returncode == EXIT_INTERRUPTED, stderr[-3000:]
    assert took_s < grace_s
    assert "Traceback" not in stderr and "SignalException" not in stderr, stderr[-3000:]
    assert "cloudtrain run: stopped by SIGTERM after " in stderr
    stopped_at = _latest_step(ckpt)  # no periodic checkpoints: this one came from SIGTERM
    assert 5 <= stopped_at < 1000
    outcome = json.loads(stdout)
    with _store(cloudtrain_home) as store:
        assert store.get_run(outcome["run_id"]).status == "preempted"
        reasons = [a.reason for a in store.attempts(outcome["run_id"])]
        assert reasons == ["preempted"], stderr[-3000:]
        assert store.events(outcome["run_id"], kind="preemption")
    # Run again: it resumes from that checkpoint and ends where a straight run ends.
    steps, out = stopped_at + 4, tmp_path / "final.pt"
    done = _cli("run", "--checkpoint-dir", str(ckpt), "--", str(SCRIPT), "--steps", str(steps),
                "--out", str(out), home=cloudtrain_home)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resumed from {ckpt}" in done.stderr
    assert torch.equal(torch.load(out), _baseline(tmp_path, steps))


def _run_into_budget(tmp_path: Path, home: Path) -> tuple[Path, float, dict]:
    """Run until the budget stops it. A stop that lands before training started (a slow,
    loaded machine) leaves nothing to test; then try again with twice the budget."""
    for attempt, budget in enumerate((9.0, 18.0, 36.0)):
        ckpt = tmp_path / f"ckpt{attempt}"
        done = _cli(
            "run", "--price", "3600", "--budget", str(budget), "--grace-s", "2",
            "--checkpoint-dir", str(ckpt), "--json", "--", str(SCRIPT), "--steps", "100000",
            "--every", "100000", "--step-sleep", "0.05", "--out", str(tmp_path / "unused.pt"),
            home=home,
        )  # fmt: skip
        assert done.returncode == EXIT_BUDGET, done.stderr[-3000:]
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
        if (ckpt / "progress").exists():
            return ckpt, budget, json.loads(done.stdout)
    pytest.fail("training never started within a 36 USD (36 s) budget")


@pytest.mark.slow
def test_budget_stop_leaves_a_resumable_checkpoint(tmp_path, cloudtrain_home):
    ckpt, budget, outcome = _run_into_budget(tmp_path, cloudtrain_home)
    assert outcome["status"] == "stopped"
    assert outcome["spend_usd"] <= budget  # 1 USD per second of wall time
    stopped_at = _latest_step(ckpt)
    with _store(cloudtrain_home) as store:
        assert store.events(outcome["run_id"], kind="budget")
        (attempt,) = store.attempts(outcome["run_id"])
        assert attempt.reason == "budget" and attempt.spend_usd == pytest.approx(
            outcome["spend_usd"]
        )
    steps, out = stopped_at + 3, tmp_path / "final.pt"
    resumed = _cli("run", "--checkpoint-dir", str(ckpt), "--", str(SCRIPT), "--steps",
                   str(steps), "--out", str(out), home=cloudtrain_home)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert torch.equal(torch.load(out), _baseline(tmp_path, steps))


def test_a_script_that_always_fails_is_restarted_then_given_up(tmp_path, cloudtrain_home):
    script = tmp_path / "fail.py"
    script.write_text("import sys\nsys.exit(3)\n")
    done = _cli("run", "--max-restarts", "2", "--backoff-s", "0.05", "--json", "--", str(script),
                home=cloudtrain_home)  # fmt: skip
    assert done.returncode == EXIT_FAILED
    outcome = json.loads(done.stdout)
    assert [a["reason"] for a in outcome["attempts"]] == ["crash"] * 3
    assert "restart in 0.05 s" in done.stderr and "restart in 0.1 s" in done.stderr
    with _store(cloudtrain_home) as store:
        assert store.get_run(outcome["run_id"]).status == "failed"
