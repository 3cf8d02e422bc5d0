"""Distributed setup: torchrun detection, process group, DDP/FSDP2 wrapping, and the
few collectives the Trainer needs (agree on a flag, a minimum, a choice)."""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from cloudtrain.errors import UserError
from cloudtrain.runtime.checkpoint import numpy_rng_state, set_numpy_rng_state


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job, from torchrun's environment variables."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def detect_env() -> DistEnv:
    """RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE from torchrun (default: one process)."""
    get = os.environ.get
    world = int(get("WORLD_SIZE", "1"))
    return DistEnv(
        int(get("RANK", "0")),
        int(get("LOCAL_RANK", "0")),
        world,
        int(get("LOCAL_WORLD_SIZE", str(world))),
    )


def pick_device(requested: str, env: DistEnv) -> torch.device:
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device '{requested}' asked for but CUDA is not available; use 'cpu'")
    if requested == "cuda":
        return torch.device("cuda", env.local_rank)
    return torch.device(requested)


def init_process_group(env: DistEnv, device: torch.device) -> bool:
    """Join the process group (nccl on CUDA, gloo on CPU); True when we created it."""
    if not env.is_distributed or dist.is_initialized():
        return False
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None)
    return True


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _distributed() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


@dataclass(frozen=True)
class _HostPlane:
    """How ranks agree on host values under one default group."""

    world: Any
    """The default group this was made for (held, so a new one is never mistaken for it)."""
    group: Any
    """None: the default group itself."""
    device: torch.device
    """Where agreement tensors live: the CPU, or the GPU when no gloo group could be made."""


_plane: list[_HostPlane] = []
SIDE_GROUP_TIMEOUT = timedelta(seconds=120)


def host_plane() -> _HostPlane:
    """How ranks agree on host values (flags, sizes, timings): through the default group
    when its backend carries CPU tensors (gloo), otherwise through a gloo group over the
    same ranks, created on first use. Agreeing on CPU tensors
    never waits for the GPU; the same all_reduce on a CUDA tensor under NCCL would make
    the host wait for every kernel queued before it, once per step.

    Creating the group is itself collective: every rank gets here at the same point,
    because every caller is a collective. If gloo cannot connect (a host whose name
    resolves to an interface the others cannot reach), agreements go through the
    default group on the GPU, with one line saying so."""
    world = dist.group.WORLD
    if not _plane or _plane[0].world is not world:
        _plane[:] = [_make_plane(world)]
    return _plane[0]


def _make_plane(world: Any) -> _HostPlane:
    cpu = torch.device("cpu")
    if "gloo" in str(dist.get_backend()).lower():
        return _HostPlane(world, None, cpu)
    try:
        return _HostPlane(world, dist.new_group(backend="gloo", timeout=SIDE_GROUP_TIMEOUT), cpu)
    except Exception as error:  # agreeing on the GPU is slower, never wrong
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        sys.stderr.write(
            f"cloudtrain: no gloo group for host agreements ({type(error).__name__}: "
            f"{first_line}); agreeing on the GPU, one host sync per step. Set "
            "GLOO_SOCKET_IFNAME to the network interface the nodes share.\n"
        )
        return _HostPlane(world, None, torch.device("cuda", torch.cuda.current_device()))


def _all_reduce_ints(values: list[int], op: Any) -> list[int]:
    plane = host_plane()
    t = torch.tensor(values, dtype=torch.int64, device=plane.device)
    dist.all_reduce(t, op=op, group=plane.group)
    return [int(v) for v in t.tolist()]


def agree_flags(flags: list[bool]) -> list[bool]:
    """Each flag True on every rank when it is True on any rank (one all_reduce on the
    host, see host_plane)."""
    if not _distributed():
        return list(flags)
    agreed = _all_reduce_ints([1 if f else 0 for f in flags], dist.ReduceOp.MAX)
    return [bool(v) for v in agreed]


