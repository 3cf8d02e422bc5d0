"""Energy, carbon and cost of a run, from its stored samples and the catalog.

GPU energy: the per-GPU `gpu/i/energy_j` series (counter differences, or integrated power,
written by the sampler), summed over GPUs; where a run has only `gpu/i/power_w`, power is
integrated here. CPU energy: `host/cpu_energy_j` (RAPL, or the TDP x load estimate the
sampler labels with `host/cpu_power_estimated`). Facility energy = IT energy x PUE of the
provider; CO2e = facility kWh x grid intensity of the run's region (its country's grid
where the region has no own figure, the world average where the region is unknown).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cloudtrain.catalog import Catalog, load_catalog
from cloudtrain.monitor.energy import carbon_intensity, pue_of
from cloudtrain.store import Run, Sample

J_PER_KWH = 3.6e6


@dataclass(frozen=True)
class EnergyAccount:
    """What a run used. kWh figures are None when the run has no readings for them."""

    gpu_kwh: float | None
    cpu_kwh: float | None
    cpu_estimated: bool
    """True when CPU energy is an estimate from TDP and load (no RAPL)."""
    pue: float
    facility_kwh: float | None
    """(GPU + CPU kWh) x PUE."""
    gco2e_per_kwh: float
    carbon_source: str
    """Where the intensity came from: 'region', 'country XXX' or 'world average'."""
    kg_co2e: float | None
    cost_usd: float | None
    """Instance price x duration; None without a price."""
    duration_s: float | None

    def as_summary(self) -> dict[str, float | str | bool | None]:
        """The flat figures stored in a run's summary under "energy"."""
        return {
            "gpu_kwh": self.gpu_kwh,
            "cpu_kwh": self.cpu_kwh,
            "cpu_estimated": self.cpu_estimated,
            "pue": self.pue,
            "facility_kwh": self.facility_kwh,
            "gco2e_per_kwh": self.gco2e_per_kwh,
            "carbon_source": self.carbon_source,
            "kg_co2e": self.kg_co2e,
            "cost_usd": self.cost_usd,
        }


def cumulative_total(values: Iterable[float | None]) -> float | None:
    """Energy from a cumulative series that may restart at zero (a new sampler): the sum
    of its increases. None when the series is empty."""
    total, last, seen = 0.0, None, False
    for value in values:
        if value is None:
            continue
        seen = True
        if last is not None:
            total += value - last if value >= last else value
        last = value
    return total if seen else None


def integrate_power_j(
    points: Sequence[tuple[float, float | None]], max_gap_s: float = 60.0
) -> float | None:
    """Trapezoidal energy (J) of (time_s, power_w) points; gaps over `max_gap_s` are
    skipped (the sampler was not running)."""
    total, previous, seen = 0.0, None, False
    for time_s, power in points:
        if power is None:
            continue
        seen = True
        if previous is not None and 0 < time_s - previous[0] <= max_gap_s:
            total += 0.5 * (power + previous[1]) * (time_s - previous[0])
        previous = (time_s, power)
    return total if seen else None


def _gpu_indices(samples: Sequence[Sample]) -> list[int]:
    found = set()
    for sample in samples:
        for key in sample.metrics:
            parts = key.split("/")
            if len(parts) == 3 and parts[0] == "gpu" and parts[1].isdigit():
                found.add(int(parts[1]))
    return sorted(found)


def gpu_energy_j(samples: Sequence[Sample]) -> float | None:
    """GPU energy of all GPUs over the samples; None without energy or power readings."""
    total, seen = 0.0, False
    for i in _gpu_indices(samples):
        energy = cumulative_total(s.metrics.get(f"gpu/{i}/energy_j") for s in samples)
        if energy is None:
            energy = integrate_power_j(
                [(s.time_unix_s, s.metrics.get(f"gpu/{i}/power_w")) for s in samples]
            )
        if energy is not None:
            total, seen = total + energy, True
    return total if seen else None


def account_energy(
    run: Run,
    samples: Sequence[Sample],
    catalog: Catalog | None = None,
    now_unix_s: float | None = None,
) -> EnergyAccount:
    """Energy, CO2e and cost of `run` from its samples."""
    catalog = catalog if catalog is not None else load_catalog()
    gpu_j = gpu_energy_j(samples)
    cpu_j = cumulative_total(s.metrics.get("host/cpu_energy_j") for s in samples)
    estimated = any(s.metrics.get("host/cpu_power_estimated") == 1.0 for s in samples)
    pue = pue_of(catalog, run.provider)
    intensity, source = carbon_intensity(catalog, run.provider, run.region)
    it_j = None if gpu_j is None and cpu_j is None else (gpu_j or 0.0) + (cpu_j or 0.0)
    facility_kwh = None if it_j is None else it_j / J_PER_KWH * pue
    return EnergyAccount(
        gpu_kwh=None if gpu_j is None else gpu_j / J_PER_KWH,
        cpu_kwh=None if cpu_j is None else cpu_j / J_PER_KWH,
        cpu_estimated=estimated,
        pue=pue,
        facility_kwh=facility_kwh,
        gco2e_per_kwh=intensity,
        carbon_source=source,
        kg_co2e=None if facility_kwh is None else facility_kwh * intensity / 1000.0,
        cost_usd=run.cost_usd(now_unix_s),
        duration_s=run.duration_s(now_unix_s),
    )
