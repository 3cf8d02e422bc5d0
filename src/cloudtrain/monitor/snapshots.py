"""Immutable readings of the machine at one moment. Dashboards, alerts and the store draw
from these, never from NVML or psutil directly.

Every optional field is None when the reading is not supported on this device or
platform (or, for rates, on the first reading, which has no previous one to compare).
"""

from __future__ import annotations

from dataclasses import dataclass

# NVML clock-event ("throttle") reason bits (nvml.h, nvmlClocksEventReason*).
THROTTLE_GPU_IDLE = 0x1
THROTTLE_APP_CLOCKS = 0x2
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_HW_SLOWDOWN = 0x8
THROTTLE_SYNC_BOOST = 0x10
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80
THROTTLE_DISPLAY_CLOCKS = 0x100

THROTTLE_NAMES = {
    THROTTLE_SW_POWER_CAP: "power cap",
    THROTTLE_HW_SLOWDOWN: "hardware slowdown",
    THROTTLE_SW_THERMAL: "software thermal",
    THROTTLE_HW_THERMAL: "hardware thermal",
    THROTTLE_HW_POWER_BRAKE: "power brake",
}
"""The reasons that cost speed under load (idle, app clocks, sync boost do not)."""

THERMAL_MASK = THROTTLE_SW_THERMAL | THROTTLE_HW_THERMAL
POWER_MASK = THROTTLE_SW_POWER_CAP | THROTTLE_HW_POWER_BRAKE | THROTTLE_HW_SLOWDOWN
SLOWDOWN_MASK = THERMAL_MASK | POWER_MASK


def throttle_names(mask: int | None) -> list[str]:
    """Names of the speed-costing reasons set in `mask` (empty for None or none set)."""
    if not mask:
        return []
    return [name for bit, name in THROTTLE_NAMES.items() if mask & bit]


@dataclass(frozen=True)
class GPUSnapshot:
    """One GPU at one moment."""

    index: int
    name: str
    """Device name as NVML prints it, e.g. 'NVIDIA H100 80GB HBM3'."""
    uuid: str | None = None
    util_pct: float | None = None
    """Share of the last sample period in which a kernel ran (NVML 'gpu' utilization)."""
    memory_util_pct: float | None = None
    """Share of time device memory was read or written."""
    memory_used_gib: float | None = None
    memory_total_gib: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    """Enforced power limit."""
    energy_j: float | None = None
    """Energy since the meter started: total-energy counter differences, or integrated power
    where the counter is missing; None when neither is available."""
    energy_from_counter: bool = False
    """True when `energy_j` comes from the hardware energy counter."""
    temperature_c: float | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    throttle_reasons: int | None = None
    """Bitmask of NVML clock-event reasons (THROTTLE_* constants)."""
    pcie_rx_mib_per_s: float | None = None
    pcie_tx_mib_per_s: float | None = None
    ecc_uncorrected_volatile: int | None = None
    """Uncorrected ECC errors since the driver loaded; None where ECC is off/unsupported."""
    ecc_corrected_volatile: int | None = None
    sm_active_pct: float | None = None
    """GPM SM activity (Hopper and newer); None elsewhere or on the first reading."""
    tensor_active_pct: float | None = None
    """GPM tensor-core activity (Hopper and newer)."""
    process_count: int | None = None
    """Compute processes on this GPU; None when NVML cannot list them."""

    @property
    def memory_used_fraction(self) -> float | None:
        if self.memory_used_gib is None or not self.memory_total_gib:
            return None
        return self.memory_used_gib / self.memory_total_gib

    @property
    def throttling(self) -> list[str]:
        """Speed-costing throttle reasons active now (e.g. ['power cap'])."""
        return throttle_names(self.throttle_reasons)


@dataclass(frozen=True)
class ProcessSnapshot:
    """The training process and its children (DataLoader workers, torchrun ranks)."""

    pid: int
    name: str
    cpu_pct: float | None
    """CPU of the whole tree in % of one core (400 = four cores busy); None first time."""
    rss_gib: float
    num_procs: int
    num_threads: int
    running: bool


@dataclass(frozen=True)
class HostSnapshot:
    """The host at one moment. Rates are over the interval since the previous reading."""

    hostname: str
    cpu_count: int
    cpu_pct: float | None
    """Mean over all cores, 0..100; None on the first reading."""
    cpu_per_core_pct: tuple[float, ...]
    """Each core 0..100; empty on the first reading."""
    ram_used_gib: float
    ram_total_gib: float
    disk_read_mib_per_s: float | None = None
    disk_write_mib_per_s: float | None = None
    net_rx_mib_per_s: float | None = None
    net_tx_mib_per_s: float | None = None
    load_avg_1m: float | None = None
    cpu_power_w: float | None = None
    """CPU package power: RAPL where readable, else an estimate (see cpu_power_estimated)."""
    cpu_power_estimated: bool = False
    cpu_energy_j: float | None = None
    """CPU energy since the meter started."""
    process: ProcessSnapshot | None = None
    """The watched training process tree; None when none is watched."""

    @property
    def saturated_cores(self) -> int:
        """Cores busier than 90%."""
        return sum(1 for pct in self.cpu_per_core_pct if pct >= 90.0)


@dataclass(frozen=True)
class Snapshot:
    """Everything read in one tick."""

    time_unix_s: float
    gpus: tuple[GPUSnapshot, ...]
    host: HostSnapshot
    nvml_available: bool
    nvml_unavailable_reason: str | None = None
    """Why there are no GPU readings ('NVML library not found ...'); None when NVML works."""
