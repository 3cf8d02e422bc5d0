"""A model's training step as plain data: every operation with its FLOPs, bytes and
shape, linear in the micro-batch. `cloudtrain.profiling.profile_model` makes one from a
real model (it needs torch); the planner reads it without torch.

Every quantity that depends on the batch is an `Affine`: its value at micro-batch B is
`fixed + per_sample * B`. The tracer runs the step at two batch sizes and solves for
both parts, so weights (read once whatever the batch) and activations (read per
sample) are told apart, and so are the GEMM dimensions that grow with the batch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

OP_CLASSES = (
    "matmul",
    "convolution",
    "attention",
    "elementwise",
    "reduction",
    "data_movement",
    "optimizer",
)
"""What an op is, for the cost model: GEMMs (mm, addmm, bmm, linear and their
backward), convolutions (any groups; depthwise ones are told apart by `groups`), fused
attention kernels, pointwise math, reductions and normalisations (sum, mean, softmax,
layer/batch/group norm, losses), data movement (copy, cast, cat, index, gather, pad,
embedding lookups), and the optimizer step (added by the planner from the
parameters, not traced)."""

PHASES = ("forward", "backward", "optimizer")
PROFILE_VERSION = 1


@dataclass(frozen=True)
class Affine:
    """A quantity at micro-batch B: `fixed + per_sample * B`."""

    fixed: float
    per_sample: float

    def at(self, batch: float) -> float:
        return self.fixed + self.per_sample * batch

    def scaled(self, factor: float) -> Affine:
        return Affine(self.fixed * factor, self.per_sample * factor)

    @classmethod
    def through(cls, batch_a: float, value_a: float, batch_b: float, value_b: float) -> Affine:
        """The line through two measurements (batch_a != batch_b)."""
        slope = (value_b - value_a) / (batch_b - batch_a)
        return cls(value_a - slope * batch_a, slope)


@dataclass(frozen=True)
class OpRecord:
    """One kind of operation of the step (the same op at the same shapes, `count` times)."""

    op: str
    """ATen name without the overload, e.g. 'aten.convolution_backward'."""
    op_class: str
    """One of OP_CLASSES."""
    phase: str
    """'forward' or 'backward'."""
    dtype: str
    """Compute dtype: 'fp32', 'bf16', 'fp16' (or 'int' for integer-only ops)."""
    count: int
    """Occurrences per step (per micro-batch)."""
    flops: Affine
    """FLOPs of one occurrence (multiply and add counted apart)."""
    bytes: Affine
    """Bytes read plus bytes written by one occurrence, from shapes and dtypes."""
    gemm: tuple[Affine, Affine, Affine] | None = None
    """(M, N, K) of the GEMM, or of the implicit GEMM of a convolution
    (M = N·H_out·W_out, N = C_out / groups, K = C_in / groups · k_h · k_w, per group);
    for attention (M = queries, N = keys, K = head size) per batch x head. None for
    ops that are not GEMM-like."""
    groups: int = 1
    """Convolution groups (depthwise: groups == channels); batch x heads for attention."""
    channels_last: bool = False
    """Convolutions: the input was in channels_last (NHWC) memory format."""
    shape: str = ""
    """The input shapes at the traced batch, for display."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OpRecord:
        values = dict(data)
        values["flops"] = Affine(*_pair(values["flops"]))
        values["bytes"] = Affine(*_pair(values["bytes"]))
        if values.get("gemm") is not None:
            values["gemm"] = tuple(Affine(*_pair(d)) for d in values["gemm"])
        return cls(**values)


def _pair(value: Any) -> tuple[float, float]:
    if isinstance(value, dict):
        return float(value["fixed"]), float(value["per_sample"])
    fixed, per_sample = value
    return float(fixed), float(per_sample)


