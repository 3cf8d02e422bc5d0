"""The training command after `--`, written as in a shell, turned into torchrun's
arguments (cloudtrain run, export skypilot, export k8s)."""

from __future__ import annotations

import pytest

from cloudtrain.errors import UserError
from cloudtrain.launch.k8s import K8sSpec, train_job
from cloudtrain.launch.supervisor import RunSpec
from cloudtrain.launch.worker import worker_args


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (("train.py", "--lr", "3e-4"), ["train.py", "--lr", "3e-4"]),
        (("python", "train.py", "--lr", "3e-4"), ["train.py", "--lr", "3e-4"]),
        (("/usr/bin/python3.11", "train.py"), ["train.py"]),
        (("python3", "-m", "pkg.train", "--x"), ["--module", "pkg.train", "--x"]),
        (("-m", "pkg.train"), ["--module", "pkg.train"]),
        (("./train.sh", "a"), ["--no-python", "./train.sh", "a"]),
        (("pythonic.py",), ["pythonic.py"]),
    ],
)
def test_commands_mean_what_they_mean_in_a_shell(command, expected):
    assert worker_args(command) == expected


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (("python",), "write: -- train.py"),
        (("python", "-u", "train.py"), "('-u')"),
        (("python", "-m"), "-m needs a module"),
    ],
)
def test_commands_torchrun_cannot_run_are_refused_before_anything_starts(command, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RunSpec(command=command)


def test_exports_use_the_same_reading():
    job = train_job(K8sSpec(command=("python", "train.py", "--lr", "1e-3"), image="img:1"))
    assert job["spec"]["trainer"]["command"] == ["torchrun", "train.py", "--lr", "1e-3"]
