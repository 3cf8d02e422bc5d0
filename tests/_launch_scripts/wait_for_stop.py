"""A worker without torch for the supervisor's stop tests: starts fast, says so on
stdout, then idles until SIGTERM, when it writes a `checkpoint` file to
CLOUDTRAIN_CHECKPOINT_DIR and exits 75 as the Trainer does. Run again with that file
present, it "resumes": says so and exits 0. --crash raises instead of idling."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

stop_requested = False


def _on_sigterm(signum, frame):
    global stop_requested
    stop_requested = True


def main() -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    checkpoint = Path(os.environ["CLOUDTRAIN_CHECKPOINT_DIR"]) / "checkpoint"
    if checkpoint.exists():
        print(f"resumed from {checkpoint}", flush=True)
        return 0
    print("worker started", flush=True)
    if "--crash" in sys.argv:
        raise RuntimeError("the training script failed on purpose")
    deadline = time.monotonic() + 120
    while not stop_requested and time.monotonic() < deadline:
        time.sleep(0.02)
    if not stop_requested:
        return 1
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    checkpoint.write_text("step 1\n")
    print("checkpointed after SIGTERM", file=sys.stderr, flush=True)
    return 75


if __name__ == "__main__":
    sys.exit(main())
