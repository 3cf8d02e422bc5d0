"""`cloudtrain doctor`: is this machine set up right for training? Gathers facts (NVML
through the monitor, torch, /dev/shm, ulimits, sysfs, a timed read of the data directory)
and runs the pure checks of `diagnose.checks` over them."""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloudtrain.diagnose import checks as c
from cloudtrain.monitor.nvml import Nvml, open_nvml


@dataclass(frozen=True)
class TorchFacts:
    """None fields: torch is missing or was built without that part."""

    version: str | None = None
    cuda: str | None = None
    cuda_available: bool = False
    device_count: int = 0
    cudnn: int | None = None
    nccl: str | None = None


@dataclass(frozen=True)
class DoctorReport:
    checks: list[c.Check]
    gpu_count: int
    no_gpu_reason: str | None = None
    """Why no GPU is visible ('NVML library not found ...'); None when there are GPUs."""
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def worst(self) -> str:
        statuses = {check.status for check in self.checks}
        return next((s for s in ("fail", "warn") if s in statuses), "pass")


def torch_facts() -> TorchFacts:
    try:
        import torch
    except ImportError:
        return TorchFacts()
    nccl = None
    try:
        if torch.cuda.is_available():
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except (RuntimeError, AttributeError, TypeError):
        nccl = None
    available = torch.cuda.is_available()
    return TorchFacts(
        version=torch.__version__,
        cuda=torch.version.cuda,
        cuda_available=available,
        device_count=torch.cuda.device_count() if available else 0,
        cudnn=torch.backends.cudnn.version() if torch.version.cuda else None,
        nccl=nccl,
    )


def _soft_limit(kind: int) -> int | None:
    soft, _ = resource.getrlimit(kind)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def shm_bytes(path: str = "/dev/shm") -> int | None:
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_blocks * stat.f_frsize


def _numa_node(bus_id: str | None) -> int | None:
    if not bus_id:
        return None
    sysfs = Path("/sys/bus/pci/devices") / bus_id.lower()[-12:] / "numa_node"
    try:
        node = int(sysfs.read_text())
    except (OSError, ValueError):
        return None
    return None if node < 0 else node


def gpu_facts(nvml: Nvml) -> list[c.GPUFacts]:
    facts = []
    for i in range(nvml.device_count()):
        q = nvml.query
        ecc_mode = q(i, "nvmlDeviceGetEccMode")
        remap = q(i, "nvmlDeviceGetRemappedRows")
        util = q(i, "nvmlDeviceGetUtilizationRates")
        persistence = q(i, "nvmlDeviceGetPersistenceMode")
        facts.append(
            c.GPUFacts(
                index=i,
                name=str(q(i, "nvmlDeviceGetName") or f"GPU {i}"),
                util_pct=getattr(util, "gpu", None),
                pcie_gen=q(i, "nvmlDeviceGetCurrPcieLinkGeneration"),
                pcie_gen_max=q(i, "nvmlDeviceGetMaxPcieLinkGeneration"),
                pcie_width=q(i, "nvmlDeviceGetCurrPcieLinkWidth"),
                pcie_width_max=q(i, "nvmlDeviceGetMaxPcieLinkWidth"),
                persistence_mode=None if persistence is None else bool(persistence),
                ecc_enabled=None if ecc_mode is None else bool(ecc_mode[0]),
                ecc_uncorrected=q(i, "nvmlDeviceGetTotalEccErrors", 1, 0),
                remapped_rows_pending=None if remap is None else bool(remap[2]),
                remapped_rows_failed=None if remap is None else bool(remap[3]),
                numa_node=_numa_node(getattr(q(i, "nvmlDeviceGetPciInfo"), "busId", None)),
            )
        )
    return facts


def topology(nvml: Nvml, count: int) -> tuple[dict[tuple[int, int], int], dict[int, bool]]:
    levels = {}
    for a in range(count):
        for b in range(a + 1, count):
            level = nvml.query_pair(a, b, "nvmlDeviceGetTopologyCommonAncestor")
            if level is not None:
                levels[(a, b)] = int(level)
    nvlink = {i: bool(nvml.query(i, "nvmlDeviceGetNvLinkState", 0)) for i in range(count)}
    return levels, nvlink


def measure_read(
    path: str | Path, max_mib: float = 256.0, max_s: float = 3.0
) -> tuple[float | None, float]:
    """(MiB/s, MiB read) reading files under `path` in 8 MiB chunks, up to `max_mib` or
    `max_s`; (None, 0) when nothing could be read."""
    chunk, read_b, start = 8 * c.MIB, 0, time.perf_counter()
    root = Path(path)
    files = [root] if root.is_file() else (p for p in root.rglob("*") if p.is_file())
    try:
        for file in files:
            with open(file, "rb", buffering=0) as handle:
                while block := handle.read(chunk):
                    read_b += len(block)
                    if read_b >= max_mib * c.MIB or time.perf_counter() - start > max_s:
                        raise StopIteration
    except StopIteration:
        pass
    except OSError:
        return None, 0.0
    elapsed = time.perf_counter() - start
    if read_b == 0 or elapsed <= 0:
        return None, 0.0
    return read_b / c.MIB / elapsed, read_b / c.MIB


def run_doctor(
    data_dir: str | Path | None = None,
    *,
    nvml: Nvml | None = None,
    torch: TorchFacts | None = None,
    env: dict[str, str] | None = None,
) -> DoctorReport:
    """All checks on this machine (inputs may be given, e.g. a recorded NVML)."""
    nvml = nvml if nvml is not None else open_nvml()
    torch = torch if torch is not None else torch_facts()
    env = dict(os.environ) if env is None else env
    gpus = gpu_facts(nvml)
    levels, nvlink = topology(nvml, len(gpus))
    driver = nvml.query(None, "nvmlSystemGetDriverVersion")
    driver_cuda = nvml.query(None, "nvmlSystemGetCudaDriverVersion")
    speed, mib = measure_read(data_dir) if data_dir else (None, 0.0)
    results = [
        c.check_gpu_visible(nvml.available, nvml.unavailable_reason, len(gpus)),
        c.check_torch_cuda(
            torch.version, torch.cuda, torch.cuda_available, torch.device_count, len(gpus)
        ),
        c.check_driver_cuda(driver, driver_cuda, torch.cuda if gpus else None),
        c.check_cudnn_nccl(torch.cuda, torch.cudnn, torch.nccl, len(gpus)),
        c.check_shm(shm_bytes()),
        c.check_ulimits(
            _soft_limit(resource.RLIMIT_MEMLOCK), _soft_limit(resource.RLIMIT_NOFILE), len(gpus)
        ),
        c.check_cpu_per_gpu(os.cpu_count() or 1, len(gpus)),
        c.check_pcie_links(gpus),
        c.check_persistence(gpus),
        c.check_ecc(gpus),
        c.check_topology(gpus, levels, nvlink),
        c.check_read_throughput(None if data_dir is None else str(data_dir), speed, mib),
        c.check_debug_env(env),
        c.check_network_interfaces(env),
    ]
    facts = {
        "driver_version": driver,
        "cuda_driver_version": driver_cuda,
        "gpus": [g.name for g in gpus],
        "torch": torch.version,
        "torch_cuda": torch.cuda,
    }
    return DoctorReport(
        results,
        len(gpus),
        None if gpus else (nvml.unavailable_reason or "no GPU listed by the driver"),
        facts,
    )
