"""GPU readings: NVML values (through the `Nvml` chokepoint) turned into `GPUSnapshot`s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cloudtrain.monitor.energy import CounterMeter
from cloudtrain.monitor.nvml import GPM_ACTIVITY, Nvml
from cloudtrain.monitor.snapshots import GPUSnapshot

GIB = 1024**3

# NVML enum values used below (nvml.h).
TEMPERATURE_GPU = 0
CLOCK_SM = 1
PCIE_TX_BYTES = 0
PCIE_RX_BYTES = 1
ECC_CORRECTED = 0
ECC_UNCORRECTED = 1
ECC_VOLATILE = 0


def _attr(value: Any, name: str) -> Any:
    return None if value is None else getattr(value, name, None)


def _scaled(value: Any, factor: float) -> float | None:
    return None if value is None else float(value) * factor


@dataclass(frozen=True)
class GPUStatic:
    """What does not change while we watch."""

    name: str
    uuid: str | None
    memory_total_gib: float | None
    sm_clock_max_mhz: float | None
    power_limit_w: float | None


class GPUReader:
    """Reads every GPU once per `read()`; keeps energy meters and cached static facts."""

    def __init__(self, nvml: Nvml, *, gpm: bool = True) -> None:
        self.nvml = nvml
        self.count = nvml.device_count()
        self.gpm = gpm
        self._static = [self._read_static(i) for i in range(self.count)]
        self._meters = [CounterMeter() for _ in range(self.count)]

    def _read_static(self, i: int) -> GPUStatic:
        q = self.nvml.query
        memory = q(i, "nvmlDeviceGetMemoryInfo")
        return GPUStatic(
            name=str(q(i, "nvmlDeviceGetName") or f"GPU {i}"),
            uuid=q(i, "nvmlDeviceGetUUID"),
            memory_total_gib=_scaled(_attr(memory, "total"), 1 / GIB),
            sm_clock_max_mhz=_scaled(q(i, "nvmlDeviceGetMaxClockInfo", CLOCK_SM), 1.0),
            power_limit_w=_scaled(q(i, "nvmlDeviceGetEnforcedPowerLimit"), 1e-3),
        )

    def _throttle(self, i: int) -> int | None:
        reasons = self.nvml.query(i, "nvmlDeviceGetCurrentClocksEventReasons")
        if reasons is None:
            reasons = self.nvml.query(i, "nvmlDeviceGetCurrentClocksThrottleReasons")
        return None if reasons is None else int(reasons)

    def _processes(self, i: int) -> int | None:
        procs = self.nvml.query(i, "nvmlDeviceGetComputeRunningProcesses")
        return None if procs is None else len(procs)

    def read_one(self, i: int, time_s: float) -> GPUSnapshot:
        q = self.nvml.query
        static = self._static[i]
        util = q(i, "nvmlDeviceGetUtilizationRates")
        memory = q(i, "nvmlDeviceGetMemoryInfo")
        power_w = _scaled(q(i, "nvmlDeviceGetPowerUsage"), 1e-3)
        counter_j = _scaled(q(i, "nvmlDeviceGetTotalEnergyConsumption"), 1e-3)
        meter = self._meters[i]
        meter.update(time_s, counter_j=counter_j, power_w=power_w)
        gpm = q(i, GPM_ACTIVITY) if self.gpm else None
        return GPUSnapshot(
            index=i,
            name=static.name,
            uuid=static.uuid,
            util_pct=_scaled(_attr(util, "gpu"), 1.0),
            memory_util_pct=_scaled(_attr(util, "memory"), 1.0),
            memory_used_gib=_scaled(_attr(memory, "used"), 1 / GIB),
            memory_total_gib=static.memory_total_gib,
            power_w=power_w,
            power_limit_w=static.power_limit_w,
            energy_j=meter.energy_j,
            energy_from_counter=meter.from_counter,
            temperature_c=_scaled(q(i, "nvmlDeviceGetTemperature", TEMPERATURE_GPU), 1.0),
            sm_clock_mhz=_scaled(q(i, "nvmlDeviceGetClockInfo", CLOCK_SM), 1.0),
            sm_clock_max_mhz=static.sm_clock_max_mhz,
            throttle_reasons=self._throttle(i),
            # NVML reports PCIe throughput in KB/s
            pcie_rx_mib_per_s=_scaled(q(i, "nvmlDeviceGetPcieThroughput", PCIE_RX_BYTES), 1 / 1024),
            pcie_tx_mib_per_s=_scaled(q(i, "nvmlDeviceGetPcieThroughput", PCIE_TX_BYTES), 1 / 1024),
            ecc_uncorrected_volatile=_int(
                q(i, "nvmlDeviceGetTotalEccErrors", ECC_UNCORRECTED, ECC_VOLATILE)
            ),
            ecc_corrected_volatile=_int(
                q(i, "nvmlDeviceGetTotalEccErrors", ECC_CORRECTED, ECC_VOLATILE)
            ),
            sm_active_pct=None if gpm is None else float(gpm[0]),
            tensor_active_pct=None if gpm is None else float(gpm[1]),
            process_count=self._processes(i),
        )

    def read(self, time_s: float) -> tuple[GPUSnapshot, ...]:
        """One snapshot per GPU (empty without NVML)."""
        return tuple(self.read_one(i, time_s) for i in range(self.count))


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
