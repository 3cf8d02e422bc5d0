"""The training command as torchrun takes it, from the command as a user writes it
after `--` (`cloudtrain run`, `export skypilot`, `export k8s`)."""

from __future__ import annotations

import re
from pathlib import Path

from cloudtrain.errors import UserError

_PYTHON_NAME = re.compile(r"python(\d+(\.\d+)*)?(\.exe)?")


def worker_args(command: tuple[str, ...]) -> list[str]:
    """torchrun's arguments from the training script on, for `command` as a user writes
    it: `train.py ARGS` (run with this Python), `python train.py ARGS` and
    `python -m pkg.mod ARGS` (torchrun --module) mean the same as they do in a shell;
    any other program runs as it is (torchrun --no-python)."""
    first, rest = command[0], list(command[1:])
    if first == "-m":
        return ["--module", *_module_args(rest)]
    if not _PYTHON_NAME.fullmatch(Path(first).name):
        return list(command) if first.endswith(".py") else ["--no-python", *command]
    if rest[:1] == ["-m"]:
        return ["--module", *_module_args(rest[1:])]
    if not rest or rest[0].startswith("-"):
        given = f" ('{rest[0]}')" if rest else ""
        raise UserError(
            f"torchrun starts the training script with its own Python and passes no options "
            f"to it{given}; write: -- train.py ARGS (or -- -m package.module ARGS)"
        )
    return rest


def _module_args(rest: list[str]) -> list[str]:
    if not rest:
        raise UserError("-m needs a module: -- python -m package.module ARGS")
    return rest
