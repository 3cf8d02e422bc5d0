"""Micro-batches: find the largest that fits, and recover from an OOM.

`find_micro_batch` runs real forward+backward trials: the whole per-rank batch
first, then doubling from 1 and a binary search between the last size that fit and
the first that did not. A size "fits"
when it raises no out-of-memory error and, where a `MemoryProbe` is present, its
peak stays under the target. Trials leave no trace: gradients are dropped, RNG
states and buffers (BatchNorm statistics) are put back.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from cloudtrain.runtime.checkpoint import capture_rng, restore_rng


class MemoryProbe(Protocol):
    """Peak memory of a trial against a budget; a test can impose its own limit."""

    def reset(self) -> None: ...

    def peak_bytes(self) -> int: ...

    def capacity_bytes(self) -> int: ...


@dataclass
class CudaMemoryProbe:
    device: torch.device

    def reset(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak_bytes(self) -> int:
        return int(torch.cuda.max_memory_allocated(self.device))

    def capacity_bytes(self) -> int:
        return int(torch.cuda.get_device_properties(self.device).total_memory)


def is_oom(error: BaseException) -> bool:
    """An out-of-memory error from CUDA or the CPU allocator."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and (
        "out of memory" in text.lower() or "can't allocate memory" in text
    )


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


@contextlib.contextmanager
def no_side_effects(model: nn.Module, device: torch.device) -> Iterator[None]:
    """Run trial passes without changing what the real run will compute: RNG states,
    buffers and gradients are as they were afterwards."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    rngs = capture_rng(device)  # Python and NumPy too: a loss_fn may draw from them
    try:
        yield
    finally:
        restore_rng(rngs, device)
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for name, b in model.named_buffers():
                if name in buffers:
                    b.copy_(buffers[name])


def find_micro_batch(
    trial: Callable[[int], None],
    upper: int,
    device: torch.device,
    probe: MemoryProbe | None,
    target_fraction: float,
) -> int:
    """The largest micro-batch in [1, upper] for which `trial(n)` (forward+backward
    on n samples) fits. Raises the OOM error when even 1 does not fit."""

    def fits(n: int) -> bool:
        if probe is not None:
            probe.reset()
        try:
            trial(n)
        except Exception as error:
            if not is_oom(error):
                raise
            free_memory(device)
            return False
        if probe is None:
            return True
        return probe.peak_bytes() <= target_fraction * probe.capacity_bytes()

    if fits(upper):
        return upper  # the common case: the whole per-rank batch fits
    if not fits(1):
        raise torch.OutOfMemoryError(
            "micro_batch_size 1 does not fit in device memory; use activation_checkpointing, "
            "FSDP, a smaller model or a bigger GPU"
        )
    good, bad = 1, upper  # fits, does not fit
    while good * 2 < bad and fits(good * 2):
        good *= 2
    if good * 2 < bad:
        bad = good * 2
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good


def micro_slices(local_batch: int, micro: int) -> list[tuple[int, int]]:
    """[start, end) of each micro-batch of a per-rank batch (the last may be shorter)."""
    return [(s, min(s + micro, local_batch)) for s in range(0, local_batch, micro)]
