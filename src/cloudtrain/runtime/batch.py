"""Batch helpers: a batch is a tensor, a tuple/list of them, or a dict of them.

The first dimension of every tensor is the sample dimension. Non-tensor leaves
(strings, ints) are carried along unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def _first_tensor(batch: Any) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    values = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(batch, (Mapping, list, tuple)):
        for value in values:
            found = _first_tensor(value)
            if found is not None:
                return found
    return None


def batch_size(batch: Any) -> int:
    """Number of samples: the first dimension of the first tensor in the batch."""
    first = _first_tensor(batch)
    if first is None or first.dim() == 0:
        raise TypeError("a batch must hold at least one tensor with a sample dimension")
    return int(first.shape[0])


def map_tensors(batch: Any, fn) -> Any:
    """Apply `fn` to every tensor leaf, keeping the structure."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return type(batch)({k: map_tensors(v, fn) for k, v in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(map_tensors(v, fn) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(map_tensors(v, fn) for v in batch)
    return batch


def slice_batch(batch: Any, start: int, end: int) -> Any:
    """Samples [start, end) of the batch (views, no copy)."""
    if start == 0 and end == batch_size(batch):
        return batch
    return map_tensors(batch, lambda t: t[start:end] if t.dim() > 0 else t)


def concat_batches(parts: list[Any]) -> Any:
    """Concatenate batches of the same structure along the sample dimension."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts, dim=0)
    if isinstance(first, Mapping):
        return type(first)({k: concat_batches([p[k] for p in parts]) for k in first})
    if isinstance(first, (list, tuple)):
        items = [concat_batches([p[i] for p in parts]) for i in range(len(first))]
        return type(first)(*items) if hasattr(first, "_fields") else type(first)(items)
    return first


def to_device(batch: Any, device: torch.device, *, channels_last: bool = False) -> Any:
    """Move a batch to `device` (non-blocking from pinned memory); 4-D float tensors
    go channels_last when asked."""

    def move(t: torch.Tensor) -> torch.Tensor:
        t = t.to(device, non_blocking=True)
        if channels_last and t.dim() == 4 and t.is_floating_point():
            t = t.contiguous(memory_format=torch.channels_last)
        return t

    return map_tensors(batch, move)


def count_tokens(batch: Any) -> int | None:
    """Tokens in a batch: the element count of the first integer tensor with two or
    more dimensions (token ids, batch x time); None when the batch has none."""
    if isinstance(batch, torch.Tensor):
        is_ids = batch.dim() >= 2 and not batch.is_floating_point() and batch.dtype != torch.bool
        return batch.numel() if is_ids else None
    values = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(batch, (Mapping, list, tuple)):
        for value in values:
            found = count_tokens(value)
            if found is not None:
                return found
    return None
