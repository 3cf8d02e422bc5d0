"""The planner's inputs besides the workload (`Constraints`) and its outputs
(`Estimate`, `Plan`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cloudtrain.catalog.query import PRICINGS
from cloudtrain.errors import UserError
from cloudtrain.plan.workload import Workload

OBJECTIVES = ("cost", "time", "carbon")


@dataclass(frozen=True)
class Constraints:
    """What the user allows. Empty tuples and None mean "no limit"."""

    deadline_s: float | None = None
    """Latest acceptable expected wall time, seconds."""
    budget: float | None = None
    """Highest acceptable expected cost, in `currency`."""
    currency: str = "USD"
    """Currency of `budget` and of the costs shown (converted at the catalog's rate)."""
    gpus: tuple[str, ...] = ()
    """GPU names or aliases allowed."""
    providers: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    """Region names or globs ('us-*', 'europe-west4')."""
    countries: tuple[str, ...] = ()
    """ISO 3166-1 alpha-3 codes where the data may be processed (data residency)."""
    min_gpu_memory_gib: float | None = None
    pricings: tuple[str, ...] = PRICINGS
    """Billing models allowed: 'on_demand', 'spot', 'reserved'."""
    max_interruption_band: str | None = None
    """Highest spot interruption band allowed ('5-10%'); None: any."""
    max_nodes: int = 8
    """Node counts tried per offer: 1..max_nodes."""
    max_gpus: int | None = None
    """Most GPUs in total; None: no limit beyond max_nodes."""
    objective: str = "cost"
    """'cost', 'time' or 'carbon': what the ranking minimises first."""

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise UserError(
                f"objective must be one of {', '.join(OBJECTIVES)}, not '{self.objective}'"
            )
        bad = [p for p in self.pricings if p not in PRICINGS]
        if bad:
            raise UserError(f"pricing '{bad[0]}' is not one of {', '.join(PRICINGS)}")
        if self.max_nodes < 1:
            raise UserError("max_nodes must be at least 1")


@dataclass(frozen=True)
class Estimate:
    """One candidate (offer x nodes x pricing) that meets every constraint."""

    provider: str
    region: str
    instance_type: str
    gpu: str
    gpus_per_node: int
    nodes: int
    pricing: str
    """'on_demand', 'spot' or 'reserved'."""
    price_usd_per_hour: float
    """All nodes together at this pricing."""
    sharding: str
    activation_checkpointing: bool
    requires: tuple[str, ...]
    """What the workload needs to fit at all here: 'fsdp', 'checkpointing' (empty: neither)."""
    micro_batch: int
    accumulation_steps: int
    global_batch: int
    memory_gib_per_gpu: float
    memory_fraction: float
    """Memory needed / GPU memory."""
    efficiency: float
    efficiency_source: str
    dtype: str
    """The peak used ('bf16', or 'fp16' on GPUs without bf16, ...)."""
    compute_s: float
    exposed_comm_s: float
    input_s: float
    step_s: float
    bottleneck: str
    steps: int
    tokens_per_s_per_gpu: float | None
    """None for models without tokens."""
    samples_per_s: float
    mfu: float
    """Model FLOPs (no recomputation) per second / (GPUs x peak)."""
    train_s: float
    checkpoint_s: float
    interruption_s: float
    provision_s: float
    total_s: float
    checkpoint_interval_s: float
    expected_interruptions: float
    interruption_band: str | None
    """The offer's published band (spot only); None: unpublished or not spot."""
    cost_usd: float
    cost: float
    """In the plan's currency."""
    commitment_usd: float | None
    """Reserved only: the full term's price, owed even when idle; None otherwise."""
    energy_kwh: float
    co2e_kg: float
    gco2e_per_kwh: float
    pue: float
    on_frontier: bool = False
    """On the cost-vs-time Pareto frontier (nothing else is both cheaper and faster)."""
    breakdown: dict[str, Any] | None = None
    """Traced models: where `compute_s` goes — 'by_class' (op class -> seconds and
    share), 'top_ops', 'calibration' (rate row each kernel kind used), 'host_s',
    'notes'. None when compute is FLOPs at an efficiency."""

    @property
    def label(self) -> str:
        nodes = f"{self.nodes}x " if self.nodes > 1 else ""
        return f"{self.provider} {self.region} {nodes}{self.instance_type} ({self.pricing})"


@dataclass(frozen=True)
class Plan:
    """The planner's answer: ranked estimates, the frontier, and how it got there."""

    workload: Workload
    constraints: Constraints
    currency: str
    usd_per_unit: float
    """USD per unit of `currency` (1.0 for USD)."""
    estimates: list[Estimate]
    """Every candidate meeting the constraints, best first by the objective."""
    frontier: list[Estimate]
    """Cost-vs-time Pareto frontier, fastest first."""
    candidates: int
    """Candidates considered (offers x node counts x available pricings)."""
    removed: dict[str, int]
    """Candidates each constraint removed (each counted once, by the first it failed)."""
    assumptions: dict[str, Any] = field(default_factory=dict)
    why: str = ""
    """One line on why the winner won."""
    why_empty: str | None = None
    """Why nothing is left and what to relax; None when there are estimates."""

    @property
    def best(self) -> Estimate | None:
        return self.estimates[0] if self.estimates else None

    def top(self, count: int) -> Plan:
        """The same plan with only the first `count` estimates (0: all)."""
        if count <= 0:
            return self
        return Plan(**{**self.__dict__, "estimates": self.estimates[:count]})
