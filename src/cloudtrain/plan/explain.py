"""Ranking, the Pareto frontier, and the sentences that explain a plan."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from cloudtrain.plan.result import Constraints, Estimate
from cloudtrain.plan.workload import Workload

FILTER_STAGES = (
    "unknown_gpu",
    "gpu",
    "provider",
    "region",
    "country",
    "min_gpu_memory",
    "max_gpus",
    "pricing",
    "interruption_band",
)
"""Constraint checks on the offer alone, before anything is estimated."""

if TYPE_CHECKING:
    from cloudtrain.plan.search import Tally


def rank_key(objective: str) -> Callable[[Estimate], tuple[float, ...]]:
    """Sort key: the objective first, then the other two, then fewer GPUs."""
    order = {
        "cost": ("cost_usd", "total_s", "co2e_kg"),
        "time": ("total_s", "cost_usd", "co2e_kg"),
        "carbon": ("co2e_kg", "cost_usd", "total_s"),
    }[objective]
    return lambda e: (*(round(getattr(e, name), 9) for name in order), e.nodes * e.gpus_per_node)


def pareto_frontier(estimates: Sequence[Estimate]) -> list[Estimate]:
    """Estimates no other estimate beats on both cost and time (ties: the first kept),
    fastest first."""
    frontier: list[Estimate] = []
    best_cost = math.inf
    for estimate in sorted(estimates, key=lambda e: (e.total_s, e.cost_usd)):
        if estimate.cost_usd < best_cost:
            frontier.append(estimate)
            best_cost = estimate.cost_usd
    return frontier


def duration(seconds: float) -> str:
    """'45 min', '7.5 h', '12.3 d'."""
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 72 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def money(amount: float, currency: str) -> str:
    symbol = {"USD": "$", "CNY": "¥"}.get(currency)
    return f"{symbol}{amount:,.0f}" if symbol else f"{amount:,.0f} {currency}"


def explain_winner(ranked: Sequence[Estimate], constraints: Constraints, currency: str) -> str:
    """One line: what won, by how much over the runner-up, and its main risk."""
    best = ranked[0]
    what = {"cost": "cheapest", "time": "fastest", "carbon": "lowest-carbon"}[constraints.objective]
    text = (
        f"{best.label} is the {what} of {len(ranked)} plans meeting the constraints: "
        f"{money(best.cost, currency)}, {duration(best.total_s)}, {best.co2e_kg:,.0f} kg CO2e"
    )
    if len(ranked) > 1:
        second = ranked[1]
        text += (
            f" (next: {second.label}, {money(second.cost, currency)}, {duration(second.total_s)})"
        )
    if best.pricing == "spot":
        text += f"; expects {best.expected_interruptions:.1f} interruptions"
    elif best.pricing == "reserved":
        text += "; needs a 1-year reservation"
    return text


def explain_empty(workload: Workload, constraints: Constraints, tally: Tally, currency: str) -> str:
    """Why nothing is left, and what to relax."""
    removed = {k: v for k, v in tally.removed.items() if v}
    if not removed:
        return "the catalog has no offers; add some with --catalog PATH"
    stage = _emptying_stage(tally)
    hint = _HINTS.get(stage, lambda w, c, t, cur: f"relax the '{stage}' constraint")(
        workload, constraints, tally, currency
    )
    counts = ", ".join(f"{k} {v:,}" for k, v in removed.items())
    return f"no plan meets the constraints: {hint} (removed: {counts})"


def _emptying_stage(tally: Tally) -> str:
    """The latest stage that removed candidates: the one that emptied the set."""
    from cloudtrain.plan.search import STAGES

    last = STAGES[0]
    for stage in STAGES:
        if tally.removed.get(stage):
            last = stage
    return last


def _memory_hint(w: Workload, c: Constraints, t: Tally, currency: str) -> str:
    need = t.min_memory_need_gib
    return (
        f"{w.name} does not fit: it needs at least {need:,.1f} GiB per GPU even with FSDP and "
        f"checkpointing on {c.max_nodes} node(s), and the GPUs offer "
        f"{t.max_memory_usable_gib:,.1f} GiB usable; allow more nodes (--max-nodes), "
        "GPUs with more memory, or a smaller model"
    )


def _deadline_hint(w: Workload, c: Constraints, t: Tally, currency: str) -> str:
    fastest = t.fastest_s
    hours = math.ceil(fastest / 3600.0)
    suggestion = f"{hours}h" if hours <= 72 else f"{math.ceil(fastest / 86400.0)}d"
    return (
        f"the fastest plan takes {duration(fastest)}, past the {duration(c.deadline_s or 0)} "
        f"deadline; relax it to --deadline {suggestion}, allow more nodes (--max-nodes) "
        "or more GPU types"
    )


def _budget_hint(w: Workload, c: Constraints, t: Tally, currency: str) -> str:
    return (
        f"the cheapest plan within the other limits costs {money(t.cheapest, currency)}, "
        f"over the {money(c.budget or 0, currency)} budget; raise --budget, relax the deadline "
        "or allow spot"
    )


def _filter_hint(w: Workload, c: Constraints, t: Tally, currency: str) -> str:
    return (
        "no offer passes the filters (GPU, provider, region, country, GPU memory, pricing); "
        "widen --gpu/--provider/--region/--country or lower --min-gpu-memory"
    )


def _precision_hint(w: Workload, c: Constraints, t: Tally, currency: str) -> str:
    gpus = ", ".join(sorted(t.dtypes_missing))
    return f"no remaining GPU supports {w.precision} ({gpus}); use --precision bf16 or fp32"


def _batch_hint(w: Workload, c: Constraints, t: Tally, currency: str) -> str:
    return (
        f"the global batch ({w.global_batch}) has fewer samples than GPUs; raise "
        "--global-batch or lower --max-nodes"
    )


def _spot_hint(w: Workload, c: Constraints, t: Tally, currency: str) -> str:
    return "spot interruptions come too often for the job to finish; allow on-demand pricing"


_HINTS: dict[str, Callable[[Workload, Constraints, Tally, str], str]] = {
    "memory": _memory_hint,
    "deadline": _deadline_hint,
    "budget": _budget_hint,
    "precision": _precision_hint,
    "batch": _batch_hint,
    "spot_risk": _spot_hint,
    **dict.fromkeys(FILTER_STAGES, _filter_hint),
}
