"""The doctor's checks. Each is a pure function of its inputs (versions, limits, readings)
and returns a `Check` with a status and, unless it passed, the fix. `doctor.py` gathers the
inputs from the machine."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

STATUSES = ("pass", "warn", "fail", "skip")
"""`skip`: does not apply here (e.g. GPU checks on a machine without a GPU)."""

MIB = 1024**2
GIB = 1024**3


@dataclass(frozen=True)
class Check:
    """One result: `summary` says what was found, `fix` what to do (empty on pass/skip)."""

    name: str
    status: str
    summary: str
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check status must be one of {STATUSES}, not {self.status!r}")


@dataclass(frozen=True)
class GPUFacts:
    """What the doctor knows about one GPU; None: NVML could not tell."""

    index: int
    name: str
    util_pct: float | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    persistence_mode: bool | None = None
    ecc_enabled: bool | None = None
    ecc_uncorrected: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failed: bool | None = None
    numa_node: int | None = None
    """NUMA node of the GPU's PCIe slot; None (or -1 in sysfs) when not NUMA."""


def _skip(name: str, why: str = "no GPU on this machine") -> Check:
    return Check(name, "skip", why)


def check_gpu_visible(nvml_available: bool, reason: str | None, gpu_count: int) -> Check:
    name = "gpu_driver"
    if nvml_available and gpu_count > 0:
        return Check(
            name,
            "pass",
            f"{gpu_count} GPU(s) visible to the NVIDIA driver",
            data={"gpu_count": gpu_count},
        )
    found = reason or "the driver lists no GPU"
    return Check(
        name,
        "warn",
        f"No NVIDIA GPU on this machine ({found}); GPU checks skipped",
        "if this machine should have a GPU: install the NVIDIA driver "
        "(nvidia-smi must work) or run the container with --gpus all",
    )


def check_torch_cuda(
    torch_version: str | None,
    torch_cuda: str | None,
    cuda_available: bool,
    torch_gpu_count: int,
    driver_gpu_count: int,
) -> Check:
    name = "torch_cuda"
    if torch_version is None:
        return Check(name, "fail", "torch is not installed", "pip install torch")
    build = (
        f"torch {torch_version} (CUDA {torch_cuda})"
        if torch_cuda
        else (f"torch {torch_version} (CPU-only build)")
    )
    if driver_gpu_count == 0:
        return Check(name, "pass", f"{build}; no GPU to use")
    if not torch_cuda:
        return Check(
            name,
            "fail",
            f"{build} on a machine with {driver_gpu_count} GPU(s)",
            "install a CUDA build of torch, e.g. pip install torch --index-url "
            "https://download.pytorch.org/whl/cu124",
        )
    if not cuda_available:
        return Check(
            name,
            "fail",
            f"{build} but torch.cuda.is_available() is False",
            "check CUDA_VISIBLE_DEVICES and that the driver supports this CUDA "
            "version (see driver_cuda)",
        )
    if torch_gpu_count != driver_gpu_count:
        return Check(
            name,
            "warn",
            f"{build} sees {torch_gpu_count} of {driver_gpu_count} GPUs",
            "CUDA_VISIBLE_DEVICES hides some GPUs; unset it to use them all",
        )
    return Check(name, "pass", f"{build} sees all {torch_gpu_count} GPU(s)")


def _version_tuple(text: str) -> tuple[int, int]:
    parts = [*text.split("."), "0"][:2]
    return int(parts[0]), int(parts[1])


