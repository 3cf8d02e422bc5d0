"""Step time: compute at an efficiency, gradient communication, and the input pipeline.

compute_s = FLOPs executed / (GPUs x dense peak for the dtype x efficiency)

Efficiency is end-to-end: executed FLOPs (model FLOPs plus any recomputation) over
the dense peak. Defaults (`default_efficiency`) by architecture for large transformers
in bf16/fp16, never above the measured matmul ceiling of that architecture:

- ampere (A100): ceiling 0.869; default 0.50. Narayanan et al. 2021 (SC'21) reach
  52% of A100 peak; LLaMA-65B's 380 tokens/s/GPU (Touvron et al. 2023) is ~50%.
- hopper (H100, H200): ceiling 0.803; default 0.40. Llama 3 (Dubey et al. 2024,
  Table 4) reports 38-43% BF16 MFU on H100.
- blackwell (B200) 0.776, cdna3 (MI300X) 0.514, others 0.80 (assumed): 0.55 x ceiling.

0.55 is the ratio of the A100 default to its matmul ceiling, rounded. Models that are
not transformers (CNNs: many small, memory-bound layers) get half the transformer
figure. fp32 runs on CUDA cores, where the model is compute-bound: 0.70 of the fp32
peak. tf32: 0.9x the transformer figure. fp8 peaks are 2x bf16 but end-to-end gains are
nearer 1.3x: 0.65x the figure against the fp8 peak.

A matmul fraction measured by `cloudtrain bench` (achieved / peak for the dtype)
replaces the ceiling: efficiency = default x measured / ceiling, capped at measured.
`--efficiency` replaces everything.

Communication (ring collectives; bytes B, g GPUs per node, m nodes):
all-reduce 2·[(g-1)/g·B/link + (m-1)/m·B/network], all-gather and reduce-scatter half
that (hierarchical: inside the node over NVLink or PCIe, between nodes over the
instance network shared by the node's GPUs). DDP all-reduces the gradients once per
optimizer step, under the last micro-batch's backward; FSDP all-gathers the weights
twice (forward, backward) and reduce-scatters the gradients once per micro-batch, under
its compute. `overlap_fraction` of it can hide under compute; the rest is exposed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cloudtrain.catalog.types import GPUSpec, Offer
from cloudtrain.plan.assumptions import Assumptions
from cloudtrain.plan.memory import weight_bytes
from cloudtrain.plan.workload import Workload, hardware_flops_per_sample

if TYPE_CHECKING:
    from cloudtrain.plan.roofline import Roofline, StepBreakdown

MATMUL_CEILING = {"ampere": 0.869, "hopper": 0.803, "blackwell": 0.776, "cdna3": 0.514}
"""Best measured dense matmul throughput / peak (stas00/ml-engineering, compute/accelerator
'maximum achievable matmul FLOPS'): A100 86.9%, H100 80.3%, B200 77.6%, MI300X 51.4%."""
DEFAULT_CEILING = 0.80
TRANSFORMER_EFFICIENCY = {"ampere": 0.50, "hopper": 0.40}
CEILING_SHARE = 0.55
NON_TRANSFORMER_FACTOR = 0.5
FP32_EFFICIENCY = 0.70
TF32_FACTOR = 0.9
FP8_FACTOR = 0.65
PCIE_GB_PER_S = {3: 15.75, 4: 31.5, 5: 63.0, 6: 121.0}
"""Nominal PCIe x16 bandwidth per direction by generation (GB/s)."""


@dataclass(frozen=True)
class Efficiency:
    value: float
    """End-to-end share of the dense peak for the dtype (0..1)."""
    source: str
    """'default (...)', 'measured (...)' or 'override'."""


def compute_dtype(workload: Workload, gpu: GPUSpec) -> str | None:
    """The peak a workload's precision runs at (see `GPUSpec.runs_as`)."""
    return gpu.runs_as(workload.precision)


def matmul_ceiling(gpu: GPUSpec) -> float:
    return MATMUL_CEILING.get(gpu.architecture.lower(), DEFAULT_CEILING)


def default_efficiency(workload: Workload, gpu: GPUSpec, dtype: str) -> Efficiency:
    """The documented default for this GPU, workload class and dtype."""
    arch = gpu.architecture.lower()
    ceiling = matmul_ceiling(gpu)
    if dtype == "fp32":
        value, why = FP32_EFFICIENCY, "fp32 on CUDA cores"
    else:
        base = TRANSFORMER_EFFICIENCY.get(arch, round(CEILING_SHARE * ceiling, 3))
        why = f"{arch} transformer {base:.2f}"
        value = base
        if not workload.is_transformer:
            value *= NON_TRANSFORMER_FACTOR
            why += f" x {NON_TRANSFORMER_FACTOR} (not a transformer)"
        if dtype == "tf32":
            value *= TF32_FACTOR
            why += f" x {TF32_FACTOR} (tf32)"
        elif dtype == "fp8":
            value *= FP8_FACTOR
            why += f" x {FP8_FACTOR} (fp8)"
    value = min(value, ceiling)
    return Efficiency(round(value, 4), f"default ({why})")


