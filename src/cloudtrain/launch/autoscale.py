"""Autoscaling a GPU pool for a queue of training jobs, and a simulator to compare rules.

The rule of thumb "add GPUs when load > 0.8, remove when load < 0.3" (here
`ThresholdPolicy`) reacts to every blip: it adds GPUs for a queue that is about to
drain and removes them just before the next burst. `AutoscalePolicy` keeps the
thresholds but makes them robust:

- two signals: queue depth (jobs waiting) and load = (busy + queued GPUs) / pool GPUs;
  the pool grows only while jobs are waiting, and by what the queue needs;
- hysteresis: a signal must hold for several consecutive checks before acting;
- cooldown: no action for a while after the last one (longer before shrinking);
- min/max pool size; only idle GPUs are ever removed.

Job trace CSV: `submit_hours,gpus,duration_hours` (optional `name`), one job per row;
`submit_hours` counts from the start of the trace.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass
from pathlib import Path

from cloudtrain.errors import DataError, UserError


@dataclass(frozen=True)
class JobSpec:
    """One job of the trace."""

    name: str
    submit_hours: float
    gpus: int
    duration_hours: float
    """Run time once started on its GPUs."""


@dataclass(frozen=True)
class PoolObservation:
    """What the autoscaler sees at a check."""

    time_hours: float
    pool_gpus: int
    """GPUs paid for: ready plus still provisioning."""
    busy_gpus: int
    queued_jobs: int
    queued_gpus: int

    @property
    def load(self) -> float:
        """Demand over supply: (busy + queued GPUs) / pool GPUs; inf for an empty pool."""
        demand = self.busy_gpus + self.queued_gpus
        if self.pool_gpus == 0:
            return math.inf if demand else 0.0
        return demand / self.pool_gpus


@dataclass(frozen=True)
class AutoscaleConfig:
    """Settings of the robust autoscaler. Times in minutes."""

    min_gpus: int = 0
    max_gpus: int = 32
    scale_up_load: float = 0.8
    """Grow when load is above this (and jobs wait)."""
    scale_down_load: float = 0.3
    """Shrink when load is below this (and nothing waits)."""
    up_checks: int = 2
    """Consecutive checks the grow signal must hold."""
    down_checks: int = 10
    """Consecutive checks the shrink signal must hold."""
    cooldown_up_minutes: float = 5.0
    """No growth sooner than this after the previous action."""
    cooldown_down_minutes: float = 20.0
    """No shrinking sooner than this after the previous action."""
    target_load: float = 0.6
    """Shrinking removes idle GPUs until load would reach this."""

    def __post_init__(self) -> None:
        if not 0 <= self.min_gpus <= self.max_gpus or self.max_gpus < 1:
            raise UserError(
                f"need 0 <= min_gpus <= max_gpus, max >= 1: {self.min_gpus}, {self.max_gpus}"
            )
        if not 0 < self.scale_down_load < self.target_load < self.scale_up_load:
            raise UserError("need 0 < scale_down_load < target_load < scale_up_load")
        if self.up_checks < 1 or self.down_checks < 1:
            raise UserError("up_checks and down_checks must be >= 1")


class FixedPool:
    """Never scales."""

    name = "fixed"

    def decide(self, obs: PoolObservation) -> int:
        return 0


class ThresholdPolicy:
    """The plain rule: load > 0.8 adds `step_up` GPUs, load < 0.3 removes `step_down`."""

    name = "threshold"

    def __init__(self, config: AutoscaleConfig, step_up: int = 2, step_down: int = 1) -> None:
        self.config, self.step_up, self.step_down = config, step_up, step_down

    def decide(self, obs: PoolObservation) -> int:
        if obs.load > self.config.scale_up_load:
            return min(self.step_up, self.config.max_gpus - obs.pool_gpus)
        if obs.load < self.config.scale_down_load:
            return -min(self.step_down, obs.pool_gpus - self.config.min_gpus)
        return 0


class AutoscalePolicy:
    """Queue depth + load with hysteresis, cooldown and min/max (see module docstring)."""

    name = "autoscale"

    def __init__(self, config: AutoscaleConfig) -> None:
        self.config = config
        self._up_streak = 0
        self._down_streak = 0
        self._last_action_hours = -math.inf

    def decide(self, obs: PoolObservation) -> int:
        cfg = self.config
        grow = obs.queued_jobs > 0 and obs.load > cfg.scale_up_load
        shrink = obs.queued_jobs == 0 and obs.load < cfg.scale_down_load
        self._up_streak = self._up_streak + 1 if grow else 0
        self._down_streak = self._down_streak + 1 if shrink else 0
        since_minutes = (obs.time_hours - self._last_action_hours) * 60.0
        change = 0
        if self._up_streak >= cfg.up_checks and since_minutes >= cfg.cooldown_up_minutes:
            wanted = obs.busy_gpus + obs.queued_gpus
            change = min(max(wanted - obs.pool_gpus, 1), cfg.max_gpus - obs.pool_gpus)
        elif self._down_streak >= cfg.down_checks and since_minutes >= cfg.cooldown_down_minutes:
            keep = max(cfg.min_gpus, math.ceil(obs.busy_gpus / cfg.target_load))
            change = -max(0, obs.pool_gpus - keep)
        if obs.pool_gpus < cfg.min_gpus:
            change = cfg.min_gpus - obs.pool_gpus
        if change:
            self._last_action_hours = obs.time_hours
            self._up_streak = self._down_streak = 0
        return change


def load_jobs(path: str | Path) -> list[JobSpec]:
    """Read a job trace CSV (submit_hours,gpus,duration_hours[,name]), sorted by submit time."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"job trace {path} not found")
    jobs: list[JobSpec] = []
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        needed = ("submit_hours", "gpus", "duration_hours")
        missing = [c for c in needed if c not in (reader.fieldnames or [])]
        if missing:
            raise DataError(path, f"missing column(s) {', '.join(missing)}", line=1)
        for line, row in enumerate(reader, start=2):
            jobs.append(_job_from_row(row, path, line, len(jobs)))
    if not jobs:
        raise DataError(path, "no jobs after the header", line=1)
    return sorted(jobs, key=lambda job: job.submit_hours)


