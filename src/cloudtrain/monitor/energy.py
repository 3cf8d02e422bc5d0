"""Energy meters: GPU energy from NVML's total-energy counter (or integrated power), CPU
energy from RAPL (or an estimate from TDP and load).

NVML's `nvmlDeviceGetTotalEnergyConsumption` counts millijoules since the driver loaded
(Volta and newer); we take differences. Where it is missing we integrate power over time
(trapezoids). RAPL lives in /sys/class/powercap/intel-rapl:N/energy_uj (microjoules,
wrapping at max_energy_range_uj; root-only on kernels since 2020 - see CVE-2020-8694).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from cloudtrain.catalog import Catalog, lookup

RAPL_ROOT = Path("/sys/class/powercap")
_PACKAGE_DOMAIN = re.compile(r"^intel-rapl:\d+$")

DEFAULT_CPU_TDP_W = 85.0
"""Assumed CPU package TDP when the real one is unknown: the fallback CodeCarbon uses
(codecarbon docs, 'Methodology: CPU'). Only used for estimates, which are labelled so."""


@dataclass
class CounterMeter:
    """Energy of one device since the meter started, from a cumulative counter when there
    is one, else by integrating power. Feed it one reading per tick with `update`."""

    energy_j: float | None = None
    from_counter: bool = False
    _first_counter_j: float | None = None
    _last_counter_j: float | None = None
    _last_power_w: float | None = None
    _last_time_s: float | None = None

    def update(self, time_s: float, *, counter_j: float | None, power_w: float | None) -> None:
        """Account for one reading: `counter_j` the device's cumulative energy counter
        (None when it has none), `power_w` its current power (None when unknown)."""
        if counter_j is not None:
            self._from_counter(counter_j)
        elif power_w is not None and not self.from_counter:
            self._integrate(time_s, power_w)
        self._last_time_s = time_s
        self._last_power_w = power_w

    def _from_counter(self, counter_j: float) -> None:
        if self._first_counter_j is None or (
            self._last_counter_j is not None and counter_j < self._last_counter_j
        ):
            # first reading, or the counter reset (driver reload): restart the baseline
            base = self.energy_j if self.from_counter and self.energy_j else 0.0
            self._first_counter_j = counter_j - base
        self._last_counter_j = counter_j
        self.energy_j = counter_j - self._first_counter_j
        self.from_counter = True

    def _integrate(self, time_s: float, power_w: float) -> None:
        if self.energy_j is None:
            self.energy_j = 0.0
        if self._last_time_s is not None and self._last_power_w is not None:
            dt_s = max(0.0, time_s - self._last_time_s)
            self.energy_j += 0.5 * (power_w + self._last_power_w) * dt_s


@dataclass(frozen=True)
class RaplDomain:
    name: str
    energy_path: Path
    max_energy_uj: float | None


def rapl_domains(root: Path = RAPL_ROOT) -> list[RaplDomain]:
    """CPU package domains whose energy counter this process can read (often none:
    RAPL is root-only on recent kernels, and absent in most VMs)."""
    domains: list[RaplDomain] = []
    if not root.is_dir():
        return domains
    for path in sorted(root.iterdir()):
        if not _PACKAGE_DOMAIN.match(path.name):
            continue
        energy = path / "energy_uj"
        try:
            energy.read_text()
        except OSError:
            continue
        try:
            max_uj: float | None = float((path / "max_energy_range_uj").read_text())
        except (OSError, ValueError):
            max_uj = None
        domains.append(RaplDomain(path.name, energy, max_uj))
    return domains


class RaplMeter:
    """CPU package energy from RAPL counters, wrap-around handled."""

    def __init__(self, domains: list[RaplDomain]) -> None:
        self.domains = domains
        self._last_uj: dict[str, float] = {}
        self.energy_j = 0.0

    def read(self) -> float | None:
        """Energy (J) since the first read; None when a counter stopped being readable."""
        for domain in self.domains:
            try:
                now_uj = float(domain.energy_path.read_text())
            except (OSError, ValueError):
                return None
            last = self._last_uj.get(domain.name)
            if last is not None:
                delta = now_uj - last
                if delta < 0 and domain.max_energy_uj:
                    delta += domain.max_energy_uj
                self.energy_j += max(0.0, delta) / 1e6
            self._last_uj[domain.name] = now_uj
        return self.energy_j


def estimate_cpu_power_w(cpu_pct: float, tdp_w: float = DEFAULT_CPU_TDP_W) -> float:
    """Estimated CPU package power: TDP times the load fraction. A rough model: it
    ignores idle power, so it under-counts lightly loaded hosts."""
    return tdp_w * max(0.0, min(100.0, cpu_pct)) / 100.0


class CpuEnergyMeter:
    """CPU energy since start: RAPL where readable, else TDP x load integrated over time."""

    def __init__(self, *, rapl_root: Path = RAPL_ROOT, tdp_w: float = DEFAULT_CPU_TDP_W):
        domains = rapl_domains(rapl_root)
        self.rapl = RaplMeter(domains) if domains else None
        self.tdp_w = tdp_w
        self._estimate = CounterMeter()
        self._last_rapl: tuple[float, float] | None = None

    @property
    def estimated(self) -> bool:
        return self.rapl is None

    def update(self, time_s: float, cpu_pct: float | None) -> tuple[float | None, float | None]:
        """(power_w, energy_j) after this reading; None where not yet known."""
        if self.rapl is not None:
            energy = self.rapl.read()
            if energy is not None:
                power = None
                if self._last_rapl is not None and time_s > self._last_rapl[0]:
                    power = (energy - self._last_rapl[1]) / (time_s - self._last_rapl[0])
                self._last_rapl = (time_s, energy)
                return power, energy
            self.rapl = None  # became unreadable: fall back to the estimate
        if cpu_pct is None:
            return None, self._estimate.energy_j
        power_w = estimate_cpu_power_w(cpu_pct, self.tdp_w)
        self._estimate.update(time_s, counter_j=None, power_w=power_w)
        return power_w, self._estimate.energy_j


WORLD_GCO2E_PER_KWH = 475.0
"""World average grid intensity 2023 (Our World in Data, CC BY 4.0); used only when the
catalog has no WORLD row."""


def carbon_intensity(
    catalog: Catalog, provider: str | None, region: str | None
) -> tuple[float, str]:
    """(gCO2e/kWh, where it came from) for a run's region: the region's own figure, else
    its country's grid, else the world average."""
    if provider and region:
        found = lookup.region(catalog, provider, region)
        if found is not None and found.gco2e_per_kwh is not None:
            return found.gco2e_per_kwh, f"region {provider}/{region}"
        if found is not None:
            country = lookup.grid_intensity(catalog, found.country)
            if country is not None:
                return country, f"country {found.country}"
    world = lookup.grid_intensity(catalog, "WORLD")
    return (world if world is not None else WORLD_GCO2E_PER_KWH), "world average (region unknown)"


def pue_of(catalog: Catalog, provider: str | None) -> float:
    """The provider's PUE (the catalog's default for an unknown or missing provider)."""
    return lookup.pue_for(catalog, provider or "default")


def kg_co2e(it_energy_j: float, pue: float, gco2e_per_kwh: float) -> float:
    """Emissions of IT energy `it_energy_j` in a facility with `pue` on a grid."""
    return it_energy_j / 3.6e6 * pue * gco2e_per_kwh / 1000.0
