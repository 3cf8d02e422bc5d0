"""What a report shows, gathered from the store: per run its summary, its series over time
(downsampled), its events and findings, and its energy account."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cloudtrain.catalog import Catalog, load_catalog
from cloudtrain.diagnose import EnergyAccount, account_energy
from cloudtrain.store import Event, Finding, Run, RunStore, Sample, StepRecord

MAX_POINTS = 1500
"""Points per series at most; longer series are averaged into buckets."""


@dataclass(frozen=True)
class Series:
    """One line of a plot: `x_min` is minutes since the run started; None y values are gaps."""

    label: str
    x_min: list[float]
    y: list[float | None]


@dataclass(frozen=True)
class Plot:
    key: str
    title: str
    unit: str
    series: list[Series] = field(default_factory=list)

    @property
    def has_data(self) -> bool:
        return any(v is not None for s in self.series for v in s.y)


@dataclass(frozen=True)
class RunReport:
    run: Run
    steps: list[StepRecord]
    samples: list[Sample]
    events: list[Event]
    findings: list[Finding]
    energy: EnergyAccount

    @property
    def start_s(self) -> float:
        candidates = [self.run.started_at, self.run.created_at]
        candidates += [self.samples[0].time_unix_s] if self.samples else []
        candidates += [self.steps[0].time_unix_s] if self.steps else []
        return min(c for c in candidates if c)


def downsample(
    points: Sequence[tuple[float, float | None]], limit: int = MAX_POINTS
) -> list[tuple[float, float | None]]:
    """At most `limit` points: bucket means (a bucket of only None stays None, a gap)."""
    if len(points) <= limit:
        return list(points)
    size = len(points) / limit
    out = []
    for b in range(limit):
        bucket = points[int(b * size) : int((b + 1) * size)] or [points[-1]]
        values = [y for _, y in bucket if y is not None]
        out.append((bucket[len(bucket) // 2][0], sum(values) / len(values) if values else None))
    return out


def break_gaps(
    points: Sequence[tuple[float, float | None]], factor: float = 10.0
) -> list[tuple[float, float | None]]:
    """Insert a gap (None) where consecutive points are more than `factor` x the median
    spacing apart, so a line does not bridge a hang or a pause."""
    if len(points) < 3:
        return list(points)
    spacing = sorted(b[0] - a[0] for a, b in itertools.pairwise(points))
    limit = factor * max(spacing[len(spacing) // 2], 1e-9)
    out = [points[0]]
    for a, b in itertools.pairwise(points):
        if b[0] - a[0] > limit:
            out.append(((a[0] + b[0]) / 2, None))
        out.append(b)
    return out


def _series(label: str, points: list[tuple[float, float | None]], start_s: float) -> Series:
    kept = downsample(break_gaps(points))
    return Series(
        label,
        [round((t - start_s) / 60.0, 4) for t, _ in kept],
        [None if y is None else round(float(y), 6) for _, y in kept],
    )


def gpu_indices(samples: Sequence[Sample]) -> list[int]:
    found = set()
    for sample in samples[:50] + samples[-50:]:
        for key in sample.metrics:
            parts = key.split("/")
            if len(parts) == 3 and parts[0] == "gpu" and parts[1].isdigit():
                found.add(int(parts[1]))
    return sorted(found)


def _throughput(step: StepRecord) -> float | None:
    for key in ("throughput/tokens_per_sec", "throughput/samples_per_sec"):
        if step.metrics.get(key) is not None:
            return step.metrics[key]
    if step.samples and step.step_s:
        return step.samples / step.step_s
    return None


def _throughput_unit(steps: Sequence[StepRecord]) -> str:
    return (
        "tokens/s"
        if any("throughput/tokens_per_sec" in s.metrics for s in steps)
        else ("samples/s")
    )


def _over_gpus(
    samples: Sequence[Sample],
    indices: list[int],
    name: str,
    combine: Callable[[list[float]], float],
) -> list[tuple[float, float | None]]:
    out = []
    for s in samples:
        values = [v for i in indices if (v := s.metrics.get(f"gpu/{i}/{name}")) is not None]
        out.append((s.time_unix_s, combine(values) if values else None))
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def step_plots(report: RunReport, label: str) -> dict[str, Series]:
    start = report.start_s
    steps = report.steps
    return {
        "throughput": _series(label, [(s.time_unix_s, _throughput(s)) for s in steps], start),
        "mfu": _series(
            label, [(s.time_unix_s, None if s.mfu is None else 100 * s.mfu) for s in steps], start
        ),
        "loss": _series(label, [(s.time_unix_s, s.loss) for s in steps], start),
    }


def sample_plots(report: RunReport, label: str, per_gpu: bool) -> dict[str, list[Series]]:
    start, samples = report.start_s, report.samples
    indices = gpu_indices(samples)
    out: dict[str, list[Series]] = {}
    if per_gpu and len(indices) > 1:
        out["util"] = [
            _series(
                f"GPU {i}",
                [(s.time_unix_s, s.metrics.get(f"gpu/{i}/util_pct")) for s in samples],
                start,
            )
            for i in indices
        ]
        out["memory"] = [
            _series(
                f"GPU {i}",
                [(s.time_unix_s, s.metrics.get(f"gpu/{i}/memory_used_gib")) for s in samples],
                start,
            )
            for i in indices
        ]
    else:
        out["util"] = [_series(label, _over_gpus(samples, indices, "util_pct", _mean), start)]
        out["memory"] = [
            _series(label, _over_gpus(samples, indices, "memory_used_gib", max), start)
        ]
    out["power"] = [_series(label, _over_gpus(samples, indices, "power_w", sum), start)]
    out["temperature"] = [_series(label, _over_gpus(samples, indices, "temperature_c", max), start)]
    out["cpu"] = [
        _series(label, [(s.time_unix_s, s.metrics.get("host/cpu_pct")) for s in samples], start)
    ]
    price = report.run.price_usd_per_hour
    times = sorted({s.time_unix_s for s in samples} | {s.time_unix_s for s in report.steps})
    cost = [(t, price * (t - start) / 3600.0) for t in times] if price is not None else []
    out["cost"] = [_series(label, cost, start)]
    return out


PLOTS = (
    ("throughput", "Throughput", ""),
    ("mfu", "MFU", "%"),
    ("loss", "Loss", ""),
    ("util", "GPU utilization", "%"),
    ("memory", "GPU memory used", "GiB"),
    ("power", "GPU power (all GPUs)", "W"),
    ("temperature", "GPU temperature (hottest)", "°C"),
    ("cpu", "Host CPU", "%"),
    ("cost", "Cumulative cost", "USD"),
)


def build_plots(reports: Sequence[RunReport]) -> list[Plot]:
    """The report's plots; several runs overlay as one series each."""
    per_gpu = len(reports) == 1
    units = {r.run.id: _throughput_unit(r.steps) for r in reports}
    mixed = len(set(units.values())) > 1
    gathered: dict[str, list[Series]] = {key: [] for key, _, _ in PLOTS}
    for report in reports:
        label = report.run.name
        for key, series in step_plots(report, label).items():
            if key == "throughput" and mixed:
                series = Series(f"{label} ({units[report.run.id]})", series.x_min, series.y)
            gathered[key].append(series)
        for key, many in sample_plots(report, label, per_gpu).items():
            gathered[key].extend(many)
    unit = "" if mixed or not units else next(iter(units.values()))
    return [
        Plot(key, title, unit if key == "throughput" else u, gathered[key])
        for key, title, u in PLOTS
    ]


