"""Preemption: SIGTERM or SIGUSR1 asks the Trainer to stop cleanly.

First signal: the Trainer finishes the step it is in, writes a checkpoint and exits
with `EXIT_PREEMPTED` (75, EX_TEMPFAIL: "try again later"; a supervisor restarts
and the run resumes). If that has not happened within the grace period, the
process exits with `EXIT_GRACE_EXPIRED`. A second signal exits at once with
128 + the signal number, as a shell would report a kill by that signal.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

EXIT_PREEMPTED = 75
"""Stopped by SIGTERM/SIGUSR1 after writing a checkpoint: resume by running again."""
EXIT_GRACE_EXPIRED = 76
"""Stopped by a signal but the checkpoint did not finish within the grace period."""

SIGNALS = tuple(
    s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGUSR1", None)) if s
)


class PreemptionHandler:
    """Installs the handlers (main thread only) and remembers the first signal."""

    def __init__(self, grace_period_s: float) -> None:
        self.grace_period_s = grace_period_s
        self.signal_received: int | None = None
        self.received_at: float | None = None
        self._previous: dict[int, object] = {}
        self._timer: threading.Timer | None = None

    @property
    def requested(self) -> bool:
        return self.signal_received is not None

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only live in the main thread
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        self._previous.clear()
        if self._timer is not None:
            self._timer.cancel()

    def _handle(self, signum: int, frame) -> None:
        if self.signal_received is not None:
            sys.stderr.write(f"cloudtrain: second signal {signum}, exiting now\n")
            sys.stderr.flush()
            os._exit(128 + signum)
        self.signal_received = signum
        self.received_at = time.monotonic()
        name = signal.Signals(signum).name
        sys.stderr.write(
            f"cloudtrain: {name} received; finishing this step, saving a checkpoint, "
            f"exiting within {self.grace_period_s:.0f} s (exit code {EXIT_PREEMPTED})\n"
        )
        sys.stderr.flush()
        self._timer = threading.Timer(self.grace_period_s, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        sys.stderr.write("cloudtrain: grace period over before the checkpoint finished\n")
        sys.stderr.flush()
        os._exit(EXIT_GRACE_EXPIRED)