def _job_from_row(row: dict[str, str], path: Path, line: int, index: int) -> JobSpec:
    try:
        submit, gpus = float(row["submit_hours"]), int(row["gpus"])
        duration = float(row["duration_hours"])
    except (TypeError, ValueError) as error:
        raise DataError(path, f"not a number: {error}", line=line) from error
    if submit < 0 or gpus < 1 or not duration > 0:
        raise DataError(path, "need submit_hours >= 0, gpus >= 1, duration_hours > 0", line=line)
    return JobSpec(row.get("name") or f"job{index}", submit, gpus, duration)


def synthetic_jobs(
    *, count: int = 60, seed: int = 0, hours: float = 24.0, burst_every_hours: float = 6.0
) -> list[JobSpec]:
    """Bursty seeded arrivals: jobs cluster at the start of every `burst_every_hours`."""
    rng = random.Random(seed)
    jobs = []
    for index in range(count):
        burst = rng.randrange(max(1, int(hours // burst_every_hours)))
        submit = burst * burst_every_hours + rng.expovariate(1.0 / 0.5)
        gpus = rng.choice((1, 1, 2, 4, 8))
        jobs.append(JobSpec(f"job{index}", round(submit, 3), gpus, round(rng.uniform(0.3, 3.0), 3)))
    return sorted(jobs, key=lambda job: job.submit_hours)


def save_jobs(jobs: list[JobSpec], path: str | Path) -> Path:
    path = Path(path)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("name", "submit_hours", "gpus", "duration_hours"))
        for job in jobs:
            writer.writerow((job.name, job.submit_hours, job.gpus, job.duration_hours))
    return path
