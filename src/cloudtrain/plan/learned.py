"""Learning from real runs: a Trainer run records its model's fingerprint, GPU,
precision, compile, optimizer and measured step time; a plan for the same model corrects
its roofline by what was measured.

The correction is the ratio measured / predicted, where the prediction is the roofline
for exactly what ran (that GPU, micro-batch, accumulation, compile, optimizer). The
ratio multiplies the roofline's step time on every GPU: what the roofline missed on one
GPU (a kernel slower than its rate row, host overhead) is taken to scale with the
roofline's own estimate elsewhere. Several runs: the geometric mean of their ratios.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from cloudtrain.plan.workload import OPTIMIZERS

WARMUP_RECORDS = 2
"""Logged steps skipped at the start of a run (compilation, allocator warm-up)."""


@dataclass(frozen=True)
class MeasuredRun:
    """What one recorded training run measured, as the planner needs it."""

    run_id: str
    fingerprint: str
    gpu: str
    """Canonical catalog GPU name."""
    precision: str
    micro_batch: int
    accumulation_steps: int
    compile: bool
    optimizer: str
    optimizer_impl: str
    step_s: float
    """Median seconds per optimizer step on one rank, without waiting for data."""


@dataclass(frozen=True)
class Correction:
    factor: float
    """Measured / predicted step time (geometric mean over the runs)."""
    runs: tuple[dict[str, Any], ...]
    """Per run: id, GPU, measured and predicted seconds."""

    @property
    def label(self) -> str:
        ids = ", ".join(f"{r['run_id']} on {r['gpu']}" for r in self.runs)
        return f"x{self.factor:.3g} from measured run{'s' if len(self.runs) > 1 else ''} {ids}"


def combine(ratios: list[tuple[MeasuredRun, float, float]]) -> Correction | None:
    """(run, measured s, predicted s) triples -> one correction; None for none."""
    usable = [(run, m, p) for run, m, p in ratios if m > 0 and p > 0]
    if not usable:
        return None
    factor = math.exp(statistics.fmean(math.log(m / p) for _, m, p in usable))
    runs = tuple(
        {"run_id": run.run_id, "gpu": run.gpu, "measured_s": m, "predicted_s": p}
        for run, m, p in usable
    )
    return Correction(factor, runs)


def measured_run(run: Any, steps: list[Any]) -> MeasuredRun | None:
    """A store Run (and its rank-0 StepRecords) as a MeasuredRun; None when it lacks a
    fingerprint, a catalog GPU or enough timed steps."""
    config = run.config or {}
    fingerprint = config.get("model_fingerprint")
    times = [
        s.step_s - (s.data_wait_s or 0.0)
        for s in steps[WARMUP_RECORDS:]
        if s.rank == 0 and s.step_s is not None and s.step_s > 0
    ]
    if not fingerprint or not run.gpu_name or not times:
        return None
    micro = int(config.get("micro_batch_size") or 0)
    world = int(config.get("world_size") or 1)
    global_batch = int(config.get("global_batch_size") or micro * world)
    if micro < 1:
        return None
    return MeasuredRun(
        run_id=run.id,
        fingerprint=str(fingerprint),
        gpu=run.gpu_name,
        precision=str(config.get("planner_precision") or config.get("precision") or "bf16"),
        micro_batch=micro,
        accumulation_steps=max(1, global_batch // (micro * world)),
        compile=bool(config.get("compile")),
        optimizer=_known_optimizer(config.get("optimizer_name")),
        optimizer_impl=str(config.get("optimizer_impl") or "foreach"),
        step_s=statistics.median(times),
    )


def _known_optimizer(name: Any) -> str:
    """A recorded optimizer's name as the planner prices it (AdamW for one it does not
    know: a two-moment optimizer is the common case)."""
    return str(name) if name in OPTIMIZERS else "adamw"


def runs_in_store(store: Any, fingerprint: str, limit: int = 200) -> list[MeasuredRun]:
    """Completed or stopped train runs of this model fingerprint, newest first."""
    found = []
    for run in store.list_runs(limit=limit):
        if run.kind != "train" or (run.config or {}).get("model_fingerprint") != fingerprint:
            continue
        measured = measured_run(run, store.steps(run.id))
        if measured is not None:
            found.append(measured)
    return found
