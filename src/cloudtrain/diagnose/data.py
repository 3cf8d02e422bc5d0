"""A run's recorded telemetry, gathered once for the rules, with the small statistics they
share. Everything here is pure: rules receive a `RunData` and never touch the store."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cloudtrain.catalog import GPUSpec
from cloudtrain.store import SYNC_WAIT_KEY, Event, Run, Sample, StepRecord

WARMUP_STEPS = 3
"""Steps skipped at the start of a run (and of each resume): compilation, cudnn autotuning
and allocator warm-up make them unrepresentative."""

FP32_NAMES = {"fp32", "float32", "32", "32-true", "no", "none", "full"}
HALF_NAMES = {"bf16", "bfloat16", "bf16-mixed", "fp16", "float16", "16-mixed", "amp", "fp8"}


@dataclass(frozen=True)
class RunData:
    """What the rules look at. `gpu` is the catalog spec of the run's GPU (None: unknown)."""

    run: Run
    steps: list[StepRecord]
    samples: list[Sample]
    events: list[Event]
    gpu: GPUSpec | None = None

    @property
    def main_steps(self) -> list[StepRecord]:
        """Rank-0 steps after warm-up (all ranks' when rank 0 recorded none)."""
        ranked = [s for s in self.steps if s.rank == 0] or list(self.steps)
        return ranked[WARMUP_STEPS:] if len(ranked) > 2 * WARMUP_STEPS else ranked

    @property
    def ranks(self) -> list[int]:
        return sorted({s.rank for s in self.steps})

    def gpu_indices(self) -> list[int]:
        found = set()
        for sample in self.samples:
            for key in sample.metrics:
                parts = key.split("/")
                if len(parts) == 3 and parts[0] == "gpu" and parts[1].isdigit():
                    found.add(int(parts[1]))
        return sorted(found)

    def series(self, key: str) -> list[float]:
        """Values of one sample key, Nones dropped."""
        return [v for s in self.samples if (v := s.metrics.get(key)) is not None]

    def gpu_mean_per_sample(self, name: str) -> list[float]:
        """Per sample, the mean of `gpu/i/<name>` over GPUs (samples without it dropped)."""
        indices = self.gpu_indices()
        out = []
        for sample in self.samples:
            values = [
                v for i in indices if (v := sample.metrics.get(f"gpu/{i}/{name}")) is not None
            ]
            if values:
                out.append(sum(values) / len(values))
        return out

    def config_value(self, *names: str) -> Any:
        """The first of `names` found in the run's summary or config (one level deep)."""
        for source in (self.run.summary, self.run.config):
            for name in names:
                if name in source and source[name] is not None:
                    return source[name]
            for value in source.values():
                if isinstance(value, dict):
                    for name in names:
                        if value.get(name) is not None:
                            return value[name]
        return None

    def precision(self) -> str | None:
        """'fp32' or 'half' (bf16/fp16/fp8) as recorded; None when unknown or 'auto'."""
        value = self.config_value("resolved_precision", "precision", "mixed_precision", "dtype")
        text = str(value).lower() if value is not None else ""
        if text in FP32_NAMES:
            return "fp32"
        if text in HALF_NAMES:
            return "half"
        return None

    def tf32_enabled(self) -> bool | None:
        value = self.config_value("tf32", "allow_tf32", "float32_matmul_precision")
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            return value.lower() in ("high", "medium", "true", "1")
        return None

    def memory_peak_fraction(self) -> float | None:
        """Highest share of GPU memory used: from samples, else from step peaks and the
        catalog's memory size."""
        fractions = []
        for i in self.gpu_indices():
            for s in self.samples:
                used = s.metrics.get(f"gpu/{i}/memory_used_gib")
                total = s.metrics.get(f"gpu/{i}/memory_total_gib")
                if used is not None and total:
                    fractions.append(used / total)
        if fractions:
            return max(fractions)
        peaks = [s.memory_peak_gib or s.memory_reserved_gib for s in self.steps]
        peaks = [p for p in peaks if p is not None]
        if peaks and self.gpu is not None:
            return max(peaks) / self.gpu.memory_gib
        return None


def median(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def mean(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def share(parts: Sequence[tuple[float | None, float | None]]) -> float | None:
    """Median over steps of part / whole (pairs where both are known and whole > 0); None
    when there are none. The median keeps one hung step from hiding a steady share."""
    return median(p / w for p, w in parts if p is not None and w)


COMM_KEYS = ("time/comm_s", "time/comm_wait_s", "comm_s", "time/allreduce_s")
"""StepRecord.metrics keys holding seconds of a step spent in (non-overlapped) collectives."""


def comm_s(step: StepRecord) -> float | None:
    for key in COMM_KEYS:
        if step.metrics.get(key) is not None:
            return float(step.metrics[key])
    return None


def sync_wait_s(step: StepRecord) -> float:
    """Seconds of the step this rank spent waiting for other ranks (0 when unknown)."""
    return float(step.metrics.get(SYNC_WAIT_KEY) or 0.0)
