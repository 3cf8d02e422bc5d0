"""Evaluation: mean loss over (part of) the eval data, averaged over ranks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from cloudtrain.runtime.batch import batch_size, to_device
from cloudtrain.runtime.distributed import DistEnv


def eval_batches(data: Any, micro_batch: int, env: DistEnv) -> Iterator[Any]:
    """This rank's eval batches: a strided share of a Dataset, or every world-th item
    of an iterable of batches."""
    if isinstance(data, DataLoader) and not isinstance(data.dataset, IterableDataset):
        data = data.dataset
    if isinstance(data, Dataset) and not isinstance(data, IterableDataset):
        indices = list(range(env.rank, len(data), env.world_size))
        yield from DataLoader(data, batch_size=micro_batch, sampler=indices)
        return
    for i, item in enumerate(data):
        if i % env.world_size == env.rank:
            yield item


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
    data: Any,
    *,
    micro_batch: int,
    env: DistEnv,
    device: torch.device,
    autocast_ctx: Callable[[], Any],
    max_batches: int | None,
    channels_last: bool,
) -> float:
    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)  # (loss x samples, samples)
    try:
        for i, batch in enumerate(eval_batches(data, micro_batch, env)):
            if max_batches is not None and i >= max_batches:
                break
            n = batch_size(batch)
            batch = to_device(batch, device, channels_last=channels_last)
            with autocast_ctx():
                loss = loss_fn(model, batch)
            total[0] += loss.detach().double() * n
            total[1] += n
    finally:
        model.train(was_training)
    if env.is_distributed:
        torch.distributed.all_reduce(total)
    return float(total[0] / total[1]) if total[1] > 0 else float("nan")
