"""A tiny, fully deterministic training job used by the runtime tests.

Importable (tests build the same job in-process) and runnable as a script (tests
launch it in a subprocess or under torchrun and send it signals). The loss draws
from Python's and NumPy's RNGs and the model has dropout, so a resume that fails to
restore any RNG, or the data position, changes the losses.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from cloudtrain.runtime import Callback, TrainConfig, Trainer

N_SAMPLES = 96
N_FEATURES = 6


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(N_SAMPLES, N_FEATURES, generator=g)
    y = (x[:, :3].sum(1, keepdim=True) > 0).float()
    return TensorDataset(x, y)


class AugmentedDataset(torch.utils.data.Dataset):
    """`dataset()` with random noise added to every sample as it is fetched: the kind of
    augmentation that runs in DataLoader workers."""

    def __init__(self) -> None:
        self.base = dataset()

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int):
        x, y = self.base[index]
        return x + 0.1 * torch.randn_like(x) + 0.01 * float(np.random.rand()), y


class TinyNet(nn.Module):
    """An MLP with dropout; `oom_above` makes forward raise a real torch.OutOfMemoryError
    for micro-batches larger than it (a memory limit the CPU does not have)."""

    def __init__(self, dropout: float = 0.2, unused: bool = False) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(N_FEATURES, 32), nn.Dropout(dropout), nn.Tanh(), nn.Linear(32, 1)
        )
        self.oom_above: int | None = None
        self.spare = nn.Linear(2, 2) if unused else None  # never used in forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)  # dropout draws from the RNG before the limit bites
        if self.oom_above is not None and x.shape[0] > self.oom_above:
            raise torch.OutOfMemoryError(f"test limit: micro-batch {x.shape[0]} > {self.oom_above}")
        return out


def build_model(seed: int = 0, dropout: float = 0.2, unused: bool = False) -> TinyNet:
    torch.manual_seed(seed)
    return TinyNet(dropout, unused)


def noisy_loss(model: nn.Module, batch) -> torch.Tensor:
    """BCE scaled by a factor drawn from Python's and NumPy's RNGs."""
    x, y = batch
    base = nn.functional.binary_cross_entropy_with_logits(model(x), y)
    return base * (1.0 + 0.05 * random.random() + 0.05 * float(np.random.rand()))


def plain_loss(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.binary_cross_entropy_with_logits(model(x), y)


class LossLog(Callback):
    """Losses by step, in memory and (optionally) appended to a JSON-lines file."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.losses: dict[int, float] = {}
        self.path = Path(path) if path else None

    def on_step_end(self, trainer, step, loss) -> None:
        self.losses[step] = loss.item()
        if self.path is not None and int(os.environ.get("RANK", "0")) == 0:
            with open(self.path, "a") as f:
                f.write(json.dumps({"step": step, "loss": self.losses[step]}) + "\n")


class LimitMemory(Callback):
    """On one rank, from step `after` on, micro-batches above `limit` run out of memory."""

    def __init__(self, rank: int, after: int, limit: int) -> None:
        self.rank, self.after, self.limit = rank, after, limit

    def on_step_end(self, trainer, step, loss) -> None:
        if step == self.after and int(os.environ.get("RANK", "0")) == self.rank:
            trainer.model.oom_above = self.limit


class SaveParams(Callback):
    """The final parameters (gathered whole under FSDP), written by rank 0."""

    def __init__(self, path: str | Path) -> None:
        self.path = path

    def on_fit_end(self, trainer, result) -> None:
        state = trainer.full_model_state()
        if int(os.environ.get("RANK", "0")) == 0:
            torch.save(state, self.path)