def gather_floats(values: list[float]) -> list[list[float]]:
    """Every rank's `values` (same length on all ranks), by rank: one all_gather of a
    small float64 CPU tensor. A single process gets `[values]`."""
    if not _distributed():
        return [list(values)]
    plane = host_plane()
    mine = torch.tensor(values, dtype=torch.float64, device=plane.device)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine, group=plane.group)
    return [t.tolist() for t in out]


def min_int(value: int) -> int:
    """The smallest `value` over all ranks."""
    if not _distributed():
        return value
    return _all_reduce_ints([value], dist.ReduceOp.MIN)[0]


def broadcast_int(value: int) -> int:
    """Rank 0's `value` on every rank."""
    if not _distributed():
        return value
    plane = host_plane()
    t = torch.tensor([value], dtype=torch.int64, device=plane.device)
    dist.broadcast(t, src=0, group=plane.group)
    return int(t.item())


def resolve_parallelism(requested: str, env: DistEnv) -> str:
    if requested == "auto":
        return "ddp" if env.is_distributed else "none"
    if requested in ("ddp", "fsdp") and not env.is_distributed:
        return "none"  # a single process needs no wrapper; same code, same result
    return requested


def wrap_ddp(
    model: nn.Module,
    device: torch.device,
    compression: str | None,
    find_unused_parameters: bool = False,
) -> tuple[nn.Module, Any]:
    """(the DDP module, the compression hook's state: a PowerSGDState or None)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [device.index] if device.type == "cuda" else None
    ddp = DDP(
        model,
        device_ids=ids,
        gradient_as_bucket_view=True,
        find_unused_parameters=find_unused_parameters,
    )
    hook_state = _register_compression(ddp, compression) if compression is not None else None
    return ddp, hook_state


def _register_compression(ddp: nn.Module, kind: str) -> Any:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if kind == "bf16":
        if "nccl" not in str(dist.get_backend()).lower():
            raise UserError(
                f"grad_compression='bf16' needs NCCL (CUDA); the process group uses "
                f"{dist.get_backend()}: use 'fp16' or 'powersgd' there"
            )
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif kind == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif kind == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=10
        )
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return state
    return None


POWERSGD_TENSOR_FIELDS = ("error_dict", "p_memory_dict", "q_memory_dict")
"""PowerSGDState's per-bucket tensors (keyed by bucket index)."""


def powersgd_state_dict(state: Any) -> dict[str, Any]:
    """What a PowerSGD hook carries from step to step on this rank (its step count, the
    error feedback, the warm-start matrices and the RNG that seeds new projections), as
    tensors and numbers a weights-only checkpoint can hold."""
    return {
        "iter": int(state.iter),
        **{
            field: {k: v.detach().cpu().clone() for k, v in getattr(state, field).items()}
            for field in POWERSGD_TENSOR_FIELDS
        },
        "rng": numpy_rng_state(state.rng),
    }


def load_powersgd_state(state: Any, saved: dict[str, Any], device: torch.device) -> None:
    """Put `powersgd_state_dict`'s output back into a fresh PowerSGDState."""
    state.iter = int(saved["iter"])
    for field in POWERSGD_TENSOR_FIELDS:
        setattr(state, field, {int(k): v.to(device) for k, v in saved[field].items()})
    set_numpy_rng_state(saved["rng"], state.rng)


def wrap_fsdp(model: nn.Module, device: torch.device) -> nn.Module:
    """FSDP2: shard every block of the model's ModuleLists, then the root."""
    from torch.distributed.fsdp import fully_shard

    for module in list(model.modules()):
        if isinstance(module, nn.ModuleList):
            for block in module:
                fully_shard(block)
    fully_shard(model)
    return model


def no_sync(wrapped: nn.Module, parallelism: str, skip_sync: bool):
    """Context in which backward accumulates locally without gradient communication."""
    if not skip_sync:
        return contextlib.nullcontext()
    if parallelism == "ddp":
        return wrapped.no_sync()
    if parallelism == "fsdp":
        return _fsdp_no_sync(wrapped)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp_no_sync(model: nn.Module):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