def measured_efficiency(default: Efficiency, gpu: GPUSpec, measured_fraction: float) -> Efficiency:
    """Scale a default by a measured matmul fraction instead of the assumed ceiling."""
    value = min(default.value * measured_fraction / matmul_ceiling(gpu), measured_fraction)
    return Efficiency(
        round(value, 4), f"measured (matmul {measured_fraction:.0%} of peak by cloudtrain bench)"
    )


def link_gb_per_s(gpu: GPUSpec) -> float:
    """Per-direction GPU-to-GPU bandwidth inside a node (GB/s)."""
    if gpu.link_kind in ("nvlink", "infinity-fabric") and gpu.link_gbps_per_direction:
        return gpu.link_gbps_per_direction
    if gpu.link_kind == "pcie" and gpu.link_gbps_per_direction:
        return gpu.link_gbps_per_direction
    return PCIE_GB_PER_S.get(gpu.pcie_gen or 3, PCIE_GB_PER_S[3])


def collective_s(
    volume_bytes: float,
    passes: float,
    gpus_per_node: int,
    nodes: int,
    link_gb_per_s_: float,
    network_gb_per_s: float,
    efficiency: float,
) -> float:
    """Seconds of a ring collective: passes = 2 for all-reduce, 1 for all-gather or
    reduce-scatter (hierarchical inside / between nodes)."""
    seconds = 0.0
    if gpus_per_node > 1:
        share = (gpus_per_node - 1) / gpus_per_node
        seconds += share * volume_bytes / (link_gb_per_s_ * 1e9 * efficiency)
    if nodes > 1:
        share = (nodes - 1) / nodes
        seconds += share * volume_bytes / (network_gb_per_s * 1e9 * efficiency)
    return passes * seconds


@dataclass(frozen=True)
class StepTime:
    """Seconds of one optimizer step and what bounds it."""

    compute_s: float
    comm_s: float
    exposed_comm_s: float
    input_s: float
    """Seconds the CPUs need to prepare one global batch (0: not checked for this data)."""
    step_s: float
    bottleneck: str
    """'compute', 'communication' (exposed comm > 25% of the step) or 'input'."""
    breakdown: StepBreakdown | None = None
    """Where the compute time goes, for a traced model (None: FLOPs at an efficiency)."""


def network_gbps(offer: Offer, assumptions: Assumptions) -> float:
    return offer.network_gbps or assumptions.default_network_gbps


def step_time(
    workload: Workload,
    gpu: GPUSpec,
    offer: Offer,
    nodes: int,
    plan: tuple[str, bool, int, int],
    peak_tflops: float,
    efficiency: float,
    assumptions: Assumptions,
    cpu_samples_per_s_per_vcpu: float | None,
    roofline: Roofline | None = None,
) -> StepTime:
    """Step time of `plan` = (sharding, recompute, micro_batch, accumulation_steps);
    with a `roofline` (traced model) compute is priced op by op instead of by FLOPs at
    `efficiency`."""
    sharding, recompute, micro, accumulation = plan
    gpus_per_node = offer.gpu_count
    gpus = gpus_per_node * nodes
    breakdown = None
    if roofline is not None:
        breakdown = roofline.step(gpu, micro, accumulation, recompute=recompute)
        compute_s = breakdown.step_s
    else:
        flops = hardware_flops_per_sample(workload, recompute=recompute) * micro * accumulation
        compute_s = flops / (peak_tflops * 1e12 * efficiency)
    comm_s, window_s = _communication(
        workload, gpu, offer, nodes, sharding, accumulation, assumptions
    )
    window_s *= compute_s
    hidden_s = min(assumptions.overlap_fraction * comm_s, window_s) if gpus > 1 else 0.0
    exposed_s = comm_s - hidden_s
    gpu_step_s = compute_s + exposed_s
    input_s = 0.0
    if cpu_samples_per_s_per_vcpu:
        usable_vcpus = max(1, offer.vcpus - gpus_per_node) * nodes
        input_s = micro * accumulation * gpus / (usable_vcpus * cpu_samples_per_s_per_vcpu)
    step_s = max(gpu_step_s, input_s)
    if input_s > gpu_step_s:
        bottleneck = "input"
    elif exposed_s > 0.25 * step_s:
        bottleneck = "communication"
    else:
        bottleneck = "compute"
    return StepTime(compute_s, comm_s, exposed_s, input_s, step_s, bottleneck, breakdown)


def _communication(
    workload: Workload,
    gpu: GPUSpec,
    offer: Offer,
    nodes: int,
    sharding: str,
    accumulation: int,
    assumptions: Assumptions,
) -> tuple[float, float]:
    """(communication seconds per step, share of the compute it can hide under)."""
    if offer.gpu_count * nodes == 1:
        return 0.0, 0.0
    link = link_gb_per_s(gpu)
    network = network_gbps(offer, assumptions) / 8.0
    args = (offer.gpu_count, nodes, link, network, assumptions.comm_efficiency)
    grads = workload.parameters * assumptions.grad_reduce_bytes
    if sharding == "fsdp":
        weights = workload.parameters * weight_bytes(workload.precision)
        per_micro = 2 * collective_s(weights, 1, *args) + collective_s(grads, 1, *args)
        return per_micro * accumulation, 1.0
    backward_share = (2.0 / 3.0) / accumulation
    return collective_s(grads, 2, *args), backward_share
