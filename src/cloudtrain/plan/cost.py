"""Time to finish, spot risk, cost and energy of one candidate.

Time: provisioning + training + checkpoint writes (+ interruptions on spot).

Spot hazard. Providers publish the share of spot capacity reclaimed over a month
(AWS bands: <5%, 5-10%, ...; the mid-point is used). Read as the chance f that one
instance is interrupted within a month (730 h) at a constant hazard:

    λ = -ln(1 - f) / 730   interruptions per node-hour

A job on n nodes is interrupted at n·λ. Checkpoints every Young (1974) interval
τ = sqrt(2·C·M) (C seconds to write one, M = 1 / (n·λ) the job's mean time between
interruptions), but never less often than on-demand runs checkpoint. Each interruption
costs `restart_s` plus the work since the last checkpoint, τ/2 on average. Expected
wall time T solves T = W + n·λ·T·(restart + τ/2), W the training and checkpoint time:

    T = W / (1 - n·λ·(restart + τ/2))

Energy: (GPUs x TDP x power fraction + GPUs x host power) x hours x PUE;
CO2e = kWh x the region's grid intensity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cloudtrain.plan.assumptions import Assumptions

HOURS_PER_MONTH = 730.0


def hazard_per_node_hour(monthly_rate: float) -> float:
    """Interruptions per node-hour from a monthly interrupted share (see module doc)."""
    if monthly_rate <= 0:
        return 0.0
    return -math.log(1.0 - min(monthly_rate, 0.999)) / HOURS_PER_MONTH


def young_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's optimal checkpoint interval sqrt(2·C·MTBF), seconds."""
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


@dataclass(frozen=True)
class Timeline:
    """Expected wall time of a run, seconds, and what it is made of."""

    train_s: float
    checkpoint_s: float
    """Time spent writing checkpoints."""
    interruption_s: float
    """Expected time lost to interruptions (restarts + redone work)."""
    provision_s: float
    total_s: float
    checkpoint_interval_s: float
    expected_interruptions: float
    hazard_per_hour: float
    """Interruptions per hour of the whole job (0 off spot)."""


def timeline(
    train_s: float,
    checkpoint_write_s: float,
    nodes: int,
    *,
    hazard_per_node_hour_: float,
    assumptions: Assumptions,
) -> Timeline | None:
    """The expected timeline; None when interruptions come too often to finish
    (each one costs more than the time between them)."""
    job_hazard_per_s = nodes * hazard_per_node_hour_ / 3600.0
    if job_hazard_per_s <= 0:
        interval = assumptions.checkpoint_interval_s
        checkpoints = math.floor(train_s / interval)
        ckpt_s = checkpoints * checkpoint_write_s
        total = assumptions.provision_s + train_s + ckpt_s
        return Timeline(train_s, ckpt_s, 0.0, assumptions.provision_s, total, interval, 0.0, 0.0)
    young = young_interval_s(checkpoint_write_s, 1.0 / job_hazard_per_s)
    interval = min(young, assumptions.checkpoint_interval_s)
    ckpt_s = train_s / interval * checkpoint_write_s
    loss_per_interruption = assumptions.restart_s + interval / 2.0
    denominator = 1.0 - job_hazard_per_s * loss_per_interruption
    if denominator <= 0.05:
        return None
    running = (train_s + ckpt_s) / denominator
    interruptions = job_hazard_per_s * running
    return Timeline(
        train_s=train_s,
        checkpoint_s=ckpt_s,
        interruption_s=running - train_s - ckpt_s,
        provision_s=assumptions.provision_s,
        total_s=assumptions.provision_s + running,
        checkpoint_interval_s=interval,
        expected_interruptions=interruptions,
        hazard_per_hour=job_hazard_per_s * 3600.0,
    )


def energy_kwh(
    gpus: int, tdp_w: float, hours: float, pue: float, assumptions: Assumptions
) -> float:
    """Facility energy of `gpus` GPUs (and their host share) running for `hours`."""
    power_w = gpus * (tdp_w * assumptions.gpu_power_fraction + assumptions.host_power_w_per_gpu)
    return power_w * hours / 1000.0 * pue
