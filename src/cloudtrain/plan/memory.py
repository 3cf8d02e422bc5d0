"""Memory per GPU: model states, activations, overhead; the largest micro-batch that fits.

Model states, bytes per parameter (ZeRO, Rajbhandari et al. 2020, §3): mixed precision
(bf16/fp16/fp8) keeps 16-bit weights (2) and gradients (2) plus fp32 master weights (4)
and the optimizer's fp32 states (AdamW: 8), 16 in all; fp32/tf32 keep fp32 weights and
gradients (4 + 4) plus the optimizer's states. FSDP (full sharding) divides the states
by the number of GPUs.

Activations per sample of one transformer layer at 16-bit (Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", eq. 1, b = 1):

    s·h·(34 + 5·a·s/h)  bytes

s sequence length, h hidden size, a heads. Fused (flash) attention keeps no s x s score
matrix, which removes the 5·a·s/h term. With full recomputation only each layer's input
is kept (2·s·h bytes per layer) plus one layer's activations while it is recomputed.
fp32/tf32 doubles activations. Logits for the loss add 4·s·V bytes (fp32) when the
vocabulary V is known. A model that is not a transformer gives its activations per
sample; checkpointing is assumed to keep a quarter of them. A traced model
(`Workload.profile`) uses the traced peak of live tensors per sample, at the traced
precision, and adds the part that does not grow with the batch (autocast's 16-bit
weight copies, workspaces) to the overhead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cloudtrain.plan.workload import Workload

GIB = 1024**3
USABLE_MEMORY_FRACTION = 0.90
"""A plan fits when it needs at most this share of the GPU's memory (the rest absorbs
allocator fragmentation and peaks the model does not see)."""
FRAMEWORK_OVERHEAD_GIB = 1.5
"""CUDA context, cuBLAS/cuDNN workspaces, NCCL and DDP bucket buffers per GPU."""
CHECKPOINTED_ACTIVATION_SHARE = 0.25
"""Share of a non-transformer's activations kept under checkpointing (block inputs)."""

OPTIMIZER_STATE_BYTES = {
    "adamw": 8.0,
    "adam": 8.0,
    "sgd": 4.0,
    "lion": 4.0,
    "adafactor": 0.0,
    "adamw8bit": 2.0,
}
"""fp32 optimizer states per parameter: Adam(W) two moments; SGD (with momentum) and Lion
one; Adafactor's factored second moment is O(rows + cols) and counted as 0; 8-bit Adam
two 1-byte moments."""


def is_mixed(precision: str) -> bool:
    """16/8-bit compute with fp32 master weights."""
    return precision in ("bf16", "fp16", "fp8")


def weight_bytes(precision: str) -> float:
    """Bytes per parameter of the weights the GPUs compute with (also what FSDP gathers)."""
    return 2.0 if is_mixed(precision) else 4.0


def state_bytes_per_parameter(precision: str, optimizer: str) -> float:
    """Weights + gradients + master weights + optimizer states, bytes per parameter."""
    optimizer_bytes = OPTIMIZER_STATE_BYTES[optimizer]
    if is_mixed(precision):
        return 2.0 + 2.0 + 4.0 + optimizer_bytes
    return 4.0 + 4.0 + optimizer_bytes


def checkpoint_bytes(workload: Workload) -> float:
    """Bytes of one training checkpoint: fp32 weights plus optimizer states."""
    return workload.parameters * (4.0 + OPTIMIZER_STATE_BYTES[workload.optimizer])


def _layer_activation_bytes(workload: Workload) -> float:
    s, h, a = float(workload.seq_len), float(workload.hidden_size), float(workload.heads)  # type: ignore[arg-type]
    per_token = 34.0 if workload.flash_attention else 34.0 + 5.0 * a * s / h
    return s * h * per_token


def activation_bytes_per_sample(workload: Workload, *, recompute: bool) -> float:
    """Activation memory of one sample on one GPU (see the module docstring)."""
    if workload.profile is not None:
        traced = max(0.0, workload.profile.activation_bytes.per_sample)
        return traced * (CHECKPOINTED_ACTIVATION_SHARE if recompute else 1.0)
    scale = 1.0 if is_mixed(workload.precision) else 2.0
    if not workload.is_transformer:
        base = float(workload.activation_bytes_per_sample or 0.0)
        return scale * base * (CHECKPOINTED_ACTIVATION_SHARE if recompute else 1.0)
    layer = _layer_activation_bytes(workload)
    layers = float(workload.layers)  # type: ignore[arg-type]
    if recompute:
        s_h = float(workload.seq_len * workload.hidden_size)  # type: ignore[operator]
        body = 2.0 * s_h * layers + layer
    else:
        body = layer * layers
    logits = 4.0 * float(workload.seq_len * workload.vocab_size) if workload.vocab_size else 0.0  # type: ignore[operator]
    return scale * body + logits


