"""`plan()`: every offer x node count x pricing, filtered by the constraints, estimated,
ranked by the objective, with the cost-vs-time Pareto frontier. Pure: reads only the
values passed in."""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from cloudtrain.catalog.rates import RateTable, rate_table
from cloudtrain.catalog.types import AchievableRate, Catalog, GPUSpec, Offer
from cloudtrain.errors import UnknownNameError
from cloudtrain.plan import perf
from cloudtrain.plan.assumptions import Assumptions
from cloudtrain.plan.cost import HOURS_PER_MONTH, hazard_per_node_hour, timeline
from cloudtrain.plan.explain import (
    FILTER_STAGES,
    explain_empty,
    explain_winner,
    pareto_frontier,
    rank_key,
)
from cloudtrain.plan.learned import Correction, MeasuredRun, combine
from cloudtrain.plan.memory import (
    USABLE_MEMORY_FRACTION,
    MemoryFit,
    checkpoint_bytes,
    memory_options,
    split_batch,
)
from cloudtrain.plan.pricing import Candidate, price_estimate, site_factors
from cloudtrain.plan.result import Constraints, Estimate, Plan
from cloudtrain.plan.roofline import Roofline, StepBreakdown, StepOptions
from cloudtrain.plan.workload import Workload, model_flops_per_sample, steps_for

STAGES = (
    *FILTER_STAGES,
    "precision",
    "memory",
    "batch",
    "spot_risk",
    "deadline",
    "budget",
)
"""Constraint checks in the order they are applied; `Plan.removed` uses these keys."""


@dataclass
class Tally:
    """Counts and the facts `explain_empty` needs."""

    removed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STAGES, 0))
    reached: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STAGES, 0))
    min_memory_need_gib: float = math.inf
    max_memory_usable_gib: float = 0.0
    fastest_s: float = math.inf
    cheapest: float = math.inf
    """Cheapest cost (plan currency) among candidates that reached the budget check."""
    dtypes_missing: set[str] = field(default_factory=set)

    def drop(self, stage: str, count: int) -> None:
        self.removed[stage] += count


def plan(
    workload: Workload,
    constraints: Constraints,
    catalog: Catalog,
    *,
    efficiency_overrides: Mapping[str, float] | None = None,
    measured_matmul: Mapping[str, Mapping[str, float]] | None = None,
    measured_rates: Sequence[AchievableRate] = (),
    measured_runs: Sequence[MeasuredRun] = (),
    assumptions: Assumptions | None = None,
) -> Plan:
    """Rank every candidate for `workload` under `constraints`.

    `efficiency_overrides` maps GPU names (or '*') to an end-to-end efficiency;
    `measured_matmul` maps GPU names to {dtype: achieved/peak matmul fraction} from
    `cloudtrain bench`; `measured_rates` are achievable-rate rows it measured (they win
    over the catalog's for the roofline of a traced workload); `measured_runs` are
    recorded runs of the traced model, whose measured step time corrects the roofline
    (plan/learned.py). An impossible request returns a Plan with no estimates and
    `why_empty` saying what to relax.
    """
    assumptions = assumptions or Assumptions()
    roofline = None
    if workload.profile is not None and not efficiency_overrides:
        roofline = _roofline(workload, catalog, measured_matmul, measured_rates, measured_runs)
    context = _Context.build(workload, constraints, catalog, assumptions, roofline)
    efficiency = _efficiencies(workload, catalog, context, efficiency_overrides, measured_matmul)
    tally = Tally()
    estimates: list[Estimate] = []
    candidates = 0
    for offer in catalog.offers:
        pricings = _available_pricings(offer)
        candidates += len(pricings) * constraints.max_nodes
        estimates.extend(_offer_estimates(offer, pricings, context, efficiency, tally))
    estimates.sort(key=rank_key(constraints.objective))
    frontier_ids = {id(e) for e in pareto_frontier(estimates)}
    estimates = [replace(e, on_frontier=True) if id(e) in frontier_ids else e for e in estimates]
    frontier = sorted((e for e in estimates if e.on_frontier), key=lambda e: e.total_s)
    return Plan(
        workload=workload,
        constraints=constraints,
        currency=context.currency,
        usd_per_unit=context.usd_per_unit,
        estimates=estimates,
        frontier=frontier,
        candidates=candidates,
        removed={k: v for k, v in tally.removed.items() if v},
        assumptions=_assumptions_used(context, efficiency),
        why=explain_winner(estimates, constraints, context.currency) if estimates else "",
        why_empty=None
        if estimates
        else explain_empty(workload, constraints, tally, context.currency),
    )


