"""Simulate a GPU pool serving a job trace under an autoscaling policy.

Time advances in checks of `check_minutes`. At each check: finished jobs free their
GPUs, new GPUs that finished provisioning become ready, waiting jobs start in
arrival order on free GPUs (a small job may pass a big one that does not fit yet),
then the policy sees the pool and may add GPUs (ready after `provision_minutes`,
paid from the request) or remove idle ones. Every GPU in the pool is paid for until
the last job finishes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from cloudtrain.errors import CloudtrainError, UserError
from cloudtrain.launch.autoscale import JobSpec, PoolObservation


class PoolPolicy(Protocol):
    name: str

    def decide(self, obs: PoolObservation) -> int:
        """GPUs to add (> 0) or remove (< 0) now."""
        ...


@dataclass(frozen=True)
class PoolSimResult:
    """Outcome of one policy on one job trace."""

    policy: str
    jobs: int
    gpu_hours: float
    """Paid GPU-hours (ready and provisioning)."""
    busy_gpu_hours: float
    utilization: float
    """busy_gpu_hours / gpu_hours."""
    cost_usd: float
    mean_wait_hours: float
    """Mean time from submission to start."""
    max_wait_hours: float
    makespan_hours: float
    """From time 0 to the last job's end."""
    scaling_actions: int
    peak_gpus: int
    price_usd_per_gpu_hour: float


@dataclass
class _Pool:
    ready_gpus: int
    busy_gpus: int = 0
    provisioning: list[list[float]] = field(default_factory=list)
    """[ready_at_hours, gpus] per request still provisioning."""
    running: list[tuple[float, int]] = field(default_factory=list)
    """(end_hours, gpus) per running job."""

    @property
    def total_gpus(self) -> int:
        return self.ready_gpus + int(sum(gpus for _, gpus in self.provisioning))

    def tick(self, now_hours: float) -> None:
        done = [job for job in self.running if job[0] <= now_hours + 1e-9]
        self.running = [job for job in self.running if job[0] > now_hours + 1e-9]
        self.busy_gpus -= sum(gpus for _, gpus in done)
        arrived = [req for req in self.provisioning if req[0] <= now_hours + 1e-9]
        self.provisioning = [req for req in self.provisioning if req[0] > now_hours + 1e-9]
        self.ready_gpus += int(sum(gpus for _, gpus in arrived))

    def remove(self, count: int) -> int:
        """Remove up to `count` GPUs: pending requests first, then idle ready ones."""
        removed = 0
        while self.provisioning and removed < count:
            request = self.provisioning[-1]
            take = int(min(request[1], count - removed))
            request[1] -= take
            removed += take
            if request[1] == 0:
                self.provisioning.pop()
        idle = self.ready_gpus - self.busy_gpus
        take_idle = min(idle, count - removed)
        self.ready_gpus -= take_idle
        return removed + take_idle


def _start_fitting(queue: list[JobSpec], pool: _Pool, now: float, waits: list[float]) -> float:
    """Start waiting jobs in arrival order wherever they fit; returns the latest end time."""
    last_end = 0.0
    for job in list(queue):
        if job.gpus <= pool.ready_gpus - pool.busy_gpus:
            queue.remove(job)
            pool.busy_gpus += job.gpus
            pool.running.append((now + job.duration_hours, job.gpus))
            waits.append(now - job.submit_hours)
            last_end = max(last_end, now + job.duration_hours)
    return last_end


def _check_fits(jobs: list[JobSpec], max_gpus: int) -> None:
    too_big = [job for job in jobs if job.gpus > max_gpus]
    if too_big:
        raise UserError(
            f"job {too_big[0].name} needs {too_big[0].gpus} GPUs but the pool has at most "
            f"{max_gpus}; raise --max-gpus"
        )


def simulate_pool(
    policy: PoolPolicy,
    jobs: list[JobSpec],
    *,
    initial_gpus: int,
    max_gpus: int,
    price_usd_per_gpu_hour: float = 1.0,
    check_minutes: float = 1.0,
    provision_minutes: float = 3.0,
) -> PoolSimResult:
    """Run the trace; `max_gpus` only checks that every job can ever fit."""
    _check_fits(jobs, max_gpus)
    step = check_minutes / 60.0
    pool = _Pool(ready_gpus=initial_gpus)
    pending = sorted(jobs, key=lambda job: job.submit_hours)
    queue: list[JobSpec] = []
    waits: list[float] = []
    gpu_hours = busy_hours = last_end = 0.0
    actions = peak = 0
    horizon = (pending[-1].submit_hours if pending else 0.0) + sum(j.duration_hours for j in jobs)
    now = 0.0
    while pending or queue or pool.running:
        if now > horizon + 24.0:
            raise CloudtrainError(f"policy {policy.name} left jobs waiting past {now:.0f} h")
        pool.tick(now)
        while pending and pending[0].submit_hours <= now + 1e-9:
            queue.append(pending.pop(0))
        last_end = max(last_end, _start_fitting(queue, pool, now, waits))
        queued_gpus = sum(j.gpus for j in queue)
        change = policy.decide(
            PoolObservation(now, pool.total_gpus, pool.busy_gpus, len(queue), queued_gpus)
        )
        if change > 0:
            pool.provisioning.append([now + provision_minutes / 60.0, change])
            actions += 1
        elif change < 0 and pool.remove(-change):
            actions += 1
        peak = max(peak, pool.total_gpus)
        if pending or queue or pool.running:
            gpu_hours += pool.total_gpus * step
            busy_hours += pool.busy_gpus * step
        now += step
    return PoolSimResult(
        policy=policy.name,
        jobs=len(jobs),
        gpu_hours=gpu_hours,
        busy_gpu_hours=busy_hours,
        utilization=busy_hours / gpu_hours if gpu_hours else 0.0,
        cost_usd=gpu_hours * price_usd_per_gpu_hour,
        mean_wait_hours=sum(waits) / len(waits) if waits else 0.0,
        max_wait_hours=max(waits, default=0.0),
        makespan_hours=last_end,
        scaling_actions=actions,
        peak_gpus=peak,
        price_usd_per_gpu_hour=price_usd_per_gpu_hour,
    )
