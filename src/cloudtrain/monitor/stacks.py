"""Python stack dumps of a (hung) training process, on demand, through faulthandler.

The training process calls `enable_stack_dumps(path)` once (the Trainer and launcher do;
any script can, or call `enable_stack_dumps_from_env()` to follow $CLOUDTRAIN_STACK_DUMP,
which `cloudtrain watch -- COMMAND` sets). Then `request_stack_dump(path)` sends the
signal to every process registered in that file and returns what they wrote: every
thread's stack, written by the interpreter itself, so it works even when the process is
stuck inside a CUDA or NCCL call that holds the GIL.

A process that never registered is never signalled: SIGUSR2's default action would kill it.
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import time
from pathlib import Path
from typing import TextIO

STACK_DUMP_ENV = "CLOUDTRAIN_STACK_DUMP"
DEFAULT_SIGNAL = signal.SIGUSR2
_HEADER = re.compile(r"^# cloudtrain stack dumps: pid=(\d+) signal=(\d+)$", re.MULTILINE)
_open_files: dict[str, TextIO] = {}


def enable_stack_dumps(path: str | Path, signum: int = DEFAULT_SIGNAL) -> Path:
    """Make this process write all threads' stacks to `path` (appending) on `signum`.
    Several processes (ranks, workers) may share one file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    previous = _open_files.pop(str(path), None)
    if previous is not None:
        previous.close()
    handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - must stay open for faulthandler
    handle.write(f"# cloudtrain stack dumps: pid={os.getpid()} signal={int(signum)}\n")
    handle.flush()
    faulthandler.register(signum, file=handle, all_threads=True, chain=False)
    _open_files[str(path)] = handle
    return path


def enable_stack_dumps_from_env() -> Path | None:
    """`enable_stack_dumps($CLOUDTRAIN_STACK_DUMP)` when that variable is set; else None."""
    target = os.environ.get(STACK_DUMP_ENV)
    return enable_stack_dumps(target) if target else None


def registered_pids(path: str | Path) -> dict[int, int]:
    """pid -> signal of the live processes that registered for dumps in `path`."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    found: dict[int, int] = {}
    for match in _HEADER.finditer(text):
        pid, signum = int(match.group(1)), int(match.group(2))
        if _alive(pid):
            found[pid] = signum
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_for_growth(path: Path, start_bytes: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    size = start_bytes
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = path.stat().st_size if path.exists() else 0
        if now > start_bytes and now == size:  # grew, and stopped growing
            return
        size = now


def request_stack_dump(path: str | Path, timeout_s: float = 5.0) -> str | None:
    """Signal every registered process and return the stacks they wrote; None when no
    live process registered in `path`."""
    path = Path(path)
    pids = registered_pids(path)
    if not pids:
        return None
    start = path.stat().st_size
    for pid, signum in pids.items():
        try:
            os.kill(pid, signum)
        except OSError:
            continue
    _wait_for_growth(path, start, timeout_s)
    with open(path, encoding="utf-8", errors="replace") as handle:
        handle.seek(start)
        return handle.read()