@dataclass(frozen=True)
class _Context:
    workload: Workload
    constraints: Constraints
    catalog: Catalog
    assumptions: Assumptions
    gpus: dict[str, GPUSpec]
    allowed_gpus: frozenset[str] | None
    currency: str
    usd_per_unit: float
    budget_usd: float | None
    max_band_rate: float | None
    flops_per_sample: float
    ckpt_bytes: float
    roofline: Roofline | None = None
    """Prices a traced model's ops (None: FLOPs at an efficiency)."""
    memory_cache: dict = field(default_factory=dict)
    """(GPU name, GPU count) -> memory options, shared by offers of the same shape."""

    @classmethod
    def build(
        cls,
        workload: Workload,
        constraints: Constraints,
        catalog: Catalog,
        assumptions: Assumptions,
        roofline: Roofline | None = None,
    ) -> _Context:
        gpus = {g.name: g for g in catalog.gpus}
        allowed = (
            frozenset(catalog.gpu(n).name for n in constraints.gpus) if constraints.gpus else None
        )
        _check_names("provider", constraints.providers, {o.provider for o in catalog.offers})
        countries = {r.country for r in catalog.regions} | {g.country for g in catalog.grid}
        _check_names("country", constraints.countries, countries - {"WORLD"})
        rate = _usd_per_unit(catalog, constraints.currency)
        band = constraints.max_interruption_band
        band_rate = None
        if band is not None:
            from cloudtrain.catalog.types import INTERRUPTION_BANDS

            if band not in INTERRUPTION_BANDS:
                raise UnknownNameError("interruption band", band, INTERRUPTION_BANDS)
            band_rate = INTERRUPTION_BANDS[band]
        budget = constraints.budget * rate if constraints.budget is not None else None
        return cls(
            workload, constraints, catalog, assumptions, gpus, allowed,
            constraints.currency.upper(), rate, budget, band_rate,
            model_flops_per_sample(workload), checkpoint_bytes(workload), roofline,
        )  # fmt: skip


def _roofline(
    workload: Workload,
    catalog: Catalog,
    measured_matmul: Mapping[str, Mapping[str, float]] | None,
    measured_rates: Sequence[AchievableRate],
    measured_runs: Sequence[MeasuredRun],
) -> Roofline:
    """The roofline of a traced workload over the catalog's achievable rates, with what
    `cloudtrain bench` measured over them, corrected by recorded runs of the model."""
    rates: RateTable = rate_table(catalog.rates)
    measured_rows = []
    for name, fractions in (measured_matmul or {}).items():
        gpu = catalog.gpu(name)
        for dtype, share in fractions.items():
            base = rates.lookup(gpu, "matmul", dtype)
            measured = replace(base, key=gpu.name, dtype=dtype, layout="any")
            measured_rows.append(
                replace(measured, compute_fraction=min(1.0, share), source="cloudtrain bench")
            )
    if measured_rows or measured_rates:
        rates = rates.with_rows([*measured_rows, *measured_rates])
    options = StepOptions(
        compile=workload.compile,
        optimizer=workload.optimizer,
        optimizer_impl=workload.optimizer_impl,
        tf32_matmul=workload.tf32,
        tf32_conv=workload.tf32,
    )
    assert workload.profile is not None
    uncorrected = Roofline(workload.profile, rates, options)
    correction = _correction(uncorrected, catalog, measured_runs)
    if correction is None:
        return uncorrected
    return Roofline(workload.profile, rates, options, correction)


