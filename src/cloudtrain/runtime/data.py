"""Training data that knows where it is, so a resume continues with the same batches.

Two kinds of source, both yielding one *step batch* per optimizer step (this rank's
share of the global batch):

- `MapSource` for map-style datasets (a `Dataset`, or the dataset of a `DataLoader`):
  each epoch is a permutation drawn from `seed + epoch`; step s of the epoch takes
  samples [s*G, (s+1)*G) of it and rank r takes the r-th slice of those. The
  position is (epoch, sample offset); a partial last global batch is dropped. In
  DataLoader workers each step batch is fetched with the RNGs seeded by its place
  (SeededDataset), so random augmentation there is exact across resumes too.
- `IterableSource` for anything else iterable (a generator, an `IterableDataset`, a
  DataLoader over one): items are batches; rank r takes items r, r+W, r+2W, ...,
  concatenated and split to the per-rank batch. The position is (epoch, items
  taken, offset in the next item); a resume re-iterates and skips, which is exact
  when the iterable yields the same items each time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from cloudtrain.errors import UserError
from cloudtrain.runtime.batch import batch_size, concat_batches, slice_batch
from cloudtrain.runtime.checkpoint import seed_everything


@dataclass
class DataPosition:
    """Where the next step batch comes from."""

    epoch: int = 0
    offset: int = 0
    """MapSource: samples of the epoch already used (all ranks). IterableSource: items
    this rank took from the epoch's iterator."""
    item_offset: int = 0
    """IterableSource: samples of the next item already used; 0 for MapSource."""

    def to_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset, "item_offset": self.item_offset}

    @classmethod
    def from_dict(cls, d: dict[str, int]) -> DataPosition:
        return cls(int(d["epoch"]), int(d["offset"]), int(d.get("item_offset", 0)))


def batch_seed(seed: int, rank: int, epoch: int, offset: int) -> int:
    """The seed a step batch's samples are fetched with: fixed by where the batch is in
    the run (ints and tuples of ints hash the same in every process)."""
    return hash((seed, rank, epoch, offset)) & 0x7FFF_FFFF_FFFF_FFFF


class ResumableBatchSampler(Sampler[list]):
    """Yields this rank's sample indices for each step, from a given position; `keyed`:
    as (batch seed, index) pairs, for SeededDataset in DataLoader workers."""

    def __init__(
        self,
        n: int,
        global_batch: int,
        rank: int,
        world: int,
        seed: int,
        shuffle: bool = True,
        keyed: bool = False,
    ):
        self.n, self.global_batch, self.rank, self.world = n, global_batch, rank, world
        self.seed, self.shuffle, self.keyed = seed, shuffle, keyed
        self.epoch, self.start = 0, 0

    def set_position(self, epoch: int, start: int) -> None:
        self.epoch, self.start = epoch, start

    def steps_per_epoch(self) -> int:
        return self.n // self.global_batch

    def __len__(self) -> int:
        return max(0, (self.n - self.start) // self.global_batch)

    def __iter__(self) -> Iterator[list]:
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            order = torch.randperm(self.n, generator=gen)
        else:
            order = torch.arange(self.n)
        per_rank = self.global_batch // self.world
        for offset in range(self.start, self.n - self.global_batch + 1, self.global_batch):
            chunk = order[offset + self.rank * per_rank : offset + (self.rank + 1) * per_rank]
            if not self.keyed:
                yield chunk.tolist()
                continue
            seed = batch_seed(self.seed, self.rank, self.epoch, offset)
            yield [(seed, index) for index in chunk.tolist()]


class SeededDataset(Dataset):
    """`dataset` as DataLoader workers fetch it: one step batch at a time, with the
    global RNGs (Python, NumPy, torch CPU) first seeded by the batch's place in the run.
    Worker RNG states are not in checkpoints, so this is what makes random augmentation
    there come out the same after a resume. (In the main process, num_workers=0,
    loading draws from the training's own RNGs, which checkpoints hold.)"""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, keys: list[tuple[int, int]]) -> list[Any]:
        indices = [index for _, index in keys]
        seed_everything(keys[0][0])
        many = getattr(self.dataset, "__getitems__", None)
        return list(many(indices)) if many else [self.dataset[i] for i in indices]

    def __getitem__(self, key: tuple[int, int]) -> Any:
        return self.__getitems__([key])[0]


