"""Step time from a model's traced ops: a roofline per op on the target GPU.

Each op costs

    max(FLOPs / (dense peak for its dtype x compute fraction),
        bytes / (memory bandwidth x bandwidth fraction)) + launch overhead

with the fractions and overhead of its kernel kind looked up in the achievable-rates
table (`cloudtrain.catalog.rates`): matmul, convolution (dense, grouped, depthwise; NCHW
or channels_last), attention, elementwise, reduction/normalisation, data movement,
optimizer. The GPU runs the ops one after another on one stream; the host dispatches
them in eager mode at `host` µs per op, asynchronously, so a micro-step takes
max(GPU time, host time). The optimizer step is added once per optimizer step.

Precision, as PyTorch does it:
- 'fp32' is PyTorch's defaults: matmuls in full fp32
  (`torch.backends.cuda.matmul.allow_tf32` is False) and convolutions in TF32
  (`torch.backends.cudnn.allow_tf32` is True);
- 'tf32' is both in TF32 (`torch.set_float32_matmul_precision("high")`);
- 'bf16'/'fp16' are autocast: the trace already holds which ops ran in 16 bits and
  the casts autocast inserts.
`StepOptions(tf32_matmul=..., tf32_conv=...)` sets either explicitly.

`torch.compile` (assumed: Inductor, default mode, no CUDA graphs): GEMMs, convolutions
and attention stay library kernels; chains of elementwise, reduction and data-movement
ops fuse, which keeps COMPILE_TRAFFIC_KEPT of their memory traffic and
COMPILE_LAUNCHES_KEPT of their launches (and host dispatches). Both are fitted to
the GPT-2 calibration on an H200 (bf16 + fused AdamW, eager 0.0428 s vs compiled
0.0326 s per step of 16 x 1024 tokens).

The optimizer step streams the parameters and states once per pass: a fused
optimizer makes one pass (AdamW: read weights, gradients and both moments, write
three: 28 bytes per fp32 parameter); the foreach and for-loop implementations make one
pass per arithmetic op (see OPTIMIZER_PASSES); the for-loop one launches each op per
parameter tensor, foreach per chunk of FOREACH_CHUNK tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from cloudtrain.catalog.rates import KERNELS, RateTable
from cloudtrain.catalog.types import AchievableRate, GPUSpec
from cloudtrain.plan.learned import Correction
from cloudtrain.plan.profile import ModelProfile, OpRecord

OPTIMIZER_IMPLS = ("fused", "foreach", "plain")
COMPILE_TRAFFIC_KEPT = 0.45
COMPILE_LAUNCHES_KEPT = 0.25
TOP_OPS = 8
"""Ops a breakdown lists by name (the most expensive)."""
FOREACH_CHUNK = 48
"""Tensors one foreach kernel takes (PyTorch's multi_tensor_apply: 24-110 by depth)."""


@dataclass(frozen=True)
class OptimizerPasses:
    fused_bytes: float
    """Bytes per parameter of the single fused pass (fp32 states)."""
    pass_bytes: float
    """Bytes per parameter of all the passes of a foreach or for-loop step."""
    ops: int
    """Arithmetic ops per step of a foreach or for-loop implementation."""


OPTIMIZER_PASSES = {
    # AdamW foreach: step, lerp_(m), mul_(v), addcmul_(v), sqrt, div_, add_(eps),
    # addcdiv_(p), mul_(p, 1 - lr·wd): ~9 ops, ~84 bytes per parameter in all.
    "adamw": OptimizerPasses(28.0, 84.0, 9),
    "adam": OptimizerPasses(28.0, 76.0, 8),
    # SGD with momentum (and Nesterov): mul_(buf), add_(buf, g), add(g, buf), add_(p): 4.
    "sgd": OptimizerPasses(20.0, 44.0, 4),
    "lion": OptimizerPasses(20.0, 48.0, 5),
    "adafactor": OptimizerPasses(16.0, 64.0, 10),
    "adamw8bit": OptimizerPasses(16.0, 16.0, 1),
}


@dataclass(frozen=True)
class StepOptions:
    """How the step runs, beyond what the trace holds."""

    compile: bool = False
    optimizer: str = "adamw"
    optimizer_impl: str = "foreach"
    """'fused', 'foreach' (PyTorch's default on CUDA) or 'plain' (a for-loop)."""
    tf32_matmul: bool | None = None
    """None: from the precision (True only for 'tf32')."""
    tf32_conv: bool | None = None
    """None: from the precision (True for 'fp32' and 'tf32', PyTorch's cuDNN default)."""

    def __post_init__(self) -> None:
        if self.optimizer_impl not in OPTIMIZER_IMPLS:
            raise ValueError(f"optimizer_impl must be one of {OPTIMIZER_IMPLS}")


@dataclass(frozen=True)
class OpCost:
    """One profiled op on one GPU: seconds for all its occurrences in a micro-step."""

    op: str
    op_class: str
    kernel: str
    phase: str
    count: float
    seconds: float
    bound: str
    """'compute', 'memory' or 'launch' (the fixed overhead is the largest part)."""
    flops: float
    bytes: float
    shape: str


@dataclass(frozen=True)
class StepBreakdown:
    """Seconds of one optimizer step on one GPU (accumulation x micro-steps + update)."""

    step_s: float
    gpu_s: float
    """GPU busy time of the forward and backward passes (all micro-steps)."""
    host_s: float
    """Host dispatch time of the same (eager mode)."""
    optimizer_s: float
    by_class_s: dict[str, float]
    """GPU seconds per op class (the optimizer as 'optimizer'; times the correction)."""
    top_ops: list[OpCost]
    """The most expensive ops over the whole step, most expensive first."""
    rates_used: dict[str, dict[str, str]]
    """'kernel dtype' -> the op class, the rate row it used, the row's source and date."""
    flops: float
    """FLOPs executed (all micro-steps, incl. recomputation)."""
    notes: list[str] = field(default_factory=list)

    @property
    def host_bound(self) -> bool:
        return self.host_s > self.gpu_s


def kernel_of(op: OpRecord) -> str:
    """The rate kind of an op: convolutions split by groups; the rest by class."""
    if op.op_class == "convolution":
        if op.groups > 1 and op.gemm is not None and op.gemm[1].at(1) <= 1.0:
            return "conv_depthwise"
        return "conv_grouped" if op.groups > 1 else "conv"
    return op.op_class if op.op_class in KERNELS else "elementwise"


def rate_dtype(op: OpRecord, kernel: str, precision: str, options: StepOptions) -> str:
    """The peak an op runs against: 16-bit ops their dtype; fp32 GEMMs and convolutions
    TF32 when PyTorch allows it; other fp32 ops the fp32 (CUDA core) rate."""
    if op.dtype in ("bf16", "fp16"):
        return op.dtype
    if kernel == "matmul":
        tf32 = options.tf32_matmul if options.tf32_matmul is not None else precision == "tf32"
        return "tf32" if tf32 else "fp32"
    if kernel.startswith("conv"):
        tf32 = options.tf32_conv if options.tf32_conv is not None else precision in ("fp32", "tf32")
        return "tf32" if tf32 else "fp32"
    return "fp32"


def _peak_flops(gpu: GPUSpec, dtype: str) -> float:
    peak = gpu.op_peak_tflops(dtype)
    if not peak:
        raise ValueError(f"{gpu.name} has no fp32 peak in the catalog")
    return peak * 1e12


def _transfer_s(nbytes: float, gpu: GPUSpec, rate: AchievableRate) -> float:
    """Seconds to move `nbytes` through device memory at the rate's share of its bandwidth."""
    if not nbytes:
        return 0.0
    achieved = gpu.memory_bandwidth_gbps * 1e9 * rate.bandwidth_fraction
    return nbytes / achieved if achieved else math.inf


class Roofline:
    """Prices a profile's ops on any GPU (cached per GPU and batch: a Roofline is for one
    set of options and one correction)."""

    def __init__(
        self,
        profile: ModelProfile,
        rates: RateTable,
        options: StepOptions,
        correction: Correction | None = None,
    ) -> None:
        self.profile = profile
        self.rates = rates
        self.options = options
        self.correction = correction
        """Measured / predicted from real runs of this model (plan/learned.py)."""
        self._cache: dict[tuple, tuple[float, float, float, dict[str, float], list[OpCost]]] = {}
        self._steps: dict[tuple, StepBreakdown] = {}
        self._rates_used: dict[str, dict[str, dict[str, str]]] = {}

    def _rate(self, gpu: GPUSpec, op: OpRecord, kernel: str) -> tuple[str, AchievableRate]:
        dtype = rate_dtype(op, kernel, self.profile.precision, self.options)
        layout = "any"
        if kernel.startswith("conv"):
            layout = "nhwc" if op.channels_last else "nchw"
        return dtype, self.rates.lookup(gpu, kernel, dtype, layout)

    def op_cost(self, gpu: GPUSpec, op: OpRecord, batch: float) -> OpCost:
        kernel = kernel_of(op)
        dtype, rate = self._rate(gpu, op, kernel)
        flops, nbytes = max(0.0, op.flops.at(batch)), max(0.0, op.bytes.at(batch))
        count = float(op.count)
        fusible = kernel in ("elementwise", "reduction", "data_movement")
        if self.options.compile and fusible:
            # Fewer, larger kernels: the same FLOPs, less traffic, fewer launches.
            count *= COMPILE_LAUNCHES_KEPT
            flops /= COMPILE_LAUNCHES_KEPT
            nbytes *= COMPILE_TRAFFIC_KEPT / COMPILE_LAUNCHES_KEPT
        compute_s = 0.0
        if flops:
            rate_flops = _peak_flops(gpu, dtype) * rate.compute_fraction
            compute_s = flops / rate_flops if rate_flops else math.inf
        memory_s = _transfer_s(nbytes, gpu, rate)
        launch_s = rate.overhead_us * 1e-6
        busy = max(compute_s, memory_s)
        bound = "launch" if launch_s > busy else ("compute" if compute_s >= memory_s else "memory")
        return OpCost(
            op.op, op.op_class, kernel, op.phase, count, count * (busy + launch_s), bound,
            flops * count, nbytes * count, op.shape,
        )  # fmt: skip

    def micro_step(
        self, gpu: GPUSpec, batch: float, *, recompute: bool = False
    ) -> tuple[float, float, float, dict[str, float], list[OpCost]]:
        """(GPU s, host s, FLOPs, GPU s by class, op costs) of one forward + backward."""
        key = (gpu.name, batch, recompute)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        host_rate = self.rates.lookup(gpu, "host", "any")
        gpu_s = host_s = flops = 0.0
        by_class: dict[str, float] = {}
        costs = []
        for op in self.profile.ops:
            cost = self.op_cost(gpu, op, batch)
            repeats = 2 if recompute and op.phase == "forward" else 1
            gpu_s += cost.seconds * repeats
            host_s += cost.count * repeats * host_rate.overhead_us * 1e-6
            flops += cost.flops * repeats
            by_class[op.op_class] = by_class.get(op.op_class, 0.0) + cost.seconds * repeats
            costs.append(cost)
        result = (gpu_s, host_s, flops, by_class, costs)
        self._cache[key] = result
        return result

    def optimizer_step(self, gpu: GPUSpec) -> tuple[float, float]:
        """(GPU s, host s) of one optimizer step over the trainable parameters."""
        passes = OPTIMIZER_PASSES[self.options.optimizer]
        rate = self.rates.lookup(gpu, "optimizer", "fp32")
        host_us = self.rates.lookup(gpu, "host", "any").overhead_us
        tensors = max(1, self.profile.parameter_tensors)
        impl = self.options.optimizer_impl
        if impl == "fused":
            per_param, launches = passes.fused_bytes, math.ceil(tensors / FOREACH_CHUNK)
            host_ops = 1 + launches / 4
        elif impl == "foreach":
            per_param = passes.pass_bytes
            launches = passes.ops * math.ceil(tensors / FOREACH_CHUNK)
            host_ops = passes.ops * 2
        else:
            per_param, launches = passes.pass_bytes, passes.ops * tensors
            host_ops = launches
        gpu_s = _transfer_s(per_param * self.profile.parameters, gpu, rate)
        gpu_s += launches * rate.overhead_us * 1e-6
        return gpu_s, host_ops * host_us * 1e-6

    def step(
        self, gpu: GPUSpec, micro_batch: int, accumulation: int = 1, *, recompute: bool = False
    ) -> StepBreakdown:
        """One optimizer step of `accumulation` micro-batches of `micro_batch` on one GPU."""
        key = (gpu.name, micro_batch, accumulation, recompute)
        found = self._steps.get(key)
        if found is None:
            found = self._steps[key] = self._step(gpu, micro_batch, accumulation, recompute)
        return found

    def _step(
        self, gpu: GPUSpec, micro_batch: int, accumulation: int, recompute: bool
    ) -> StepBreakdown:
        gpu_s, host_s, flops, by_class, costs = self.micro_step(
            gpu, micro_batch, recompute=recompute
        )
        opt_gpu_s, opt_host_s = self.optimizer_step(gpu)
        opt_s = max(opt_gpu_s, opt_host_s)
        factor = self.correction.factor if self.correction is not None else 1.0
        step_s = (accumulation * max(gpu_s, host_s) + opt_s) * factor
        classes = {name: seconds * accumulation * factor for name, seconds in by_class.items()}
        classes["optimizer"] = classes.get("optimizer", 0.0) + opt_gpu_s * factor
        scale = accumulation * factor
        top = [
            replace(c, seconds=c.seconds * scale, count=c.count * accumulation)
            for c in sorted(costs, key=lambda c: c.seconds, reverse=True)[:TOP_OPS]
        ]
        notes = []
        if host_s > gpu_s:
            notes.append(
                f"host-bound: eager dispatch of the ops takes {host_s * 1e3:.3g} ms per "
                f"micro-step, the GPU {gpu_s * 1e3:.3g} ms (torch.compile or a larger "
                "micro-batch helps)"
            )
        if self.correction is not None:
            notes.append(f"corrected {self.correction.label}")
        return StepBreakdown(
            step_s=step_s,
            gpu_s=gpu_s * accumulation,
            host_s=host_s * accumulation,
            optimizer_s=opt_s,
            by_class_s=classes,
            top_ops=top,
            rates_used=self.rates_used(gpu),
            flops=flops * accumulation,
            notes=notes,
        )

    def rates_used(self, gpu: GPUSpec) -> dict[str, dict[str, str]]:
        """'kernel dtype' -> the op class, rate row, source and date it uses on `gpu`."""
        if gpu.name not in self._rates_used:
            self._rates_used[gpu.name] = self._find_rates_used(gpu)
        return self._rates_used[gpu.name]

    def _find_rates_used(self, gpu: GPUSpec) -> dict[str, dict[str, str]]:
        used: dict[tuple[str, str], tuple[str, AchievableRate]] = {}
        for op in self.profile.ops:
            kernel = kernel_of(op)
            dtype, rate = self._rate(gpu, op, kernel)
            used.setdefault((kernel, dtype), (op.op_class, rate))
        used["optimizer", "fp32"] = ("optimizer", self.rates.lookup(gpu, "optimizer", "fp32"))
        used["host", "any"] = ("host", self.rates.lookup(gpu, "host", "any"))
        return {
            f"{kernel} {dtype}": {"class": op_class, "row": rate.row, "source": rate.source,
                                  "as_of": rate.as_of}
            for (kernel, dtype), (op_class, rate) in used.items()
        }  # fmt: skip
