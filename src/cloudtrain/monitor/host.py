"""Host readings through psutil: CPU per core, RAM, disk and network IO, the training
process tree, and CPU energy. Rates are differences between consecutive `read()`s."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import psutil

from cloudtrain.monitor.energy import CpuEnergyMeter
from cloudtrain.monitor.snapshots import HostSnapshot, ProcessSnapshot

GIB = 1024**3
MIB = 1024**2


@dataclass(frozen=True)
class _Counters:
    time_s: float
    cpu_busy_s: tuple[float, ...]
    cpu_total_s: tuple[float, ...]
    disk_read_b: float | None
    disk_write_b: float | None
    net_rx_b: float | None
    net_tx_b: float | None


def _cpu_times() -> tuple[tuple[float, ...], tuple[float, ...]]:
    busy, total = [], []
    for times in psutil.cpu_times(percpu=True):
        all_s = sum(times)
        idle_s = times.idle + getattr(times, "iowait", 0.0)
        busy.append(all_s - idle_s)
        total.append(all_s)
    return tuple(busy), tuple(total)


def _read_counters(time_s: float) -> _Counters:
    busy, total = _cpu_times()
    disk = psutil.disk_io_counters()
    net = psutil.net_io_counters()
    return _Counters(
        time_s=time_s,
        cpu_busy_s=busy,
        cpu_total_s=total,
        disk_read_b=None if disk is None else float(disk.read_bytes),
        disk_write_b=None if disk is None else float(disk.write_bytes),
        net_rx_b=None if net is None else float(net.bytes_recv),
        net_tx_b=None if net is None else float(net.bytes_sent),
    )


def _rate(now: float | None, before: float | None, dt_s: float, unit: float) -> float | None:
    if now is None or before is None or dt_s <= 0:
        return None
    return max(0.0, now - before) / dt_s / unit


def _per_core(now: _Counters, before: _Counters) -> tuple[float, ...]:
    cores = []
    for busy_a, busy_b, tot_a, tot_b in zip(
        before.cpu_busy_s, now.cpu_busy_s, before.cpu_total_s, now.cpu_total_s, strict=False
    ):
        span = tot_b - tot_a
        cores.append(0.0 if span <= 0 else max(0.0, min(100.0, 100.0 * (busy_b - busy_a) / span)))
    return tuple(cores)


class ProcessTreeReader:
    """CPU, memory and size of a process and all its descendants."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._cpu_s: dict[int, float] = {}
        self._last_time_s: float | None = None
        try:
            self._root: psutil.Process | None = psutil.Process(pid)
        except psutil.Error:
            self._root = None

    def read(self, time_s: float) -> ProcessSnapshot:
        if self._root is None or not self._root.is_running():
            return ProcessSnapshot(self.pid, "", None, 0.0, 0, 0, running=False)
        try:
            procs = [self._root, *self._root.children(recursive=True)]
            name = self._root.name()
        except psutil.Error:
            return ProcessSnapshot(self.pid, "", None, 0.0, 0, 0, running=False)
        cpu_s: dict[int, float] = {}
        rss_b = 0.0
        threads = 0
        for proc in procs:
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    cpu_s[proc.pid] = times.user + times.system
                    rss_b += proc.memory_info().rss
                    threads += proc.num_threads()
            except psutil.Error:
                continue
        cpu_pct = None
        if self._last_time_s is not None and time_s > self._last_time_s:
            used = sum(max(0.0, s - self._cpu_s.get(pid, s)) for pid, s in cpu_s.items())
            cpu_pct = 100.0 * used / (time_s - self._last_time_s)
        self._cpu_s, self._last_time_s = cpu_s, time_s
        return ProcessSnapshot(self.pid, name, cpu_pct, rss_b / GIB, len(cpu_s), threads, True)


class HostReader:
    """Reads the host; rates and CPU shares need two reads, so the first has None there."""

    def __init__(self, *, pid: int | None = None, cpu_meter: CpuEnergyMeter | None = None):
        self.hostname = socket.gethostname()
        self.cpu_count = psutil.cpu_count() or os.cpu_count() or 1
        self.process = ProcessTreeReader(pid) if pid is not None else None
        self.cpu_meter = cpu_meter if cpu_meter is not None else CpuEnergyMeter()
        self._last: _Counters | None = None

    def watch_process(self, pid: int | None) -> None:
        """Follow the process tree rooted at `pid` (None: stop following)."""
        self.process = ProcessTreeReader(pid) if pid is not None else None

    def read(self, time_s: float) -> HostSnapshot:
        now = _read_counters(time_s)
        before, self._last = self._last, now
        per_core: tuple[float, ...] = ()
        cpu_pct = None
        rates: list[float | None] = [None, None, None, None]
        if before is not None:
            per_core = _per_core(now, before)
            cpu_pct = sum(per_core) / len(per_core) if per_core else None
            dt_s = now.time_s - before.time_s
            rates = [
                _rate(now.disk_read_b, before.disk_read_b, dt_s, MIB),
                _rate(now.disk_write_b, before.disk_write_b, dt_s, MIB),
                _rate(now.net_rx_b, before.net_rx_b, dt_s, MIB),
                _rate(now.net_tx_b, before.net_tx_b, dt_s, MIB),
            ]
        memory = psutil.virtual_memory()
        power_w, energy_j = self.cpu_meter.update(time_s, cpu_pct)
        try:
            load_1m: float | None = os.getloadavg()[0]
        except OSError:
            load_1m = None
        return HostSnapshot(
            hostname=self.hostname,
            cpu_count=self.cpu_count,
            cpu_pct=cpu_pct,
            cpu_per_core_pct=per_core,
            ram_used_gib=(memory.total - memory.available) / GIB,
            ram_total_gib=memory.total / GIB,
            disk_read_mib_per_s=rates[0],
            disk_write_mib_per_s=rates[1],
            net_rx_mib_per_s=rates[2],
            net_tx_mib_per_s=rates[3],
            load_avg_1m=load_1m,
            cpu_power_w=power_w,
            cpu_power_estimated=self.cpu_meter.estimated,
            cpu_energy_j=energy_j,
            process=self.process.read(time_s) if self.process is not None else None,
        )