@dataclass(frozen=True)
class ModelProfile:
    """One training step of a model, traced: per-op costs, parameters, activation memory."""

    name: str
    fingerprint: str
    """Stable hash of the model's structure (module types, parameter names, shapes and
    dtypes) and the traced input's shape; equal models give equal fingerprints."""
    precision: str
    """The precision traced: 'fp32' (PyTorch defaults), 'tf32', 'bf16' or 'fp16'
    (autocast)."""
    channels_last: bool
    parameters: int
    """Trainable parameters."""
    parameter_tensors: int
    """Trainable parameter tensors (what a non-fused optimizer launches kernels over)."""
    frozen_parameters: int
    """Parameters without gradients (weights, no gradients or optimizer states)."""
    ops: tuple[OpRecord, ...]
    activation_bytes: Affine
    """Peak bytes live during the step beyond the parameters, gradients and optimizer
    states (what the micro-batch adds), at the traced precision."""
    tokens_per_sample: int | None = None
    """Sequence length when the batch is token ids (None for images and others)."""
    sample_shape: tuple[int, ...] = ()
    """Shape of one sample of the model's first input."""
    traced_on: str = "meta"
    """'meta', 'fake-cuda' or 'cpu': where the trace ran."""
    traced_batches: tuple[int, int] = (1, 2)
    notes: tuple[str, ...] = ()
    """What the tracer could not count exactly (ops without a FLOP formula, ...)."""
    version: int = PROFILE_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def flops(self, batch: float, op_class: str | None = None) -> float:
        """Training FLOPs of one micro-batch (of one class, when given)."""
        return sum(
            op.flops.at(batch) * op.count
            for op in self.ops
            if op_class is None or op.op_class == op_class
        )

    def flops_per_sample(self) -> float:
        """FLOPs of one sample at a large batch (the per-sample parts)."""
        return sum(op.flops.per_sample * op.count for op in self.ops)

    def forward_flops_per_sample(self) -> float:
        return sum(op.flops.per_sample * op.count for op in self.ops if op.phase == "forward")

    def by_class(self, batch: float) -> dict[str, float]:
        """FLOPs per op class at `batch`."""
        totals: dict[str, float] = {}
        for op in self.ops:
            totals[op.op_class] = totals.get(op.op_class, 0.0) + op.flops.at(batch) * op.count
        return totals

    def summary(self) -> dict[str, Any]:
        """What a plan shows of the profile (not its op list)."""
        return {
            "name": self.name, "fingerprint": self.fingerprint, "precision": self.precision,
            "channels_last": self.channels_last, "parameters": self.parameters,
            "ops": len(self.ops), "traced_on": self.traced_on,
            "flops_per_sample": self.flops_per_sample(),
            "activation_bytes_per_sample": self.activation_bytes.per_sample,
            "notes": list(self.notes),
        }  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ops"] = [op.as_dict() for op in self.ops]
        return data

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelProfile:
        values = dict(data)
        if values.get("version") != PROFILE_VERSION:
            raise ValueError(
                f"model profile version {values.get('version')} is not {PROFILE_VERSION}"
            )
        values["ops"] = tuple(OpRecord.from_dict(op) for op in values["ops"])
        values["activation_bytes"] = Affine(*_pair(values["activation_bytes"]))
        values["sample_shape"] = tuple(values.get("sample_shape", ()))
        values["traced_batches"] = tuple(values.get("traced_batches", (1, 2)))
        values["notes"] = tuple(values.get("notes", ()))
        return cls(**values)

    @classmethod
    def from_json(cls, text: str) -> ModelProfile:
        return cls.from_dict(json.loads(text))


def merge_ops(ops: Iterable[OpRecord]) -> tuple[OpRecord, ...]:
    """Ops with equal (op, class, phase, dtype, costs, shape) folded into one with a count;
    first-seen order is kept."""
    merged: dict[tuple, OpRecord] = {}
    for op in ops:
        key = (op.op, op.op_class, op.phase, op.dtype, op.flops, op.bytes, op.gemm,
               op.groups, op.channels_last, op.shape)  # fmt: skip
        seen = merged.get(key)
        merged[key] = op if seen is None else _with_count(seen, seen.count + op.count)
    return tuple(merged.values())


def _with_count(op: OpRecord, count: int) -> OpRecord:
    from dataclasses import replace

    return replace(op, count=count)