def _correction(
    roofline: Roofline, catalog: Catalog, runs: Sequence[MeasuredRun]
) -> Correction | None:
    """Measured / predicted over the runs of this very model on catalog GPUs."""
    gpus = {gpu.name: gpu for gpu in catalog.gpus}
    triples = []
    for run in runs:
        gpu = gpus.get(run.gpu)  # runs record the canonical catalog name
        if run.fingerprint != roofline.profile.fingerprint or gpu is None:
            continue
        options = replace(
            roofline.options, compile=run.compile, optimizer=run.optimizer,
            optimizer_impl=run.optimizer_impl,
        )  # fmt: skip
        as_run = Roofline(roofline.profile, roofline.rates, options)
        predicted = as_run.step(gpu, run.micro_batch, run.accumulation_steps).step_s
        triples.append((run, run.step_s, predicted))
    return combine(triples)


def _check_names(kind: str, given: tuple[str, ...], known: set[str]) -> None:
    folded = {k.casefold() for k in known}
    for name in given:
        if name.casefold() not in folded:
            raise UnknownNameError(kind, name, known)


def _usd_per_unit(catalog: Catalog, currency: str) -> float:
    if currency.upper() == "USD":
        return 1.0
    for rate in catalog.exchange_rates:
        if rate.currency.upper() == currency.upper():
            return rate.usd_per_unit
    raise UnknownNameError(
        "currency", currency, ["USD", *(r.currency for r in catalog.exchange_rates)]
    )


def _available_pricings(offer: Offer) -> list[str]:
    pricings = ["on_demand"]
    if offer.spot_usd_per_hour is not None:
        pricings.append("spot")
    if offer.reserved_usd_per_hour is not None:
        pricings.append("reserved")
    return pricings


def _efficiencies(
    workload: Workload,
    catalog: Catalog,
    context: _Context,
    overrides: Mapping[str, float] | None,
    measured: Mapping[str, Mapping[str, float]] | None,
) -> dict[str, tuple[str, perf.Efficiency] | None]:
    """GPU name -> (dtype, efficiency); None where the GPU cannot run the precision."""
    resolved_overrides = {
        (catalog.gpu(k).name if k != "*" else k): v for k, v in (overrides or {}).items()
    }
    resolved_measured = {catalog.gpu(k).name: v for k, v in (measured or {}).items()}
    table: dict[str, tuple[str, perf.Efficiency] | None] = {}
    for name, gpu in context.gpus.items():
        dtype = perf.compute_dtype(workload, gpu)
        if dtype is None:
            table[name] = None
            continue
        value = resolved_overrides.get(name, resolved_overrides.get("*"))
        if value is not None:
            table[name] = (dtype, perf.Efficiency(value, "override"))
            continue
        efficiency = perf.default_efficiency(workload, gpu, dtype)
        fraction = resolved_measured.get(name, {}).get(dtype)
        if fraction:
            efficiency = perf.measured_efficiency(efficiency, gpu, fraction)
        table[name] = (dtype, efficiency)
    return table


def _offer_filter(offer: Offer, gpu: GPUSpec | None, context: _Context) -> str | None:
    """The first offer-level constraint `offer` fails, or None."""
    c = context.constraints
    if gpu is None:
        return "unknown_gpu"
    if context.allowed_gpus is not None and gpu.name not in context.allowed_gpus:
        return "gpu"
    if c.providers and offer.provider.casefold() not in {p.casefold() for p in c.providers}:
        return "provider"
    if c.regions and not any(fnmatch.fnmatch(offer.region.lower(), g.lower()) for g in c.regions):
        return "region"
    if c.countries:
        region = context.catalog.region(offer.provider, offer.region)
        if region is None or region.country.upper() not in {x.upper() for x in c.countries}:
            return "country"
    if c.min_gpu_memory_gib is not None and gpu.memory_gib < c.min_gpu_memory_gib:
        return "min_gpu_memory"
    return None


def _pricing_filter(offer: Offer, pricing: str, context: _Context) -> str | None:
    if pricing not in context.constraints.pricings:
        return "pricing"
    if pricing == "spot" and context.max_band_rate is not None:
        rate = offer.interruption_rate
        if rate is None:
            rate = context.assumptions.unknown_band_monthly_rate
        if rate > context.max_band_rate:
            return "interruption_band"
    return None


