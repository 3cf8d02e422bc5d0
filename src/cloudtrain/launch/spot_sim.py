"""Replay a spot trace under a policy: cost, finish time, deadline, hours by kind."""

from __future__ import annotations

from dataclasses import dataclass, field

from cloudtrain.errors import UserError
from cloudtrain.launch.spot_policy import EPS_HOURS, ClusterType, JobState, SpotPolicy
from cloudtrain.launch.spot_trace import SpotTrace


@dataclass(frozen=True)
class SpotJob:
    """The job to schedule. Validated at construction."""

    job_hours: float
    """Compute the job needs on one instance, in hours."""
    deadline_hours: float
    """Hours from the start by which the job must finish."""
    restart_minutes: float = 6.0
    """Paid minutes without progress at each instance start (provisioning, loading the
    checkpoint, redoing the work since it)."""
    on_demand_price_usd_per_hour: float = 1.0
    """Price of the same instance on demand; the default 1.0 makes costs relative."""

    def __post_init__(self) -> None:
        if not self.job_hours > 0:
            raise UserError(f"--job-hours must be > 0, got {self.job_hours}")
        if not self.deadline_hours > 0:
            raise UserError(f"--deadline must be > 0 hours, got {self.deadline_hours}")
        if self.restart_minutes < 0:
            raise UserError(f"--restart-minutes must be >= 0, got {self.restart_minutes}")
        if self.on_demand_price_usd_per_hour < 0:
            raise UserError("--on-demand-price must be >= 0")

    @property
    def restart_hours(self) -> float:
        return self.restart_minutes / 60.0

    @property
    def on_demand_feasible(self) -> bool:
        """Would on-demand alone (one start, no preemption) meet the deadline."""
        return self.job_hours + self.restart_hours <= self.deadline_hours + EPS_HOURS

    @property
    def on_demand_cost_usd(self) -> float:
        """Cost of the on-demand-only run: the same-run baseline for savings."""
        return (self.job_hours + self.restart_hours) * self.on_demand_price_usd_per_hour


@dataclass(frozen=True)
class SpotSimResult:
    """Outcome of one policy on one trace."""

    policy: str
    trace: str
    finished: bool
    """False: the job was not done when the simulation horizon ran out."""
    finish_hours: float | None
    """Hours from the start to completion; None when not finished."""
    deadline_hours: float
    deadline_met: bool
    cost_usd: float
    spot_hours: float
    """Paid hours on spot instances (restart overhead included)."""
    on_demand_hours: float
    preemptions: int
    launches: int
    """Instance starts, each paying the restart overhead."""
    job_hours: float
    restart_minutes: float
    on_demand_price_usd_per_hour: float
    on_demand_cost_usd: float
    """Cost of on-demand alone for this job (the baseline)."""
    savings_fraction: float | None
    """1 - cost / on-demand cost; None when the job did not finish."""


@dataclass
class _Run:
    job: SpotJob
    current: ClusterType = ClusterType.NONE
    overhead_left_hours: float = 0.0
    done_hours: float = 0.0
    cost_usd: float = 0.0
    paid_hours: dict[ClusterType, float] = field(
        default_factory=lambda: {ClusterType.SPOT: 0.0, ClusterType.ON_DEMAND: 0.0}
    )
    preemptions: int = 0
    launches: int = 0
    finish_hours: float | None = None

    def switch(self, action: ClusterType) -> None:
        if action is ClusterType.NONE:
            self.current, self.overhead_left_hours = ClusterType.NONE, 0.0
        elif action is not self.current:
            self.current, self.overhead_left_hours = action, self.job.restart_hours
            self.launches += 1

    def advance(self, start_hours: float, step_hours: float, price: float) -> None:
        """Run the current instance for one interval (or until the job is done)."""
        if self.current is ClusterType.NONE:
            return
        overhead = min(self.overhead_left_hours, step_hours)
        self.overhead_left_hours -= overhead
        progress = min(step_hours - overhead, self.job.job_hours - self.done_hours)
        self.done_hours += progress
        used = step_hours
        if self.done_hours >= self.job.job_hours - EPS_HOURS:
            self.done_hours = self.job.job_hours
            used = overhead + progress
            self.finish_hours = start_hours + used
        self.cost_usd += price * used
        self.paid_hours[self.current] += used


def simulate(policy: SpotPolicy, trace: SpotTrace, job: SpotJob) -> SpotSimResult:
    """Replay `trace` with `policy` deciding at every trace interval.

    Spot past the end of the trace counts as unavailable; the simulation stops when
    the job is done or at max(trace end, deadline) + job_hours + one restart.
    """
    policy.reset()
    run = _Run(job)
    step = trace.step_hours
    horizon_hours = max(trace.duration_hours, job.deadline_hours) + job.job_hours
    horizon_hours += job.restart_hours + step
    index = 0
    while run.finish_hours is None and index * step < horizon_hours:
        available, spot_price = trace.at(index)
        if run.current is ClusterType.SPOT and not available:
            run.preemptions += 1
            run.switch(ClusterType.NONE)
        action = policy.decide(_state(run, index * step, available, step))
        if action is ClusterType.SPOT and not available:
            raise ValueError(f"policy {policy.name} chose spot while none is available")
        run.switch(action)
        if run.current is ClusterType.SPOT:
            price = spot_price or 0.0
        else:
            price = job.on_demand_price_usd_per_hour
        run.advance(index * step, step, price)
        index += 1
    return _result(policy, trace, job, run)


def _state(run: _Run, elapsed_hours: float, available: bool, step_hours: float) -> JobState:
    job = run.job
    return JobState(
        elapsed_hours=elapsed_hours,
        done_hours=run.done_hours,
        job_hours=job.job_hours,
        deadline_hours=job.deadline_hours,
        restart_hours=job.restart_hours,
        current=run.current,
        overhead_left_hours=run.overhead_left_hours,
        spot_available=available,
        step_hours=step_hours,
    )


def _result(policy: SpotPolicy, trace: SpotTrace, job: SpotJob, run: _Run) -> SpotSimResult:
    finished = run.finish_hours is not None
    met = finished and run.finish_hours <= job.deadline_hours + 1e-6
    baseline = job.on_demand_cost_usd
    savings = (1.0 - run.cost_usd / baseline) if finished and baseline > 0 else None
    return SpotSimResult(
        policy=policy.name,
        trace=trace.source,
        finished=finished,
        finish_hours=run.finish_hours,
        deadline_hours=job.deadline_hours,
        deadline_met=bool(met),
        cost_usd=run.cost_usd,
        spot_hours=run.paid_hours[ClusterType.SPOT],
        on_demand_hours=run.paid_hours[ClusterType.ON_DEMAND],
        preemptions=run.preemptions,
        launches=run.launches,
        job_hours=job.job_hours,
        restart_minutes=job.restart_minutes,
        on_demand_price_usd_per_hour=job.on_demand_price_usd_per_hour,
        on_demand_cost_usd=baseline,
        savings_fraction=savings,
    )


def compare_policies(
    policies: list[SpotPolicy], trace: SpotTrace, job: SpotJob
) -> list[SpotSimResult]:
    """One result per policy on the same trace and job, in the given order."""
    return [simulate(policy, trace, job) for policy in policies]
