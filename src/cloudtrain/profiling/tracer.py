"""One training step (forward, backward) under a TorchDispatchMode: every ATen op that
runs, with its costs, and the live-tensor peak.

Memory: each new storage an op outputs is counted from its creation until it is freed
(a `weakref.finalize` on the untyped storage, which works for meta and fake tensors
too); parameters and the batch exist before the step and are not counted as new. The
peak over forward and backward, less the parameters' gradients (the planner counts
those apart), plus the batch itself, is the step's activation memory.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cloudtrain.profiling.formulas import (
    OpCost,
    compute_dtype,
    op_bytes,
    op_cost,
    shape_text,
    span_bytes,
    tensors_in,
)
from cloudtrain.profiling.ops import DROP, flop_weight, rule_of


@dataclass(frozen=True)
class RawOp:
    """One op occurrence at one traced batch size."""

    op: str
    op_class: str
    phase: str
    dtype: str
    flops: float
    bytes: float
    gemm: tuple[float, float, float] | None
    groups: int
    channels_last: bool
    shape: str


def _storage_key(tensor: torch.Tensor) -> Any:
    try:
        storage = tensor.untyped_storage()
    except Exception:  # sparse / nested tensors: no plain storage to follow
        return None, None
    return storage._cdata, storage


class MemoryTracker:
    """Bytes of the storages created during the step, as a sequence of +/- events."""

    def __init__(self) -> None:
        self.live: dict[int, int | None] = {}
        """storage key -> serial of the allocation (None: existed before the step)."""
        self.events: list[tuple[int, int]] = []
        self.baseline = 0
        self._serial = 0
        self._finalizers: list[weakref.finalize] = []
        self.closed = False

    def preexisting(self, tensors: list[torch.Tensor], *, count: bool = False) -> None:
        for tensor in tensors:
            key, storage = _storage_key(tensor)
            if key is None or key in self.live:
                continue
            self.live[key] = None
            self._finalizers.append(weakref.finalize(storage, self._free, key, None, 0))
            if count:
                self.baseline += storage.nbytes()

    def track(self, out: Any) -> None:
        for tensor in tensors_in(out):
            key, storage = _storage_key(tensor)
            if key is None or key in self.live:
                continue
            serial, self._serial = self._serial, self._serial + 1
            nbytes = storage.nbytes()
            self.live[key] = serial
            self.events.append((serial, nbytes))
            self._finalizers.append(weakref.finalize(storage, self._free, key, serial, nbytes))

    def _free(self, key: int, serial: int | None, nbytes: int) -> None:
        if self.closed or key not in self.live or self.live[key] != serial:
            return
        del self.live[key]
        if serial is not None:
            self.events.append((serial, -nbytes))

    def serials(self, tensors: list[torch.Tensor]) -> set[int]:
        found = set()
        for tensor in tensors:
            key, _ = _storage_key(tensor)
            serial = self.live.get(key) if key is not None else None
            if serial is not None:
                found.add(serial)
        return found

    def peak(self, exclude: set[int]) -> int:
        running = peak = self.baseline
        for serial, delta in self.events:
            if serial in exclude:
                continue
            running += delta
            peak = max(peak, running)
        return peak

    def close(self) -> None:
        self.closed = True
        for finalizer in self._finalizers:
            finalizer.detach()
        self._finalizers.clear()


class Recorder(TorchDispatchMode):
    """Records every dispatched op (views and empty allocations dropped)."""

    def __init__(self, *, channels_last: bool = False) -> None:
        super().__init__()
        self.ops: list[RawOp] = []
        self.phase = "forward"
        self.channels_last = channels_last
        self.memory = MemoryTracker()
        self.unknown: dict[str, int] = {}
        self.formula_errors: dict[str, str] = {}
        self.dropped = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.memory.track(out)
        self._record(func, args, kwargs, out)
        return out

    def _record(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        opname = getattr(func, "_opname", None) or getattr(func, "__name__", str(func))
        name = f"{getattr(func, 'namespace', 'unknown')}.{opname}"
        rule = rule_of(name)
        if rule == DROP:
            self.dropped += 1
            return
        if rule is None:
            if not tensors_in(out) and not tensors_in((args, kwargs)):
                return  # a metadata query of the dispatcher: no kernel
            self.unknown[name] = self.unknown.get(name, 0) + 1
            rule = "elementwise"
        try:
            cost = op_cost(name, rule, func, args, kwargs, out)
        except Exception as exc:  # keep the op: count it per element, note the failure
            self.formula_errors.setdefault(name, f"{type(exc).__name__}: {exc}".splitlines()[0])
            elements = max((t.numel() for t in tensors_in(out)), default=0)
            cost = OpCost(flop_weight(name) * elements)
        self.ops.append(
            RawOp(
                op=name,
                op_class=rule,
                phase=self.phase,
                dtype=compute_dtype(args, kwargs, out),
                flops=cost.flops,
                bytes=float(op_bytes(name, args, kwargs, out)),
                gemm=cost.gemm,
                groups=cost.groups,
                channels_last=self._is_channels_last(name, rule, args),
                shape=shape_text(args, kwargs),
            )
        )

    def _is_channels_last(self, name: str, rule: str, args: tuple) -> bool:
        if rule != "convolution":
            return False
        index = 1 if "backward" in name else 0
        if len(args) <= index or not isinstance(args[index], torch.Tensor):
            return False
        x = args[index]
        if x.dim() != 4:
            return False
        if self.channels_last:
            # Asked for: cuDNN keeps NHWC from conv to conv (the meta kernels do not).
            return True
        return x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()


def batch_bytes(batch: Any) -> int:
    return sum(span_bytes(t) for t in tensors_in(batch))