class CountAllReduce(Callback):
    """All_reduce calls made from Python during each step (DDP's gradient buckets run in
    C++ and are not counted): the agreements between ranks the loop pays for."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.calls = 0
        self.per_step: list[int] = []
        self._at_last_step = 0
        real = dist.all_reduce

        def counted(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)

        dist.all_reduce = counted

    def on_step_end(self, trainer, step, loss) -> None:
        self.per_step.append(self.calls - self._at_last_step)
        self._at_last_step = self.calls


def read_losses(path: str | Path) -> dict[int, float]:
    """Losses by step from a LossLog file; a later line for a step wins (a redone step)."""
    out: dict[int, float] = {}
    for line in Path(path).read_text().splitlines():
        row = json.loads(line)
        out[row["step"]] = row["loss"]
    return out


def same_params(a: nn.Module, b: nn.Module) -> bool:
    """Bit-identical parameters and buffers."""
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def config(**overrides) -> TrainConfig:
    base = dict(
        max_steps=20,
        global_batch_size=8,
        micro_batch_size=4,
        lr=0.05,
        log_every_steps=1,
        store=False,
        progress=False,
        seed=0,
    )
    base.update(overrides)
    return TrainConfig(**base)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", default=None)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--every", type=int, default=None, help="checkpoint_every_steps")
    p.add_argument("--every-seconds", type=float, default=None, help="checkpoint_every_seconds")
    p.add_argument("--count-all-reduce", action="store_true", help="report all_reduce per step")
    p.add_argument("--loss-log", default=None, help="JSON-lines file of rank 0's losses")
    p.add_argument("--params-out", default=None)
    p.add_argument("--signal-at", default=None, help="STEP:MICRO:SIGNAL[:COUNT] sent to itself")
    p.add_argument("--plain", action="store_true", help="no dropout, no RNG in the loss")
    p.add_argument("--parallelism", default="auto")
    p.add_argument("--grad-compression", default=None, help="bf16, fp16 or powersgd")
    p.add_argument("--unused-param", action="store_true", help="a parameter forward skips")
    p.add_argument("--slow-rank", default=None, help="RANK:MS sleep in each micro-batch")
    p.add_argument("--find-unused", action="store_true", help="find_unused_parameters")
    p.add_argument("--sleep-after-signal", type=float, default=0.0)
    p.add_argument("--grace", type=float, default=30.0, help="grace_period_s")
    p.add_argument("--oom-at", default=None, help="RANK:STEP:LIMIT memory limit from STEP on")
    p.add_argument("--store", default=None, help="run store file (default: no store)")
    p.add_argument("--log-every", type=int, default=1, help="log_every_steps")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    model = build_model(dropout=0.0 if args.plain else 0.2, unused=args.unused_param)
    calls = {"step": -1, "micro": 0}
    holder: dict[str, Trainer] = {}
    loss = plain_loss if args.plain else noisy_loss
    target = None
    if args.signal_at:
        parts = args.signal_at.split(":")
        target = (
            int(parts[0]),
            int(parts[1]),
            getattr(signal, parts[2]),
            int(parts[3]) if len(parts) > 3 else 1,
        )

    slow = [int(v) for v in args.slow_rank.split(":")] if args.slow_rank else None

    def loss_fn(m, batch):
        step = holder["trainer"].step
        if slow and int(os.environ.get("RANK", "0")) == slow[0]:
            time.sleep(slow[1] / 1000)  # a straggler: a slower GPU, a noisy neighbour
        calls["micro"] = calls["micro"] + 1 if calls["step"] == step else 0
        calls["step"] = step
        if target and (step, calls["micro"]) == target[:2]:
            for _ in range(target[3]):
                os.kill(os.getpid(), target[2])
            if args.sleep_after_signal:
                time.sleep(args.sleep_after_signal)
        return loss(m, batch)

    cfg = config(
        max_steps=args.steps,
        global_batch_size=args.global_batch,
        micro_batch_size=args.micro,
        checkpoint_dir=args.ckpt,
        checkpoint_every_steps=args.every,
        parallelism=args.parallelism,
        grad_compression=args.grad_compression,
        find_unused_parameters=args.find_unused,
        grace_period_s=args.grace,
        store=args.store or False,
        log_every_steps=args.log_every,
        monitor_interval_s=0.1,
    )
    if args.every_seconds is not None:
        cfg = dataclasses.replace(cfg, checkpoint_every_seconds=args.every_seconds)
    callbacks: list[Callback] = [LossLog(args.loss_log)]
    if args.oom_at:
        callbacks.append(LimitMemory(*(int(v) for v in args.oom_at.split(":"))))
    if args.params_out:
        callbacks.append(SaveParams(args.params_out))
    counter = CountAllReduce() if args.count_all_reduce else None
    if counter is not None:
        callbacks.append(counter)
    trainer = Trainer(model, loss_fn, dataset(), config=cfg, callbacks=callbacks)
    holder["trainer"] = trainer
    result = trainer.fit()
    print(
        json.dumps(
            {
                "steps": result.steps,
                "stopped_by": result.stopped_by,
                "micro": result.micro_batch_size,
                "run_id": result.run_id,
                "all_reduce_per_step": counter.per_step if counter else None,
                "checkpoint": result.last_checkpoint,
            }
        )
    )
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The result is out. Skip interpreter finalization: with gloo, C++ objects that are
    # only freed there can abort a rank after its work is done (a PyTorch teardown issue,
    # seen here about once in 80 launches under load), which says nothing about training.
    os._exit(code)
