"""Metric keys of a stored `Sample`, and the conversion from a `Snapshot`.

Keys (`i` is the GPU index; a value of None means unsupported on this device):

| key | unit / meaning |
|---|---|
| gpu/i/util_pct | % of time a kernel ran |
| gpu/i/memory_util_pct | % of time device memory was busy |
| gpu/i/memory_used_gib, gpu/i/memory_total_gib | GiB |
| gpu/i/power_w, gpu/i/power_limit_w | W (limit: enforced) |
| gpu/i/energy_j | J since the sampler started (counter differences or integrated power) |
| gpu/i/temperature_c | degrees C |
| gpu/i/sm_clock_mhz, gpu/i/sm_clock_max_mhz | MHz |
| gpu/i/throttle_reasons | NVML clock-event bitmask (monitor.snapshots.THROTTLE_*) |
| gpu/i/pcie_rx_mib_per_s, gpu/i/pcie_tx_mib_per_s | MiB/s |
| gpu/i/ecc_uncorrected, gpu/i/ecc_corrected | volatile ECC error counts |
| gpu/i/sm_active_pct, gpu/i/tensor_active_pct | GPM activity % (Hopper+) |
| host/cpu_pct | mean over cores, 0..100 |
| host/cpu_max_core_pct | busiest core, 0..100 |
| host/cpu_saturated_cores | cores above 90% |
| host/cpu_count | logical cores |
| host/ram_used_gib, host/ram_total_gib | GiB |
| host/disk_read_mib_per_s, host/disk_write_mib_per_s | MiB/s |
| host/net_rx_mib_per_s, host/net_tx_mib_per_s | MiB/s |
| host/load_avg_1m | run-queue length |
| host/cpu_power_w, host/cpu_energy_j | W; J since start (RAPL or estimate) |
| host/cpu_power_estimated | 1 when CPU power is a TDP x load estimate, 0 for RAPL |
| proc/cpu_pct | training process tree, % of one core |
| proc/rss_gib, proc/num_procs, proc/num_threads | its memory and size |

Per-core CPU shares stay in the snapshot (the live dashboard shows them); the store keeps
the summary figures above so that a 192-core host does not write 192 keys a second.
"""

from __future__ import annotations

from cloudtrain.monitor.snapshots import GPUSnapshot, HostSnapshot, Snapshot

GPU_FIELDS = {
    "util_pct": "util_pct",
    "memory_util_pct": "memory_util_pct",
    "memory_used_gib": "memory_used_gib",
    "memory_total_gib": "memory_total_gib",
    "power_w": "power_w",
    "power_limit_w": "power_limit_w",
    "energy_j": "energy_j",
    "temperature_c": "temperature_c",
    "sm_clock_mhz": "sm_clock_mhz",
    "sm_clock_max_mhz": "sm_clock_max_mhz",
    "throttle_reasons": "throttle_reasons",
    "pcie_rx_mib_per_s": "pcie_rx_mib_per_s",
    "pcie_tx_mib_per_s": "pcie_tx_mib_per_s",
    "ecc_uncorrected": "ecc_uncorrected_volatile",
    "ecc_corrected": "ecc_corrected_volatile",
    "sm_active_pct": "sm_active_pct",
    "tensor_active_pct": "tensor_active_pct",
}
"""Sample key suffix -> GPUSnapshot field."""

HOST_FIELDS = (
    "cpu_pct",
    "ram_used_gib",
    "ram_total_gib",
    "disk_read_mib_per_s",
    "disk_write_mib_per_s",
    "net_rx_mib_per_s",
    "net_tx_mib_per_s",
    "load_avg_1m",
    "cpu_power_w",
    "cpu_energy_j",
)


def gpu_key(index: int, name: str) -> str:
    return f"gpu/{index}/{name}"


def _num(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def gpu_metrics(gpu: GPUSnapshot) -> dict[str, float | None]:
    return {gpu_key(gpu.index, k): _num(getattr(gpu, f)) for k, f in GPU_FIELDS.items()}


def host_metrics(host: HostSnapshot) -> dict[str, float | None]:
    out: dict[str, float | None] = {f"host/{f}": _num(getattr(host, f)) for f in HOST_FIELDS}
    cores = host.cpu_per_core_pct
    out["host/cpu_count"] = float(host.cpu_count)
    out["host/cpu_max_core_pct"] = max(cores) if cores else None
    out["host/cpu_saturated_cores"] = float(host.saturated_cores) if cores else None
    out["host/cpu_power_estimated"] = 1.0 if host.cpu_power_estimated else 0.0
    if host.process is not None:
        out["proc/cpu_pct"] = host.process.cpu_pct
        out["proc/rss_gib"] = host.process.rss_gib
        out["proc/num_procs"] = float(host.process.num_procs)
        out["proc/num_threads"] = float(host.process.num_threads)
    return out


def snapshot_metrics(snapshot: Snapshot) -> dict[str, float | None]:
    """The flat metrics dict stored as one `Sample`."""
    metrics: dict[str, float | None] = {}
    for gpu in snapshot.gpus:
        metrics.update(gpu_metrics(gpu))
    metrics.update(host_metrics(snapshot.host))
    metrics["gpu/count"] = float(len(snapshot.gpus))
    return metrics


def gpu_indices(metrics: dict[str, float | None]) -> list[int]:
    """GPU indices present in a sample's metrics."""
    found = set()
    for key in metrics:
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "gpu" and parts[1].isdigit():
            found.add(int(parts[1]))
    return sorted(found)
