"""Small bookkeeping parts of the loop: the step meter, the checkpoint clock and the
flags ranks agree on after each step."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from cloudtrain.runtime.checkpoint import young_interval_s


@dataclass
class IntervalStats:
    """Averages over the steps since the previous log."""

    steps: int
    step_s: float
    """Mean wall seconds per step (data wait included)."""
    data_wait_s: float
    """Mean seconds per step spent waiting for the batch."""
    loss: float
    grad_norm: float | None
    tokens: int | None
    """Tokens per step (global); None when batches carry no token ids."""
    sync_wait_s: float = 0.0
    """Mean seconds per step this rank waited at the ranks' per-step agreement (for the
    slowest rank to arrive); 0 in a single process."""

    def samples_per_s(self, global_batch: int) -> float:
        return global_batch / self.step_s if self.step_s > 0 else 0.0

    def tokens_per_s(self) -> float | None:
        return self.tokens / self.step_s if self.tokens and self.step_s > 0 else None


@dataclass
class Totals:
    tokens: int
    last_loss: float | None


class Meter:
    """Accumulates step losses on the device; reads them back (a host sync) only in
    `read`, i.e. at log steps."""

    def __init__(self, device: torch.device, step: int) -> None:
        self.device = device
        self.grad_norm: torch.Tensor | None = None
        self.total_tokens = 0
        self._last_loss: torch.Tensor | None = None
        self._reset(step)

    def _reset(self, step: int) -> None:
        self._losses: list[torch.Tensor] = []
        self._steps = 0
        self._data_wait_s = 0.0
        self._sync_wait_s = 0.0
        self._tokens = 0
        self._has_tokens = False
        self._t0 = time.perf_counter()

    def add(self, loss: torch.Tensor, data_wait_s: float, tokens: int | None) -> None:
        self._losses.append(loss)
        self._last_loss = loss
        self._steps += 1
        self._data_wait_s += data_wait_s
        if tokens is not None:
            self._tokens += tokens
            self.total_tokens += tokens
            self._has_tokens = True

    def add_sync_wait(self, seconds: float) -> None:
        self._sync_wait_s += seconds

    def read(self, step: int) -> IntervalStats | None:
        if self._steps == 0:
            return None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - self._t0
        n = self._steps
        stats = IntervalStats(
            steps=n,
            step_s=elapsed / n,
            data_wait_s=self._data_wait_s / n,
            loss=float(torch.stack(self._losses).sum()) / n,
            grad_norm=float(self.grad_norm) if self.grad_norm is not None else None,
            tokens=self._tokens // n if self._has_tokens else None,
            sync_wait_s=self._sync_wait_s / n,
        )
        self.grad_norm = None
        self._reset(step)
        return stats

    def totals(self, step: int) -> Totals:
        last = float(self._last_loss) if self._last_loss is not None else None
        return Totals(self.total_tokens, last)


@dataclass(frozen=True)
class StepFlags:
    """What the loop acts on after a step; in distributed runs, agreed by all ranks."""

    preempted: bool = False
    """A stop signal (SIGTERM, SIGUSR1) arrived."""
    out_of_time: bool = False
    """max_seconds has passed."""
    checkpoint_due: bool = False
    """The checkpoint clock (checkpoint_every_seconds) says save now."""


class CheckpointClock:
    """When a time-based checkpoint is due. With "auto" the interval is Young's
    sqrt(2 * save_s * mtbf_s), with save_s assumed 1 s until the first save is timed."""

    def __init__(self, every_seconds: float | str | None, mtbf_s: float, enabled: bool) -> None:
        self.auto = every_seconds == "auto"
        self.mtbf_s = mtbf_s
        if every_seconds is None or not enabled:
            self.interval_s: float | None = None
        elif self.auto:
            self.interval_s = young_interval_s(1.0, mtbf_s)
        else:
            self.interval_s = float(every_seconds)
        self._last = time.monotonic()

    @property
    def enabled(self) -> bool:
        return self.interval_s is not None

    def due(self) -> bool:
        return self.interval_s is not None and time.monotonic() - self._last >= self.interval_s

    def saved(self, save_s: float | None) -> None:
        self._last = time.monotonic()
        if self.auto and save_s is not None:
            self.interval_s = young_interval_s(save_s, self.mtbf_s)