def check_driver_cuda(
    driver_version: str | None, driver_cuda: int | None, torch_cuda: str | None
) -> Check:
    """`driver_cuda`: NVML's cuda driver version as an int (12040 = CUDA 12.4)."""
    name = "driver_cuda"
    if driver_cuda is None or torch_cuda is None:
        return _skip(name, "no driver or no CUDA build of torch to compare")
    have = (driver_cuda // 1000, driver_cuda % 1000 // 10)
    need = _version_tuple(torch_cuda)
    text = (
        f"driver {driver_version} supports CUDA up to {have[0]}.{have[1]}; "
        f"torch needs CUDA {torch_cuda}"
    )
    data = {"driver_cuda": f"{have[0]}.{have[1]}", "torch_cuda": torch_cuda}
    if have[0] < need[0]:
        return Check(
            name,
            "fail",
            text,
            f"upgrade the NVIDIA driver, or install a torch build for CUDA {have[0]}.x",
            data,
        )
    if have < need:
        return Check(
            name,
            "warn",
            text + " (runs through CUDA minor-version compatibility; "
            "PTX JIT and some features need a newer driver)",
            f"upgrade the driver to one that supports CUDA {torch_cuda}",
            data,
        )
    return Check(name, "pass", text, data=data)


def check_cudnn_nccl(
    torch_cuda: str | None, cudnn_version: int | None, nccl_version: str | None, gpu_count: int
) -> Check:
    name = "cudnn_nccl"
    if torch_cuda is None:
        return _skip(name, "CPU-only torch: no cuDNN or NCCL")
    parts = [
        f"cuDNN {cudnn_version}" if cudnn_version else "cuDNN missing",
        f"NCCL {nccl_version}" if nccl_version else "NCCL missing",
    ]
    summary = ", ".join(parts)
    if cudnn_version is None:
        return Check(
            name,
            "fail",
            summary,
            "reinstall torch from the official wheels "
            "(they bundle cuDNN); convolutions run without it slowly or not at all",
        )
    if nccl_version is None and gpu_count > 1:
        return Check(
            name,
            "warn",
            summary,
            "multi-GPU training needs NCCL: use the official Linux torch wheels",
        )
    return Check(name, "pass", summary)


def check_shm(shm_bytes: int | None) -> Check:
    name = "dev_shm"
    if shm_bytes is None:
        return Check(
            name,
            "warn",
            "/dev/shm not found",
            "DataLoader workers pass batches through shared memory; mount a tmpfs on /dev/shm",
        )
    size = f"/dev/shm is {shm_bytes / MIB:,.0f} MiB"
    fix = (
        "DataLoader workers share batches through /dev/shm: start the container with "
        "--shm-size=16g (or --ipc=host); Docker's default is 64 MiB"
    )
    if shm_bytes < 512 * MIB:
        return Check(
            name,
            "fail",
            size + ": workers will die with 'bus error'",
            fix,
            {"shm_mib": shm_bytes / MIB},
        )
    if shm_bytes < 4 * GIB:
        return Check(
            name,
            "warn",
            size + ": tight for several workers with large batches",
            fix,
            {"shm_mib": shm_bytes / MIB},
        )
    return Check(name, "pass", size, data={"shm_mib": shm_bytes / MIB})


def check_ulimits(memlock_bytes: int | None, nofile: int | None, gpu_count: int) -> Check:
    """`memlock_bytes`/`nofile`: soft limits; None means unlimited. A low memlock only
    matters where GPUs communicate (more than one GPU, or several nodes)."""
    name = "ulimits"
    lock = "unlimited" if memlock_bytes is None else f"{memlock_bytes / MIB:,.0f} MiB"
    files = "unlimited" if nofile is None else f"{nofile:,}"
    summary = f"memlock {lock}, open files {files}"
    problems = []
    if memlock_bytes is not None and memlock_bytes < GIB and gpu_count > 1:
        problems.append(
            "raise memlock to unlimited (ulimit -l unlimited, or docker "
            "--ulimit memlock=-1): NCCL over InfiniBand/RoCE and GPUDirect "
            "register pinned memory"
        )
    if nofile is not None and nofile < 4096:
        problems.append(
            "raise open files (ulimit -n 65536): DataLoader workers share "
            "tensors through file descriptors"
        )
    if problems:
        return Check(name, "warn", summary, "; ".join(problems))
    return Check(name, "pass", summary)


def check_cpu_per_gpu(cpu_count: int, gpu_count: int, min_per_gpu: int = 4) -> Check:
    name = "cpu_per_gpu"
    if gpu_count == 0:
        return _skip(name)
    per = cpu_count / gpu_count
    summary = f"{cpu_count} CPU cores for {gpu_count} GPU(s) ({per:.1f} per GPU)"
    if per < min_per_gpu:
        return Check(
            name,
            "warn",
            summary,
            f"data loading and the Python loop need about "
            f"{min_per_gpu}+ cores per GPU: rent an instance with more vCPUs or "
            "move augmentation to the GPU",
            {"cores_per_gpu": per},
        )
    return Check(name, "pass", summary, data={"cores_per_gpu": per})


def check_pcie_links(gpus: Sequence[GPUFacts]) -> Check:
    name = "pcie_link"
    if not gpus:
        return _skip(name)
    slow, notes = [], []
    for g in gpus:
        if None in (g.pcie_gen, g.pcie_gen_max, g.pcie_width, g.pcie_width_max):
            continue
        link = (
            f"GPU {g.index} gen{g.pcie_gen} x{g.pcie_width} (max gen{g.pcie_gen_max} "
            f"x{g.pcie_width_max})"
        )
        if g.pcie_width < g.pcie_width_max:  # type: ignore[operator]
            slow.append(link)
        elif g.pcie_gen < g.pcie_gen_max:  # type: ignore[operator]
            # links drop their generation at idle to save power: only a busy one counts
            (slow if (g.util_pct or 0) >= 10 else notes).append(link)
    if slow:
        return Check(
            name,
            "warn",
            "PCIe link below its capability: " + "; ".join(slow),
            "reseat the GPU or riser, check BIOS PCIe settings, or ask the provider "
            "for another host; host<->GPU copies run at the reduced rate",
        )
    extra = f" ({'; '.join(notes)}: idle links downshift; re-run under load)" if notes else ""
    return Check(name, "pass", f"PCIe links at full width{extra}")


def check_persistence(gpus: Sequence[GPUFacts]) -> Check:
    name = "persistence_mode"
    known = [g for g in gpus if g.persistence_mode is not None]
    if not known:
        return _skip(name, "no GPU" if not gpus else "persistence mode not reported")
    off = [g.index for g in known if not g.persistence_mode]
    if off:
        return Check(
            name,
            "warn",
            f"persistence mode off on GPU(s) {off}",
            "sudo nvidia-smi -pm 1 (or run nvidia-persistenced): otherwise the "
            "driver re-initialises each GPU for every new process (seconds each)",
        )
    return Check(name, "pass", "persistence mode on")


def check_ecc(gpus: Sequence[GPUFacts]) -> Check:
    name = "ecc"
    if not gpus:
        return _skip(name)
    bad = [g.index for g in gpus if (g.ecc_uncorrected or 0) > 0 or g.remapped_rows_failed]
    if bad:
        return Check(
            name,
            "fail",
            f"uncorrected ECC errors or failed row remapping on GPU(s) {bad}",
            "do not train on this GPU: drain it, reset it (nvidia-smi -r), "
            "and if it persists ask the provider for another machine",
        )
    pending = [g.index for g in gpus if g.remapped_rows_pending]
    if pending:
        return Check(
            name,
            "warn",
            f"row remapping pending on GPU(s) {pending}",
            "reset the GPU (nvidia-smi -r) or reboot to apply the remapping",
        )
    off = [g.index for g in gpus if g.ecc_enabled is False]
    if off:
        return Check(
            name,
            "warn",
            f"ECC disabled on GPU(s) {off}",
            "enable it for long runs: sudo nvidia-smi -e 1, then reboot",
        )
    return Check(name, "pass", "ECC on (where supported), no uncorrected errors")


TOPOLOGY_NAMES = {
    0: "same board",
    10: "one PCIe switch",
    20: "PCIe switches",
    30: "one host bridge",
    40: "one NUMA node",
    50: "across CPU sockets",
}


def check_topology(
    gpus: Sequence[GPUFacts], pair_levels: Mapping[tuple[int, int], int], nvlink: Mapping[int, bool]
) -> Check:
    """`pair_levels`: NVML topology level of each GPU pair; `nvlink`: GPU -> has NVLink."""
    name = "topology"
    if len(gpus) < 2:
        return _skip(name, "fewer than two GPUs")
    nodes = {g.index: g.numa_node for g in gpus}
    data = {"numa_nodes": nodes, "pairs": {f"{a}-{b}": v for (a, b), v in pair_levels.items()}}
    far = [
        f"{a}-{b}"
        for (a, b), level in pair_levels.items()
        if level >= 50 and not (nvlink.get(a) and nvlink.get(b))
    ]
    known = sorted({n for n in nodes.values() if n is not None})
    numa = f"; NUMA nodes {known}" if known else ""
    if far:
        return Check(
            name,
            "warn",
            f"GPU pairs {far} talk across CPU sockets without NVLink" + numa,
            "keep communicating ranks on one socket, or pin each rank's CPU "
            "threads to its GPU's NUMA node (numactl --cpunodebind)",
            data,
        )
    return Check(name, "pass", "GPU pairs share a socket or NVLink" + numa, data=data)


def check_read_throughput(
    path: str | None, mib_per_s: float | None, mib_read: float, min_mib_per_s: float = 500.0
) -> Check:
    name = "data_read"
    if path is None:
        return _skip(name, "no --data-dir given")
    if mib_per_s is None:
        return Check(
            name, "warn", f"could not read files under {path}", "check the path and permissions"
        )
    summary = f"read {mib_read:,.1f} MiB from {path} at {mib_per_s:,.0f} MiB/s"
    data = {"mib_per_s": mib_per_s, "mib_read": mib_read}
    if mib_read < 16:
        return Check(name, "skip", summary + ": too little data to judge", data=data)
    if mib_per_s < min_mib_per_s:
        return Check(
            name,
            "warn",
            summary,
            "copy the data to local NVMe, use fewer larger "
            "files (WebDataset/shards), or more DataLoader workers",
            data,
        )
    return Check(name, "pass", summary + " (page cache may flatter repeat reads)", data=data)


DEBUG_VARIABLES = {
    "CUDA_LAUNCH_BLOCKING": ("1", "every kernel launch waits for the GPU: often 2-10x slower"),
    "NCCL_DEBUG": ("INFO|TRACE", "verbose NCCL logs on every rank; TRACE slows collectives"),
    "TORCH_DISTRIBUTED_DEBUG": (
        "DETAIL|INFO",
        "extra consistency checks and logging on every collective (DETAIL synchronises)",
    ),
    "NCCL_P2P_DISABLE": ("1", "GPU-to-GPU copies go through host memory"),
    "NCCL_IB_DISABLE": ("1", "InfiniBand off: multi-node traffic falls back to TCP"),
    "PYTORCH_NO_CUDA_MEMORY_CACHING": ("1", "every allocation calls cudaMalloc: much slower"),
    "TORCH_NCCL_BLOCKING_WAIT": ("1", "collectives block the host thread"),
}


def check_debug_env(env: Mapping[str, str]) -> Check:
    name = "debug_env"
    costly = []
    for variable, (values, cost) in DEBUG_VARIABLES.items():
        value = env.get(variable, "")
        if value and value.upper() in values.upper().split("|"):
            costly.append(f"{variable}={value} ({cost})")
    if costly:
        return Check(
            name,
            "warn",
            "debugging settings that cost speed: " + "; ".join(costly),
            "unset them for real runs: " + " ".join(f"unset {c.split('=')[0]};" for c in costly),
        )
    return Check(name, "pass", "no costly debugging variables set")


def check_network_interfaces(env: Mapping[str, str]) -> Check:
    """NCCL pinned to an interface but gloo not: the Trainer's per-step agreements go
    over a gloo group, which may then pick an interface the other nodes cannot reach."""
    name = "network_interfaces"
    nccl, gloo = env.get("NCCL_SOCKET_IFNAME"), env.get("GLOO_SOCKET_IFNAME")
    if nccl and not gloo:
        return Check(
            name,
            "warn",
            f"NCCL_SOCKET_IFNAME={nccl} but GLOO_SOCKET_IFNAME is unset: the ranks' per-step "
            "agreements (a gloo group) may pick another interface",
            f"export GLOO_SOCKET_IFNAME={nccl}",
        )
    if nccl and gloo and nccl != gloo:
        return Check(name, "pass", f"NCCL on {nccl}, gloo on {gloo} (set apart on purpose?)")
    return Check(name, "pass", "network interfaces for NCCL and gloo agree (or are both unset)")
