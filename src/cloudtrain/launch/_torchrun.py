"""torchrun for `cloudtrain run`: `python -m cloudtrain.launch._torchrun ARGS` is
`python -m torch.distributed.run ARGS`, except that a stop signal ends it quietly.

On SIGTERM/SIGINT torchrun's elastic agent raises `SignalException` from its signal
handler (torch.distributed.elastic.multiprocessing.api), sends the signal on to the
workers, waits up to --shutdown-timeout for them, kills what is left and re-raises;
the exception leaves `torch.distributed.run.main` and Python prints its traceback.
For `cloudtrain run` that signal is a stop it asked for (budget, preemption), so the
traceback is noise: here it becomes the exit code 128 + signal number (143 for
SIGTERM), what a process killed by the signal reports to a shell. torchrun's own log
lines ("Received 15 death signal, shutting down workers") stay, and everything else
is untouched: the workers' stdout/stderr go straight to the terminal, and a worker
that fails still ends in torchrun's ChildFailedError report (which rank, exit code,
when) and exit code 1, without the agent's own traceback.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with `argv` (None: sys.argv[1:]); its exit code, 128 + signal on a stop."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    args = sys.argv[1:] if argv is None else argv
    sys.argv[0] = "torchrun"  # torchrun's usage and error messages name itself
    try:
        torchrun_main(args)
    except SignalException as stop:
        return 128 + int(stop.sigval)
    except ChildFailedError as failed:
        # the script's own traceback is already on stderr; torchrun's report says which
        # rank failed how, its traceback through the agent says nothing more
        sys.stderr.write(f"{failed}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
