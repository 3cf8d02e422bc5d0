"""The progress display of rank 0: a rich bar on a terminal, a line every 10 s elsewhere."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


@dataclass
class Snapshot:
    """What the display shows after a logged step."""

    step: int
    loss: float | None
    samples_per_s: float | None
    tokens_per_s: float | None
    mfu: float | None
    cost_usd: float | None


def describe(s: Snapshot) -> str:
    parts = [f"step {s.step}"]
    if s.loss is not None:
        parts.append(f"loss {s.loss:.4f}")
    if s.tokens_per_s:
        parts.append(f"{s.tokens_per_s:,.0f} tok/s")
    elif s.samples_per_s:
        parts.append(f"{s.samples_per_s:,.1f} samples/s")
    if s.mfu is not None:
        parts.append(f"MFU {100 * s.mfu:.1f}%")
    if s.cost_usd is not None:
        parts.append(f"${s.cost_usd:.2f}")
    return "  ".join(parts)


class ProgressDisplay:
    def __init__(self, enabled: bool | str, total_steps: int | None, start_step: int) -> None:
        self.console = Console(stderr=True)
        tty = sys.stderr.isatty()
        self.enabled = (bool(enabled) and enabled != "auto") or (enabled == "auto" and tty)
        self.lines = enabled == "auto" and not tty
        self._last_line_s = time.monotonic()
        self._bar: Progress | None = None
        if self.enabled:
            self._bar = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                TextColumn("{task.description}"),
                console=self.console,
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task("", total=total_steps, completed=start_step)

    def update(self, s: Snapshot) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=s.step, description=describe(s))
        elif self.lines and time.monotonic() - self._last_line_s >= 10.0:
            self._last_line_s = time.monotonic()
            self.console.print(describe(s), highlight=False)

    def say(self, message: str) -> None:
        self.console.print(f"cloudtrain: {message}", highlight=False, markup=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