def _offer_estimates(
    offer: Offer,
    pricings: list[str],
    context: _Context,
    efficiency: dict[str, tuple[str, perf.Efficiency] | None],
    tally: Tally,
) -> list[Estimate]:
    gpu = context.gpus.get(offer.gpu)
    c = context.constraints
    failed = _offer_filter(offer, gpu, context)
    if failed:
        tally.drop(failed, len(pricings) * c.max_nodes)
        return []
    if gpu is None:  # already counted as unknown_gpu by _offer_filter
        return []
    out: list[Estimate] = []
    site = site_factors(context.catalog, offer, context.assumptions)
    for nodes in range(1, c.max_nodes + 1):
        if c.max_gpus is not None and nodes * offer.gpu_count > c.max_gpus:
            tally.drop("max_gpus", len(pricings))
            continue
        allowed = []
        for pricing in pricings:
            failed = _pricing_filter(offer, pricing, context)
            if failed:
                tally.drop(failed, 1)
            else:
                allowed.append(pricing)
        if not allowed:
            continue
        entry = efficiency[gpu.name]
        if entry is None:
            tally.dtypes_missing.add(gpu.name)
            tally.drop("precision", len(allowed))
            continue
        candidate = _best_layout(offer, gpu, nodes, entry, context, tally, len(allowed), site)
        if candidate is None:
            continue
        for pricing in allowed:
            estimate = _finish(candidate, pricing, context, tally)
            if estimate is not None:
                out.append(estimate)
    return out


def _best_layout(
    offer: Offer,
    gpu: GPUSpec,
    nodes: int,
    entry: tuple[str, perf.Efficiency],
    context: _Context,
    tally: Tally,
    count: int,
    site: tuple[float, float],
) -> Candidate | None:
    """The fastest (sharding, checkpointing, micro-batch) that fits, or None (counted)."""
    workload = context.workload
    gpus = offer.gpu_count * nodes
    key = (gpu.name, gpus)
    options = context.memory_cache.get(key)
    if options is None:
        options = context.memory_cache[key] = memory_options(workload, gpu.memory_gib, gpus)
    fitting = [o for o in options if o.max_micro_batch >= 1]
    if not fitting:
        lean = min(o.total_gib(1) for o in options)
        tally.min_memory_need_gib = min(tally.min_memory_need_gib, lean)
        tally.max_memory_usable_gib = max(tally.max_memory_usable_gib, options[0].usable_gib)
        tally.drop("memory", count)
        return None
    requires = _requirements(options)
    dtype, efficiency = entry
    peak = gpu.peak_tflops(dtype) or 0.0
    best: Candidate | None = None
    for option in fitting:
        largest = option.max_micro_batch
        if workload.micro_batch is not None:
            if workload.micro_batch > largest:
                continue
            largest = workload.micro_batch
        split = split_batch(
            workload.global_batch, gpus, largest, exact=workload.micro_batch is not None
        )
        if split is None:
            continue
        layout = (
            option.sharding,
            option.activation_checkpointing,
            split.micro_batch,
            split.accumulation_steps,
        )
        step = perf.step_time(
            workload, gpu, offer, nodes, layout, peak, efficiency.value, context.assumptions,
            _cpu_rate(workload, context.assumptions), context.roofline,
        )  # fmt: skip
        used = efficiency
        if step.breakdown is not None:
            used = _roofline_efficiency(step.breakdown, peak, context.roofline)
        if best is None or _preference(step.step_s, option) < _preference(
            best.step.step_s, best.memory
        ):
            best = Candidate(offer, gpu, nodes, option, split, step, dtype, used, requires, *site)
    if best is None:
        tally.drop("batch", count)
    return best


