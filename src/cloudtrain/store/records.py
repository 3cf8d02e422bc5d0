"""The records the run store holds: runs, their attempts, steps, samples, events, findings.

Times are Unix seconds (float, UTC). A field that is `None` was not measured or does
not apply; each docstring says which. Records validate their enumerated fields at
construction, so a typo fails where it is made rather than in a report later.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

RUN_STATUSES = ("created", "running", "completed", "failed", "preempted", "stopped")
"""`created`: recorded, not started; `running`: in progress (or died without saying so);
`completed`: finished its work; `failed`: ended with an error; `preempted`: the instance
was taken away; `stopped`: ended on purpose before the end (user, budget, idle guard)."""

FINISHED_STATUSES = ("completed", "failed", "preempted", "stopped")

EVENT_KINDS = (
    "checkpoint",
    "resume",
    "oom_adjustment",
    "preemption",
    "restart",
    "alert",
    "stall",
    "budget",
    "note",
)
"""`checkpoint`: a checkpoint was written (data: path, step, save_s); `resume`: training
continued from a checkpoint (data: path, step); `oom_adjustment`: out of memory, the
micro-batch changed (data: step, old/new micro_batch); `preemption`: a preemption notice
or signal (data: signal, grace_s); `restart`: the supervisor restarted the job (data:
attempt, exit_code, backoff_s); `alert`: a guard fired (data: rule, value, threshold);
`stall`: no step progress (data: seconds, stacks); `budget`: spend crossed or is projected
to cross the budget (data: spend_usd, budget_usd); `note`: anything else worth a line."""

SEVERITIES = ("info", "warn", "critical")


def _check_choice(what: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {what} '{value}'; valid choices: {', '.join(choices)}")


@dataclass
class Run:
    """One training (or watched) job: what ran, where, at what price, and how it ended.

    `created_at`/`started_at`/`ended_at` are Unix seconds; `started_at` is None until the
    run starts, `ended_at` None while it runs. `price_usd_per_hour` is the price of the
    whole instance (all its GPUs), None when unknown. `summary` holds end-of-run figures
    (throughput, MFU, energy, cost) written by whoever knows them.
    """

    id: str
    name: str
    kind: str = "train"
    status: str = "running"
    created_at: float = 0.0
    started_at: float | None = None
    ended_at: float | None = None
    config: dict[str, Any] = field(default_factory=dict)
    host: dict[str, Any] = field(default_factory=dict)
    gpu_name: str | None = None
    """Canonical GPU name (e.g. "H100-SXM"); None when unknown or no GPU."""
    gpu_count: int = 0
    provider: str | None = None
    """Cloud provider of the offer the run is on; None for own hardware or unknown."""
    region: str | None = None
    instance_type: str | None = None
    price_usd_per_hour: float | None = None
    pricing: str | None = None
    """How the instance is billed: "on_demand", "spot" or "reserved"; None if unknown."""
    command: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    def duration_s(self, now_unix_s: float | None = None) -> float | None:
        """Seconds from start to end (to `now_unix_s`, default now, while it runs).

        None when the run never started.
        """
        if self.started_at is None:
            return None
        end = self.ended_at
        if end is None:
            end = time.time() if now_unix_s is None else now_unix_s
        return max(0.0, end - self.started_at)

    def cost_usd(self, now_unix_s: float | None = None) -> float | None:
        """Instance price times wall-clock duration; None when the price is unknown."""
        duration_s = self.duration_s(now_unix_s)
        if self.price_usd_per_hour is None or duration_s is None:
            return None
        return self.price_usd_per_hour * duration_s / 3600.0

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED_STATUSES


@dataclass
class Attempt:
    """One launch of a supervised run; a restart after a failure is the next attempt.

    `attempt` counts from 1. `ended_at`, `exit_code` and `reason` are None while it runs;
    `spend_usd` is None until the supervisor has accounted for it.
    """

    run_id: str
    attempt: int
    started_at: float
    ended_at: float | None = None
    exit_code: int | None = None
    reason: str | None = None
    """Why it ended, e.g. "completed", "preempted", "oom", "crash", "budget"."""
    spend_usd: float | None = None

    def duration_s(self, now_unix_s: float | None = None) -> float:
        end = self.ended_at
        if end is None:
            end = time.time() if now_unix_s is None else now_unix_s
        return max(0.0, end - self.started_at)


SYNC_WAIT_KEY = "time/sync_wait_s"
"""StepRecord.metrics key (the Trainer writes it in distributed runs): seconds per step a
rank waited at the ranks' per-step agreement for the slowest one to arrive; the
straggler waits least."""


@dataclass
class StepRecord:
    """Telemetry of one optimizer step on one rank. Every optional field is None when
    it was not measured (e.g. `tokens` for image models, `mfu` on an unknown GPU).

    `step_s` is wall time of the step including `data_wait_s` (time blocked on the next
    batch). `samples`/`tokens` are counts in this step's global batch on this rank.
    `flops` is training FLOPs of the step on this rank; `mfu` a fraction (0..1) of the
    dense peak. `metrics` holds extra keys (DESIGN.md naming) as floats.
    """

    run_id: str
    step: int
    time_unix_s: float
    rank: int = 0
    step_s: float | None = None
    data_wait_s: float | None = None
    samples: int | None = None
    tokens: int | None = None
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    micro_batch: int | None = None
    mfu: float | None = None
    flops: float | None = None
    memory_allocated_gib: float | None = None
    memory_reserved_gib: float | None = None
    memory_peak_gib: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Sample:
    """One reading of GPU and host telemetry, keyed as DESIGN.md says: "gpu/0/util_pct",
    "gpu/0/power_w", "gpu/0/memory_used_gib", "host/cpu_pct", ... A value of None means
    the device does not support that reading. `run_id` is None for samples taken while no
    run was active; `host` is the hostname (empty when single-host)."""

    time_unix_s: float
    metrics: dict[str, float | None]
    run_id: str | None = None
    host: str = ""


@dataclass
class Event:
    """Something that happened to a run at a moment; `kind` is one of EVENT_KINDS."""

    run_id: str
    kind: str
    message: str
    time_unix_s: float = field(default_factory=time.time)
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_choice("event kind", self.kind, EVENT_KINDS)


@dataclass
class Finding:
    """A diagnosis of a run: what was seen, the numbers behind it, why, and what to do.

    `severity` is "info", "warn" or "critical". `expected_gain` says in words what the fix
    is likely to buy ("~1.6x samples/s"); `data` carries the numbers for tools.
    """

    run_id: str
    rule: str
    severity: str
    symptom: str
    evidence: str
    cause: str
    fix: str
    expected_gain: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_choice("severity", self.severity, SEVERITIES)


Record = StepRecord | Sample | Event | Finding
"""Anything a BatchWriter accepts."""


@dataclass
class RunOverview:
    """A run with the figures a listing shows, computed when it was read.

    `last_step` is the latest step record (None before the first step); `step_records`
    counts step rows over all ranks and attempts; `duration_s` is None if the run never
    started; `cost_usd` sums the attempts' recorded spend when there is any, else price x
    wall-clock, and is None when the price is unknown.
    """

    run: Run
    last_step: StepRecord | None
    step_records: int
    event_counts: dict[str, int]
    finding_counts: dict[str, int]
    attempts: list[Attempt]
    duration_s: float | None
    cost_usd: float | None
