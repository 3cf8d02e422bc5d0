"""Deadline-aware spot policies: which kind of instance to run on for the next interval.

A policy is a small stateful object with `decide(state) -> ClusterType`. Anything that
can switch a job between spot, on-demand and nothing (the simulator here, a controller
around `sky jobs launch`, a Kubernetes operator) calls `decide` once per decision
interval with the job's `JobState` and acts on the answer. See docs/launch.md.

The job model follows "Can't Be Late: Optimizing Spot Instance Savings under
Deadlines" (Wu et al., NSDI'24): a job needs `job_hours` of compute before
`deadline_hours`; progress is kept across instances (checkpoints), and every start of
an instance (first launch, after a preemption, on a switch) costs `restart_hours` of
paid time without progress (provisioning, loading the checkpoint, redoing the work
since it). On-demand is always available; spot is available when the trace says so.

Slack is `time_left - work_left`. The safety net used by greedy and uniform progress
keeps slack >= restart_hours at every decision: an action whose worst case over the
next interval would take slack below that is replaced by on-demand until the end.
Since on-demand alone meets the deadline exactly when the initial slack is
>= restart_hours, these policies never miss a deadline on-demand alone would meet.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from cloudtrain.errors import UnknownNameError

EPS_HOURS = 1e-9


class ClusterType(str, enum.Enum):
    """What the job runs on over an interval."""

    NONE = "none"
    SPOT = "spot"
    ON_DEMAND = "on-demand"


@dataclass(frozen=True)
class JobState:
    """What a policy sees at a decision point. All times in hours from the job's start."""

    elapsed_hours: float
    done_hours: float
    """Work completed so far (hours of compute on one instance)."""
    job_hours: float
    deadline_hours: float
    restart_hours: float
    """Paid time without progress each time an instance starts."""
    current: ClusterType
    """Instance running now (after any preemption at this point)."""
    overhead_left_hours: float
    """Restart overhead the current instance still has to pay; 0 with no instance."""
    spot_available: bool
    step_hours: float
    """Time until the next decision."""

    @property
    def work_left_hours(self) -> float:
        return max(0.0, self.job_hours - self.done_hours)

    @property
    def time_left_hours(self) -> float:
        return self.deadline_hours - self.elapsed_hours

    @property
    def slack_hours(self) -> float:
        return self.time_left_hours - self.work_left_hours

    def worst_slack_after(self, action: ClusterType) -> float:
        """Lowest slack at the next decision if `action` is taken now (spot may vanish then)."""
        if action is ClusterType.NONE:
            return self.slack_hours - self.step_hours
        overhead = self.overhead_left_hours if action is self.current else self.restart_hours
        return self.slack_hours - min(overhead, self.step_hours)


class SpotPolicy:
    """Base class: `decide` picks the cluster type for the next interval."""

    name = "base"

    def reset(self) -> None:
        """Forget state from a previous job."""

    def decide(self, state: JobState) -> ClusterType:
        raise NotImplementedError


class OnDemandPolicy(SpotPolicy):
    """Always on-demand: the baseline cost, meets every deadline that can be met."""

    name = "on-demand"

    def decide(self, state: JobState) -> ClusterType:
        return ClusterType.ON_DEMAND


class SpotOnlyPolicy(SpotPolicy):
    """Spot whenever available, otherwise wait: cheapest, ignores the deadline."""

    name = "spot-only"

    def decide(self, state: JobState) -> ClusterType:
        return ClusterType.SPOT if state.spot_available else ClusterType.NONE


class _SafetyNetPolicy(SpotPolicy):
    """Shared safety net: commit to on-demand for good once slack gets too thin."""

    def __init__(self) -> None:
        self.committed = False

    def reset(self) -> None:
        self.committed = False

    def decide(self, state: JobState) -> ClusterType:
        if not self.committed:
            wanted = self.preferred(state)
            if state.worst_slack_after(wanted) >= state.restart_hours - EPS_HOURS:
                return wanted
            self.committed = True
        return ClusterType.ON_DEMAND

    def preferred(self, state: JobState) -> ClusterType:
        raise NotImplementedError


class GreedyPolicy(_SafetyNetPolicy):
    """Spot whenever available, wait otherwise, on-demand to the end once slack is gone."""

    name = "greedy"

    def preferred(self, state: JobState) -> ClusterType:
        return ClusterType.SPOT if state.spot_available else ClusterType.NONE


class UniformProgressPolicy(_SafetyNetPolicy):
    """Uniform Progress (NSDI'24): keep up with the straight line to the deadline.

    The line is `job_hours * elapsed / deadline`. Spot is used when available; without
    spot, on-demand runs only while progress is behind the line. Hysteresis of
    `hysteresis_hours` (default: one restart overhead) stops flapping: on-demand
    keeps running until progress is that far ahead of the line, and a running
    on-demand instance is given up for spot only when that far ahead (the switch
    costs a restart). The safety net of greedy applies on top.
    """

    name = "uniform-progress"

    def __init__(self, hysteresis_hours: float | None = None) -> None:
        super().__init__()
        self.hysteresis_hours = hysteresis_hours
        """None: one restart overhead of the job being decided."""

    def preferred(self, state: JobState) -> ClusterType:
        margin = state.restart_hours if self.hysteresis_hours is None else self.hysteresis_hours
        line = state.job_hours * state.elapsed_hours / state.deadline_hours
        lead = state.done_hours - line
        on_demand_now = state.current is ClusterType.ON_DEMAND
        if state.spot_available:
            if on_demand_now and lead < margin - EPS_HOURS:
                return ClusterType.ON_DEMAND
            return ClusterType.SPOT
        if on_demand_now:
            return ClusterType.ON_DEMAND if lead < margin - EPS_HOURS else ClusterType.NONE
        return ClusterType.ON_DEMAND if lead < -EPS_HOURS else ClusterType.NONE


POLICIES: dict[str, type[SpotPolicy]] = {
    cls.name: cls for cls in (GreedyPolicy, UniformProgressPolicy, OnDemandPolicy, SpotOnlyPolicy)
}


def make_policy(name: str) -> SpotPolicy:
    """A fresh policy by name: greedy, uniform-progress, on-demand or spot-only."""
    key = name.strip().lower().replace("_", "-")
    if key not in POLICIES:
        raise UnknownNameError("spot policy", name, POLICIES)
    return POLICIES[key]()
