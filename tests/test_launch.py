"""`cloudtrain run`: torchrun under a supervisor that restarts, resumes, stops on budget
and turns SIGTERM into a checkpoint. The fault-injection tests run real processes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from cloudtrain.errors import UserError
from cloudtrain.launch.supervisor import (
    TEARDOWN_S,
    TORCHRUN_MODULE,
    RunSpec,
    Supervisor,
    resolve_nproc,
    run_key,
    torchrun_command,
)

SCRIPT = Path(__file__).parent / "_launch_scripts" / "trainer_train.py"


# ---------------------------------------------------------------- pure parts


def test_torchrun_command_single_node():
    cmd = torchrun_command(RunSpec(command=("t.py", "--x", "1"), nproc=2, grace_s=12), "key")
    assert cmd[:3] == [sys.executable, "-m", TORCHRUN_MODULE]  # torchrun, quiet on a stop
    assert "--nproc-per-node=2" in cmd and "--standalone" in cmd and "--max-restarts=0" in cmd
    assert "--shutdown-timeout=12" in cmd
    assert cmd[-3:] == ["t.py", "--x", "1"]


def test_nproc_auto_is_one_per_gpu():
    expected = max(1, torch.cuda.device_count())
    assert resolve_nproc("auto") == expected
    assert f"--nproc-per-node={expected}" in torchrun_command(RunSpec(("t.py",), "auto"), "k")


def test_torchrun_command_elastic_multi_node():
    spec = RunSpec(command=("t.py",), nnodes="1:4", rdzv_endpoint="head:29400", max_restarts=5)
    cmd = torchrun_command(spec, run_key(spec))
    assert "--nnodes=1:4" in cmd and "--rdzv-endpoint=head:29400" in cmd
    assert "--rdzv-backend=c10d" in cmd and "--max-restarts=5" in cmd
    assert f"--rdzv-id={run_key(spec)}" in cmd and "--standalone" not in cmd
    # every node derives the same rendezvous id from the same command
    assert run_key(spec) == run_key(RunSpec(command=("t.py",)))


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"command": ()}, "no training command"),
        ({"nproc": 0}, "--nproc"),
        ({"nnodes": "2"}, "--rdzv"),
        ({"budget_usd": 5.0}, "--price"),
        ({"grace_s": 0}, "--grace-s"),
    ],
)
def test_run_spec_validation(changes, words):
    with pytest.raises(UserError, match=words):
        RunSpec(**{"command": ("t.py",), **changes})


class _NullRecorder:
    run_id = "test"


def test_budget_projection_and_backoff():
    spec = RunSpec(command=("t.py",), budget_usd=10, price_usd_per_hour=3600, grace_s=2,
                   poll_s=0.5, backoff_s=1, backoff_max_s=5)  # fmt: skip
    sup = Supervisor(spec, _NullRecorder(), say=lambda line: None)  # type: ignore[arg-type]
    # elapsed + poll 0.5 + grace 2 + torchrun's teardown by the time it has stopped
    assert not sup._over_budget(7.4 - TEARDOWN_S)  # 9.9 USD
    assert sup._over_budget(7.6 - TEARDOWN_S)
    sup.spent_usd = 8.0  # earlier attempts count too
    assert sup._over_budget(0.0)
    assert [sup._backoff_s(n) for n in range(1, 6)] == [1, 2, 4, 5, 5]


def test_cli_run_usage_errors(run_cli):
    done = run_cli("run", "--budget", "5", "--", "train.py")
    assert done.code == 2 and "--price" in done.stderr
