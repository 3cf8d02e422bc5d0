"""How `cloudtrain run` ends on a stop it asked for: a budget stop (exit 3) and SIGTERM
(exit 75) end without torchrun's SignalException traceback and with one line that
says what happened and how to resume; the script's own output still streams live, and
a script that crashes still shows its traceback. Real torchrun processes on CPU."""

from __future__ import annotations

import json
import os
import select
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.launch.supervisor import (
    EXIT_BUDGET,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    TORCHRUN_MODULE,
    RunOutcome,
    RunSpec,
    format_duration,
    resume_command,
    summary_line,
    torchrun_command,
)

SCRIPT = Path(__file__).parent / "_launch_scripts" / "wait_for_stop.py"
NOISE = ("Traceback", "SignalException")


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "CLOUDTRAIN_HOME": str(home), "PYTHONUNBUFFERED": "1"}


def _cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cloudtrain.cli", *args],
        capture_output=True, text=True, env=_env(home), timeout=120,
    )  # fmt: skip


def _resume(line: str, home: Path) -> subprocess.CompletedProcess[str]:
    """Run the `resume with:` command of a summary line, as a user would paste it."""
    words = shlex.split(line.split("resume with: ", 1)[1])
    assert words[:2] == ["cloudtrain", "run"]
    return _cli(*words[1:], home=home)


def _last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


def _read_line_within(proc: subprocess.Popen[str], timeout_s: float) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"no output from the script within {timeout_s} s"
    return proc.stdout.readline()  # type: ignore[union-attr]


# ---------------------------------------------------------------- pure parts


def test_torchrun_runs_through_the_quiet_wrapper():
    cmd = torchrun_command(RunSpec(command=("t.py",)), "key")
    assert cmd[:3] == [sys.executable, "-m", TORCHRUN_MODULE]


def test_resume_command_repeats_the_run_with_an_absolute_checkpoint_dir(tmp_path):
    spec = RunSpec(command=("train.py", "--lr", "3e-4", "a b"), nproc="auto",
                   price_usd_per_hour=2.5, budget_usd=40, grace_s=20,
                   checkpoint_dir=str(tmp_path / "ck"), name="gpt", mtbf_s=7200.0)  # fmt: skip
    words = shlex.split(resume_command(spec))
    assert words == [
        "cloudtrain", "run", "--nproc", "auto", "--price", "2.5", "--budget", "40",
        "--grace-s", "20", "--checkpoint-dir", str(tmp_path / "ck"), "--name", "gpt",
        "--mtbf-hours", "2", "--", "train.py", "--lr", "3e-4", "a b",
    ]  # fmt: skip
    plain = shlex.split(resume_command(RunSpec(command=("t.py",), checkpoint_dir="ck")))
    assert plain == ["cloudtrain", "run", "--checkpoint-dir", str(Path("ck").resolve()), "--",
                     "t.py"]  # fmt: skip


def test_summary_line_says_what_stopped_the_run():
    stopped = RunOutcome("r1", "stopped", EXIT_BUDGET, (), 8.5, "/ck", duration_s=4000,
                         stopped_by="budget", resume_command="cloudtrain run -- t.py")  # fmt: skip
    assert summary_line(stopped, budget_usd=9) == (
        "stopped by the budget after 1 h 06 min (run r1, 0 attempts, spend 8.50 of 9 USD); "
        "checkpoints in /ck; resume with: cloudtrain run -- t.py"
    )
    done = RunOutcome("r2", "completed", 0, (), None, "/ck", duration_s=3.25)
    assert summary_line(done) == "completed after 3.2 s (run r2, 0 attempts); " + (
        "CLOUDTRAIN_CHECKPOINT_DIR was /ck"
    )
    assert format_duration(725) == "12 min 5 s"


# ---------------------------------------------------------------- real stops


@pytest.mark.slow
def test_sigterm_stop_is_quiet_streams_output_and_resumes(tmp_path, cloudtrain_home):
    ckpt = tmp_path / "ckpt"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cloudtrain.cli", "run", "--grace-s", "5", "--checkpoint-dir",
         str(ckpt), "--", str(SCRIPT)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(cloudtrain_home),
    )  # fmt: skip
    try:
        # The script's stdout arrives while it runs, not when the run ends.
        assert _read_line_within(proc, 60) == "worker started\n"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_INTERRUPTED, stderr[-3000:]
    assert "checkpointed after SIGTERM" in stderr  # the script's stderr is untouched
    assert not [word for word in NOISE if word in stderr], stderr[-3000:]
    last = _last_line(stderr)
    assert last.startswith("cloudtrain run: stopped by SIGTERM after ")
    assert f"checkpoints in {ckpt}; resume with: cloudtrain run " in last
    resumed = _resume(last, cloudtrain_home)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout == f"resumed from {ckpt / 'checkpoint'}\n"


@pytest.mark.slow
def test_budget_stop_is_quiet_and_says_how_to_resume(tmp_path, cloudtrain_home):
    # 1 USD per second; the stop must land after the worker started (its SIGTERM handler
    # writes the checkpoint): on a slow, loaded machine try again with more budget.
    for budget in (4, 8, 16):
        ckpt = tmp_path / f"ckpt{budget}"
        done = _cli("run", "--price", "3600", "--budget", str(budget), "--grace-s", "1",
                    "--checkpoint-dir", str(ckpt), "--json", "--", str(SCRIPT),
                    home=cloudtrain_home)  # fmt: skip
        assert done.returncode == EXIT_BUDGET, done.stderr[-3000:]
        assert not [word for word in NOISE if word in done.stderr], done.stderr[-3000:]
        if (ckpt / "checkpoint").exists():
            break
    else:
        pytest.fail("the worker never started within a 16 USD (16 s) budget")
    assert done.stdout.startswith("worker started\n")  # then the JSON outcome
    outcome = json.loads(done.stdout.removeprefix("worker started\n"))
    assert outcome["stopped_by"] == "budget" and outcome["spend_usd"] <= budget
    last = _last_line(done.stderr)
    assert last.startswith("cloudtrain run: stopped by the budget after ")
    assert f"of {budget} USD); checkpoints in {ckpt}; resume with: " in last
    assert outcome["resume_command"] == last.split("resume with: ", 1)[1]


def test_a_crashing_script_still_shows_its_traceback(tmp_path, cloudtrain_home):
    """Written as in a shell (`python script.py`); the script's traceback and torchrun's
    report of the failed rank stay, the agent's own traceback goes."""
    done = _cli("run", "--max-restarts", "0", "--checkpoint-dir", str(tmp_path / "ck"), "--",
                "python", str(SCRIPT), "--crash", home=cloudtrain_home)  # fmt: skip
    assert done.returncode == EXIT_FAILED
    assert done.stderr.count("Traceback") == 1
    assert "RuntimeError: the training script failed on purpose" in done.stderr
    assert "Root Cause (first observed failure)" in done.stderr
    assert "SignalException" not in done.stderr and "ChildFailedError" not in done.stderr
    assert _last_line(done.stderr).startswith("cloudtrain run: failed after ")