def _roofline_efficiency(
    breakdown: StepBreakdown, peak_tflops: float, roofline: Roofline | None
) -> perf.Efficiency:
    """FLOPs executed / (step seconds x peak): what the roofline's step time amounts to."""
    value = breakdown.flops / (breakdown.step_s * peak_tflops * 1e12)
    source = "roofline over the traced ops"
    if roofline is not None and roofline.correction is not None:
        source += f", corrected {roofline.correction.label}"
    return perf.Efficiency(round(value, 4), source)


FSDP_PREFERENCE = 1.02
"""DDP is kept unless FSDP is more than 2% faster: FSDP has costs the model leaves out
(more, smaller kernels and collectives; parameter flattening)."""


def _preference(step_s: float, option: MemoryFit) -> float:
    return step_s * (FSDP_PREFERENCE if option.sharding == "fsdp" else 1.0)


def _requirements(options: list[MemoryFit]) -> tuple[str, ...]:
    """What must be on for any option to fit: ('fsdp',), ('checkpointing',), both or ()."""
    fits = {(o.sharding, o.activation_checkpointing) for o in options if o.max_micro_batch >= 1}
    needs: list[str] = []
    if fits and all(sharding == "fsdp" for sharding, _ in fits):
        needs.append("fsdp")
    if fits and all(recompute for _, recompute in fits):
        needs.append("checkpointing")
    return tuple(needs)


def _cpu_rate(workload: Workload, assumptions: Assumptions) -> float | None:
    if workload.data_kind == "images":
        return assumptions.cpu_images_per_s_per_vcpu
    return None


def _finish(candidate: Candidate, pricing: str, context: _Context, tally: Tally) -> Estimate | None:
    """Time, cost and energy at `pricing`; None (counted) when a constraint fails."""
    a = context.assumptions
    steps = steps_for(context.workload, candidate.split.global_batch)
    train_s = steps * candidate.step.step_s
    write_s = context.ckpt_bytes / (candidate.nodes * a.checkpoint_write_gb_per_s * 1e9)
    hazard = 0.0
    if pricing == "spot":
        hazard = a.spot_interruptions_per_node_hour
        if hazard is None:
            rate = candidate.offer.interruption_rate
            hazard = hazard_per_node_hour(rate if rate is not None else a.unknown_band_monthly_rate)
    times = timeline(train_s, write_s, candidate.nodes, hazard_per_node_hour_=hazard, assumptions=a)
    if times is None:
        tally.drop("spot_risk", 1)
        return None
    estimate = price_estimate(candidate, pricing, steps, times, context)
    tally.fastest_s = min(tally.fastest_s, estimate.total_s)
    c = context.constraints
    if c.deadline_s is not None and estimate.total_s > c.deadline_s:
        tally.drop("deadline", 1)
        return None
    tally.cheapest = min(tally.cheapest, estimate.cost)
    if context.budget_usd is not None and estimate.cost_usd > context.budget_usd:
        tally.drop("budget", 1)
        return None
    return estimate


def _assumptions_used(
    context: _Context, efficiency: dict[str, tuple[str, perf.Efficiency] | None]
) -> dict[str, object]:
    used: dict[str, object] = dict(context.assumptions.as_dict())
    offered = {o.gpu for o in context.catalog.offers}
    used["efficiency"] = {
        name: {"dtype": entry[0], "value": entry[1].value, "source": entry[1].source}
        for name, entry in sorted(efficiency.items())
        if entry is not None and name in offered
    }
    used["usable_memory_fraction"] = USABLE_MEMORY_FRACTION
    used["exchange_rate"] = {"currency": context.currency, "usd_per_unit": context.usd_per_unit}
    used["spot_hazard"] = (
        f"-ln(1 - monthly band mid-point) / {HOURS_PER_MONTH:.0f} h per node; "
        f"unknown band: {context.assumptions.unknown_band_monthly_rate:.3f}/month"
    )
    used["step_model"] = "roofline" if context.roofline is not None else "efficiency"
    correction = context.roofline.correction if context.roofline is not None else None
    used["learned_from"] = (
        {"factor": correction.factor, "runs": list(correction.runs)} if correction else None
    )
    used["checkpoint_bytes"] = context.ckpt_bytes
    used["flops_per_sample"] = context.flops_per_sample
    return used