def _traced_fixed_bytes(workload: Workload) -> float:
    """What a traced step keeps live whatever the batch, and the frozen weights."""
    profile = workload.profile
    if profile is None:
        return 0.0
    frozen = profile.frozen_parameters * weight_bytes(workload.precision)
    return max(0.0, profile.activation_bytes.fixed) + frozen


def _fsdp_buffer_bytes(workload: Workload) -> float:
    """Unsharded parameters of two layers in flight (current + prefetched) and their
    fp32 gradients before the reduce-scatter."""
    layers = workload.layers or 10
    per_layer = (workload.parameters - workload.embedding_parameters) / layers
    return 2.0 * per_layer * (weight_bytes(workload.precision) + 4.0)


@dataclass(frozen=True)
class MemoryFit:
    """Memory of one way to run the workload on one GPU type (per GPU, GiB)."""

    sharding: str
    """'ddp' (replicated states) or 'fsdp' (states sharded over all GPUs)."""
    activation_checkpointing: bool
    states_gib: float
    overhead_gib: float
    activations_gib_per_sample: float
    usable_gib: float
    max_micro_batch: int
    """Largest micro-batch that fits; 0: not even one sample fits."""

    def total_gib(self, micro_batch: int) -> float:
        return self.states_gib + self.overhead_gib + micro_batch * self.activations_gib_per_sample


def memory_fit(
    workload: Workload,
    memory_gib: float,
    gpus: int,
    sharding: str,
    recompute: bool,
    *,
    usable_fraction: float = USABLE_MEMORY_FRACTION,
) -> MemoryFit:
    """Memory per GPU running `workload` on `gpus` GPUs of `memory_gib` each."""
    shards = gpus if sharding == "fsdp" else 1
    states = workload.parameters * state_bytes_per_parameter(workload.precision, workload.optimizer)
    overhead = FRAMEWORK_OVERHEAD_GIB * GIB + _traced_fixed_bytes(workload)
    if sharding == "fsdp":
        overhead += _fsdp_buffer_bytes(workload)
    activations = activation_bytes_per_sample(workload, recompute=recompute)
    usable = memory_gib * usable_fraction * GIB
    room = usable - states / shards - overhead
    largest = max(0, math.floor(room / activations)) if activations > 0 else 1 << 20
    return MemoryFit(
        sharding=sharding,
        activation_checkpointing=recompute,
        states_gib=states / shards / GIB,
        overhead_gib=overhead / GIB,
        activations_gib_per_sample=activations / GIB,
        usable_gib=usable / GIB,
        max_micro_batch=int(largest),
    )


def memory_options(workload: Workload, memory_gib: float, gpus: int) -> list[MemoryFit]:
    """Every allowed (sharding, checkpointing) pair, fitting or not; the workload's own
    choices narrow the set. FSDP is considered only on more than one GPU."""
    shardings = [workload.sharding] if workload.sharding else ["ddp", "fsdp"]
    if workload.sharding is None and gpus == 1:
        shardings = ["ddp"]
    forced = workload.activation_checkpointing
    recomputes = [forced] if forced is not None else [False, True]
    return [
        memory_fit(workload, memory_gib, gpus, sharding, recompute)
        for sharding in shardings
        for recompute in recomputes
    ]


@dataclass(frozen=True)
class BatchSplit:
    """How the global batch is cut: micro-batch per GPU x accumulation steps x GPUs."""

    micro_batch: int
    accumulation_steps: int
    global_batch: int
    """Effective global batch (>= the requested one; equal when it divides evenly)."""


def split_batch(
    global_batch: int, gpus: int, max_micro_batch: int, *, exact: bool = False
) -> BatchSplit | None:
    """The fewest accumulation steps that reach `global_batch`, with the smallest
    micro-batch for that (`exact`: micro-batch `max_micro_batch` itself); None when one
    sample does not fit or there are more GPUs than samples in the batch."""
    if max_micro_batch < 1 or global_batch < gpus:
        return None
    per_gpu = math.ceil(global_batch / gpus)
    accumulation = math.ceil(per_gpu / max_micro_batch)
    micro = max_micro_batch if exact else math.ceil(per_gpu / accumulation)
    return BatchSplit(micro, accumulation, micro * accumulation * gpus)
