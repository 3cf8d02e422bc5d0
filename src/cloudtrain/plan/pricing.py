"""From a fitted candidate and a billing model to a priced `Estimate`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cloudtrain.catalog.query import offer_price
from cloudtrain.catalog.types import Catalog, GPUSpec, Offer
from cloudtrain.plan.assumptions import Assumptions
from cloudtrain.plan.cost import Timeline, energy_kwh
from cloudtrain.plan.memory import BatchSplit, MemoryFit
from cloudtrain.plan.perf import Efficiency, StepTime
from cloudtrain.plan.result import Estimate
from cloudtrain.plan.roofline import StepBreakdown

if TYPE_CHECKING:
    from cloudtrain.plan.search import _Context


@dataclass(frozen=True)
class Candidate:
    """An offer at a node count with the fastest memory layout that fits."""

    offer: Offer
    gpu: GPUSpec
    nodes: int
    memory: MemoryFit
    split: BatchSplit
    step: StepTime
    dtype: str
    efficiency: Efficiency
    requires: tuple[str, ...]
    pue: float
    gco2e_per_kwh: float


def hourly_usd(offer: Offer, pricing: str) -> float:
    """Price of one instance per hour under `pricing` (which the offer must have)."""
    price = offer_price(offer, pricing)
    if price is None:
        raise ValueError(f"{offer.instance_type} has no {pricing} price")
    return price


def site_factors(catalog: Catalog, offer: Offer, assumptions: Assumptions) -> tuple[float, float]:
    """(PUE, gCO2e/kWh) where `offer` runs: the region's intensity, else its country's,
    else the world's, else the documented default."""
    from cloudtrain.catalog import lookup

    pue = catalog.pue_for(offer.provider)
    intensity = catalog.carbon_intensity(offer.provider, offer.region)
    if intensity is None:
        intensity = lookup.grid_intensity(catalog, "WORLD") or assumptions.default_gco2e_per_kwh
    return pue, intensity


def price_estimate(
    candidate: Candidate, pricing: str, steps: int, times: Timeline, context: _Context
) -> Estimate:
    """The full estimate of `candidate` at `pricing` over `times`."""
    offer, gpu, nodes = candidate.offer, candidate.gpu, candidate.nodes
    a = context.assumptions
    gpus = offer.gpu_count * nodes
    price = hourly_usd(offer, pricing) * nodes
    hours = times.total_s / 3600.0
    cost_usd = price * hours
    pue, intensity = candidate.pue, candidate.gco2e_per_kwh
    kwh = energy_kwh(gpus, gpu.tdp_w, (times.total_s - times.provision_s) / 3600.0, pue, a)
    step = candidate.step
    split = candidate.split
    samples_per_s = split.global_batch / step.step_s
    seq_len = context.workload.seq_len
    peak = gpu.peak_tflops(candidate.dtype) or 0.0
    memory = candidate.memory
    return Estimate(
        provider=offer.provider,
        region=offer.region,
        instance_type=offer.instance_type,
        gpu=gpu.name,
        gpus_per_node=offer.gpu_count,
        nodes=nodes,
        pricing=pricing,
        price_usd_per_hour=price,
        sharding=memory.sharding,
        activation_checkpointing=memory.activation_checkpointing,
        requires=candidate.requires,
        micro_batch=split.micro_batch,
        accumulation_steps=split.accumulation_steps,
        global_batch=split.global_batch,
        memory_gib_per_gpu=memory.total_gib(split.micro_batch),
        memory_fraction=memory.total_gib(split.micro_batch) / gpu.memory_gib,
        efficiency=candidate.efficiency.value,
        efficiency_source=candidate.efficiency.source,
        dtype=candidate.dtype,
        compute_s=step.compute_s,
        exposed_comm_s=step.exposed_comm_s,
        input_s=step.input_s,
        step_s=step.step_s,
        bottleneck=step.bottleneck,
        steps=steps,
        tokens_per_s_per_gpu=samples_per_s * seq_len / gpus if seq_len else None,
        samples_per_s=samples_per_s,
        mfu=samples_per_s * context.flops_per_sample / (gpus * peak * 1e12),
        train_s=times.train_s,
        checkpoint_s=times.checkpoint_s,
        interruption_s=times.interruption_s,
        provision_s=times.provision_s,
        total_s=times.total_s,
        checkpoint_interval_s=times.checkpoint_interval_s,
        expected_interruptions=times.expected_interruptions,
        interruption_band=offer.interruption_band if pricing == "spot" else None,
        cost_usd=cost_usd,
        cost=cost_usd / context.usd_per_unit,
        commitment_usd=(price * a.reserved_term_hours if pricing == "reserved" else None),
        energy_kwh=kwh,
        co2e_kg=kwh * intensity / 1000.0,
        gco2e_per_kwh=intensity,
        pue=pue,
        breakdown=breakdown_dict(step.breakdown) if step.breakdown is not None else None,
    )


def breakdown_dict(breakdown: StepBreakdown) -> dict[str, Any]:
    """The JSON-able form of a roofline step: time by op class, top ops, rates used."""
    total = sum(breakdown.by_class_s.values()) or 1.0
    by_class = {
        name: {"seconds": seconds, "share": seconds / total}
        for name, seconds in sorted(breakdown.by_class_s.items(), key=lambda kv: -kv[1])
    }
    top = [
        {
            "op": cost.op, "class": cost.op_class, "phase": cost.phase, "count": cost.count,
            "seconds": cost.seconds, "share": cost.seconds / total, "bound": cost.bound,
            "shape": cost.shape,
        }
        for cost in breakdown.top_ops
    ]  # fmt: skip
    return {
        "by_class": by_class,
        "top_ops": top,
        "calibration": breakdown.rates_used,
        "gpu_s": breakdown.gpu_s,
        "host_s": breakdown.host_s,
        "optimizer_s": breakdown.optimizer_s,
        "notes": list(breakdown.notes),
    }