def default_num_workers(device_type: str, local_world: int) -> int:
    """Workers per rank: CPU cores per GPU minus one (at most 8); 0 when training on CPU,
    where workers would compete with the model for the same cores."""
    if device_type != "cuda":
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(8, (cores or 1) // max(1, local_world) - 1))


class MapSource:
    """Step batches from a map-style dataset through a DataLoader with our sampler."""

    def __init__(
        self,
        dataset,
        *,
        global_batch,
        rank,
        world,
        seed,
        num_workers,
        pin_memory,
        collate_fn=None,
        shuffle=True,
    ):
        n = len(dataset)
        if n < global_batch:
            raise UserError(
                f"the training dataset has {n} samples, fewer than global_batch_size "
                f"{global_batch}; lower global_batch_size"
            )
        workers = num_workers > 0
        self.sampler = ResumableBatchSampler(
            n, global_batch, rank, world, seed, shuffle, keyed=workers
        )
        self.global_batch = global_batch
        self.position = DataPosition()
        kwargs: dict[str, Any] = {}
        if num_workers > 0:
            kwargs.update(persistent_workers=True, prefetch_factor=4)
        # A generator of our own: DataLoader otherwise draws its worker base seed from
        # the global torch RNG on every iter(), which would make resumes diverge.
        self.loader = DataLoader(
            SeededDataset(dataset) if workers else dataset,
            batch_sampler=self.sampler,
            num_workers=num_workers,
            pin_memory=pin_memory,
            collate_fn=collate_fn,
            generator=torch.Generator().manual_seed(seed),
            **kwargs,
        )
        self._it: Iterator | None = None

    def steps_per_epoch(self) -> int:
        return self.sampler.steps_per_epoch()

    def next_batch(self) -> Any | None:
        """This rank's next step batch; None at the end of the epoch (position moves on)."""
        if self._it is None:
            self.sampler.set_position(self.position.epoch, self.position.offset)
            self._it = iter(self.loader)
        try:
            batch = next(self._it)
        except StopIteration:
            self._it = None
            self.position = DataPosition(self.position.epoch + 1, 0)
            return None
        self.position.offset += self.global_batch
        if self.position.offset + self.global_batch > self.sampler.n:
            # the epoch is used up: the position already names the next one
            self.position = DataPosition(self.position.epoch + 1, 0)
            self._it = None
        return batch

    def restore(self, position: DataPosition) -> None:
        self.position = DataPosition(position.epoch, position.offset)
        self._it = None


class IterableSource:
    """Step batches from an iterable of batches; see the module docstring."""

    def __init__(self, iterable, *, local_batch: int, rank: int, world: int):
        self.iterable, self.local_batch, self.rank, self.world = iterable, local_batch, rank, world
        self.position = DataPosition()
        self._it: Iterator | None = None
        self._pending: Any = None  # the current item, part of it maybe already used
        self.one_shot = isinstance(iterable, Iterator)

    def steps_per_epoch(self) -> int | None:
        return None

    def _next_item(self) -> Any | None:
        if self._it is None:
            self._it = iter(self.iterable)
            for _ in range(self.position.offset * self.world + self.rank):
                next(self._it, None)  # skip what earlier steps (and other ranks) took
        else:
            for _ in range(self.world - 1):
                next(self._it, None)
        return next(self._it, None)

    def next_batch(self) -> Any | None:
        parts, have = [], 0
        while have < self.local_batch:
            if self._pending is None:
                item = self._next_item()
                if item is None:
                    self._it, self._pending = None, None
                    self.position = DataPosition(self.position.epoch + 1, 0, 0)
                    return None
                self._pending = item
            size = batch_size(self._pending)
            take = min(size - self.position.item_offset, self.local_batch - have)
            start = self.position.item_offset
            parts.append(slice_batch(self._pending, start, start + take))
            have += take
            self.position.item_offset += take
            if self.position.item_offset >= size:
                self._pending = None
                self.position.offset += 1
                self.position.item_offset = 0
        return concat_batches(parts)

    def restore(self, position: DataPosition) -> None:
        if self.one_shot and position.offset:
            raise UserError("cannot resume a one-shot iterator; pass a re-iterable or Dataset")
        self.position = DataPosition(position.epoch, position.offset, position.item_offset)
        self._it, self._pending = None, None
        if position.item_offset:
            self._pending = self._next_item()


def make_source(
    data, *, global_batch, rank, world, seed, device_type, local_world, num_workers="auto"
):
    """A MapSource or IterableSource for `data` (Dataset, DataLoader or iterable)."""
    if global_batch % world:
        raise UserError(
            f"global_batch_size {global_batch} is not divisible by the {world} ranks; "
            f"use a multiple of {world}"
        )
    workers = (
        default_num_workers(device_type, local_world) if num_workers == "auto" else num_workers
    )
    pin = device_type == "cuda"
    common = dict(global_batch=global_batch, rank=rank, world=world, seed=seed)
    if isinstance(data, DataLoader) and not isinstance(data.dataset, IterableDataset):
        workers = data.num_workers if num_workers == "auto" and data.num_workers else workers
        return MapSource(
            data.dataset,
            num_workers=workers,
            pin_memory=pin or data.pin_memory,
            collate_fn=data.collate_fn,
            **common,
        )
    if isinstance(data, Dataset) and not isinstance(data, IterableDataset):
        return MapSource(data, num_workers=workers, pin_memory=pin, **common)
    if hasattr(data, "__iter__"):
        return IterableSource(data, local_batch=global_batch // world, rank=rank, world=world)
    raise UserError(f"train_data must be a Dataset, DataLoader or iterable, not {type(data)}")