def gather(store: RunStore, ref: str, catalog: Catalog | None = None) -> RunReport:
    """One run's report data; energy from its stored summary when a diagnosis wrote it,
    else computed now."""
    run = store.get_run(ref)
    steps = store.steps(run.id, rank=0) or store.steps(run.id)
    samples = store.samples(run.id)
    catalog = catalog if catalog is not None else load_catalog()
    energy = account_energy(run, samples, catalog)
    return RunReport(run, steps, samples, store.events(run.id), store.findings(run.id), energy)


def summary_rows(report: RunReport) -> list[tuple[str, Any]]:
    """(label, value) rows of a run's summary table; values are plain (escaped later)."""
    run, energy = report.run, report.energy
    last = report.steps[-1] if report.steps else None
    gpus = (
        f"{run.gpu_count} x {run.gpu_name}"
        if run.gpu_name
        else (f"{run.gpu_count} GPU(s)" if run.gpu_count else "no GPU")
    )
    where = " / ".join(x for x in (run.provider, run.region, run.instance_type) if x) or "-"
    extra = run.config.get("extra") if isinstance(run.config.get("extra"), dict) else {}
    model = run.config.get("model") or extra.get("model")
    return [
        ("run", f"{run.name} ({run.id})"),
        ("status", run.status),
        ("model", model or "-"),
        ("hardware", gpus),
        ("host", run.host.get("hostname", "-") if run.host else "-"),
        ("provider / region / instance", where),
        ("command", " ".join(run.command) if run.command else "-"),
        ("duration", _hms(energy.duration_s)),
        ("steps", "-" if last is None else str(last.step)),
        ("price", "-" if run.price_usd_per_hour is None else f"${run.price_usd_per_hour:,.2f}/h"),
        ("cost", "-" if energy.cost_usd is None else f"${energy.cost_usd:,.2f}"),
        ("GPU energy", _kwh(energy.gpu_kwh)),
        (
            "CPU energy",
            _kwh(energy.cpu_kwh)
            + (" (estimated)" if energy.cpu_estimated and energy.cpu_kwh is not None else ""),
        ),
        ("PUE", f"{energy.pue:.2f}"),
        ("facility energy", _kwh(energy.facility_kwh)),
        (
            "carbon",
            "-"
            if energy.kg_co2e is None
            else f"{energy.kg_co2e:,.3f} kg CO2e at {energy.gco2e_per_kwh:.0f} g/kWh "
            f"({energy.carbon_source})",
        ),
    ]


def _kwh(value: float | None) -> str:
    return "-" if value is None else f"{value:,.3f} kWh"


def _hms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = round(seconds)
    return f"{s // 3600}h {s % 3600 // 60:02d}m {s % 60:02d}s"
