"""`cloudtrain bench`: measure what the planner needs on this machine.

- matmul TFLOP/s per dtype (fp32, tf32, bf16, fp16; fp8 through `torch._scaled_mm` on
  GPUs with compute capability >= 8.9) at a few square sizes: 2·n³ FLOPs per matmul;
- device memory bandwidth: a large tensor copy (bytes read + bytes written per second);
- host-to-device and device-to-host copies, pinned and pageable (GPU only);
- disk read throughput of a directory (its files, or a file written there, with the
  page cache dropped for it where the OS allows);
- CPU samples/s of an image-decode-like pipeline on one core: zlib-inflate a 500x375
  RGB image (a stand-in for JPEG decode, no PIL needed), random 224 crop, flip, float
  conversion and normalisation.

Each figure is compared with the catalog's spec when the GPU resolves (% of peak), and
what looks wrong is flagged. `matmul_fraction` (best measured / dense peak per dtype)
is what the planner reads back from the store: it scales the default end-to-end
efficiency (see cloudtrain.plan.perf).
"""

from __future__ import annotations

import os
import platform
import socket
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cloudtrain.catalog.types import Catalog, GPUSpec

PCIE_GB_PER_S = {3: 15.75, 4: 31.5, 5: 63.0, 6: 121.0}
ProgressFn = Callable[[str, int, int], None]
"""Called as (what is being measured, steps done, steps in all)."""


@dataclass
class BenchResult:
    """Everything one `cloudtrain bench` measured. None: not measured here."""

    device: str
    """'cuda' or 'cpu'."""
    device_name: str
    gpu: str | None
    """Canonical catalog name of the GPU; None on CPU or for a GPU the catalog lacks."""
    host: dict[str, Any]
    matmul_tflops: dict[str, dict[str, float]] = field(default_factory=dict)
    """dtype -> {matrix size n: TFLOP/s}."""
    matmul_best_tflops: dict[str, float] = field(default_factory=dict)
    matmul_fraction: dict[str, float] = field(default_factory=dict)
    """dtype -> best measured / the catalog's dense peak (GPU in the catalog only)."""
    memory_gb_per_s: float | None = None
    memory_fraction: float | None = None
    h2d_pinned_gb_per_s: float | None = None
    d2h_pinned_gb_per_s: float | None = None
    h2d_pageable_gb_per_s: float | None = None
    d2h_pageable_gb_per_s: float | None = None
    pcie_fraction: float | None = None
    """Pinned host-to-device / nominal x16 bandwidth of the spec's PCIe generation."""
    disk_read_gb_per_s: float | None = None
    disk_dir: str | None = None
    disk_cache_dropped: bool = False
    cpu_images_per_s_per_core: float | None = None
    cpu_cores: int = 1
    anomalies: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(fn: Callable[[], Any], device: str, *, min_s: float, warmup: int = 2) -> float:
    """Seconds per call of `fn`, repeated until `min_s` has passed."""
    for _ in range(warmup):
        fn()
    _sync(device)
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        _sync(device)
        elapsed = time.perf_counter() - start
        if elapsed >= min_s:
            return elapsed / calls


def matmul_dtypes(device: str) -> list[str]:
    """The dtypes worth measuring on `device`."""
    if device == "cpu":
        return ["fp32", "bf16"]
    major, minor = torch.cuda.get_device_capability()
    dtypes = ["fp32"]
    if major >= 8:
        dtypes += ["tf32", "bf16"]
    dtypes.append("fp16")
    if (major, minor) >= (8, 9) and hasattr(torch, "_scaled_mm"):
        dtypes.append("fp8")
    return dtypes


def matmul_tflops(dtype: str, n: int, device: str, *, min_s: float) -> float:
    """TFLOP/s of an n x n x n matmul in `dtype` (2·n³ FLOPs)."""
    torch_dtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16}.get(
        dtype, torch.float16
    )
    a = torch.randn(n, n, device=device).to(torch_dtype)
    b = torch.randn(n, n, device=device).to(torch_dtype)
    if dtype == "fp8":
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.to(torch.float8_e4m3fn).t().contiguous().t()
        one = torch.tensor(1.0, device=device)

        def fn() -> Any:
            return torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    else:

        def fn() -> Any:
            return a @ b

    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        seconds = _timed(fn, device, min_s=min_s)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return 2.0 * n**3 / seconds / 1e12


def memory_bandwidth_gb_per_s(device: str, size_mb: int, *, min_s: float) -> float:
    """Device copy bandwidth: (bytes read + bytes written) / s."""
    source = torch.empty(size_mb * 1024 * 1024 // 4, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    seconds = _timed(lambda: target.copy_(source), device, min_s=min_s)
    return 2 * source.numel() * 4 / seconds / 1e9


def transfer_gb_per_s(size_mb: int, *, pinned: bool, to_device: bool, min_s: float) -> float:
    """Host<->device copy bandwidth (GPU only)."""
    count = size_mb * 1024 * 1024
    host = torch.empty(count, dtype=torch.uint8, pin_memory=pinned)
    device = torch.empty(count, dtype=torch.uint8, device="cuda")
    if to_device:
        seconds = _timed(lambda: device.copy_(host, non_blocking=pinned), "cuda", min_s=min_s)
    else:
        seconds = _timed(lambda: host.copy_(device, non_blocking=pinned), "cuda", min_s=min_s)
    return count / seconds / 1e9


def _drop_cache(path: Path) -> bool:
    if not hasattr(os, "posix_fadvise"):
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return True
    except OSError:
        return False


def disk_read_gb_per_s(directory: Path, size_mb: int) -> tuple[float, bool]:
    """Read throughput of `directory`: its own files up to `size_mb`, else a file written
    there (fsynced, then dropped from the page cache). Returns (GB/s, cache dropped)."""
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    budget = size_mb * 1024 * 1024
    chosen: list[Path] = []
    total = 0
    for path in files:
        if total >= budget:
            break
        chosen.append(path)
        total += path.stat().st_size
    scratch: Path | None = None
    if total < budget // 4:
        fd, name = tempfile.mkstemp(prefix=".cloudtrain-bench-", dir=directory)
        scratch = Path(name)
        with os.fdopen(fd, "wb") as out:
            block = os.urandom(1024 * 1024)
            for _ in range(size_mb):
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
        chosen, total = [scratch], size_mb * 1024 * 1024
    try:
        dropped = all([_drop_cache(p) for p in chosen])
        start = time.perf_counter()
        read = 0
        for path in chosen:
            with open(path, "rb", buffering=0) as handle:
                while chunk := handle.read(8 * 1024 * 1024):
                    read += len(chunk)
        seconds = max(time.perf_counter() - start, 1e-9)
    finally:
        if scratch is not None:
            scratch.unlink(missing_ok=True)
    return read / seconds / 1e9, dropped


def cpu_images_per_s(seconds: float, seed: int = 0) -> float:
    """Samples/s on one core of inflate + crop + flip + normalize (see module doc)."""
    rng = np.random.default_rng(seed)
    # A smooth image compresses like a photo does (about 3-5x), unlike noise.
    base = rng.integers(0, 255, size=(375 // 8 + 1, 500 // 8 + 1, 3), dtype=np.uint8)
    image = np.repeat(np.repeat(base, 8, axis=0), 8, axis=1)[:375, :500]
    packed = zlib.compress(image.tobytes(), level=6)
    mean = np.array([0.485, 0.456, 0.406], dtype=np.float32) * 255
    std = np.array([0.229, 0.224, 0.225], dtype=np.float32) * 255
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        pixels = np.frombuffer(zlib.decompress(packed), dtype=np.uint8).reshape(375, 500, 3)
        top, left = rng.integers(0, 375 - 224), rng.integers(0, 500 - 224)
        crop = pixels[top : top + 224, left : left + 224]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        sample = (crop.astype(np.float32) - mean) / std
        _ = np.ascontiguousarray(sample.transpose(2, 0, 1))
        done += 1
    return done / (time.perf_counter() - start)


@dataclass(frozen=True)
class BenchSizes:
    """How much each measurement does; `quick` keeps the whole run to seconds."""

    matmul_n: tuple[int, ...]
    min_s: float
    memory_mb: int
    transfer_mb: int
    disk_mb: int
    cpu_s: float


def bench_sizes(device: str, quick: bool) -> BenchSizes:
    if device == "cuda":
        if quick:
            return BenchSizes((1024, 4096), 0.05, 256, 64, 64, 0.3)
        return BenchSizes((2048, 4096, 8192), 0.25, 1024, 256, 512, 2.0)
    if quick:
        return BenchSizes((128, 256), 0.02, 16, 0, 8, 0.2)
    return BenchSizes((256, 512, 1024), 0.2, 256, 0, 256, 1.0)


def _host_info() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def run_bench(
    *,
    quick: bool = False,
    data_dir: str | Path | None = None,
    catalog: Catalog | None = None,
    device: str | None = None,
    on_progress: ProgressFn | None = None,
) -> BenchResult:
    """Measure this machine (see the module docstring). `device` None: CUDA when present.
    `data_dir` None: the system temporary directory is read."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    sizes = bench_sizes(device, quick)
    name = torch.cuda.get_device_name() if device == "cuda" else (platform.processor() or "cpu")
    spec = catalog.resolve_gpu(name) if (catalog is not None and device == "cuda") else None
    result = BenchResult(device, name, spec.name if spec else None, _host_info())
    result.cpu_cores = os.cpu_count() or 1
    dtypes = matmul_dtypes(device)
    steps: list[tuple[str, Callable[[], None]]] = [
        (f"matmul {dtype} n={n}", _matmul_step(result, dtype, n, device, sizes))
        for dtype in dtypes
        for n in sizes.matmul_n
    ]
    steps.append(("device memory copy", lambda: _memory_step(result, device, sizes)))
    if device == "cuda":
        steps.append(("host<->device copies", lambda: _transfer_step(result, sizes)))
    directory = Path(data_dir) if data_dir is not None else Path(tempfile.gettempdir())
    steps.append((f"disk read {directory}", lambda: _disk_step(result, directory, sizes)))
    steps.append(("CPU image pipeline", lambda: _cpu_step(result, sizes)))
    start = time.perf_counter()
    for done, (label, step) in enumerate(steps):
        if on_progress:
            on_progress(label, done, len(steps))
        step()
    if on_progress:
        on_progress("done", len(steps), len(steps))
    _compare(result, spec)
    result.seconds = time.perf_counter() - start
    return result


def significant(value: float, digits: int = 4) -> float:
    """`value` to `digits` significant digits: a slow machine's small rates stay non-zero."""
    return float(f"{value:.{digits}g}")


def _matmul_step(
    result: BenchResult, dtype: str, n: int, device: str, sizes: BenchSizes
) -> Callable[[], None]:
    def step() -> None:
        tflops = matmul_tflops(dtype, n, device, min_s=sizes.min_s)
        result.matmul_tflops.setdefault(dtype, {})[str(n)] = significant(tflops)
        best = max(result.matmul_best_tflops.get(dtype, 0.0), tflops)
        result.matmul_best_tflops[dtype] = significant(best)

    return step


def _memory_step(result: BenchResult, device: str, sizes: BenchSizes) -> None:
    result.memory_gb_per_s = significant(
        memory_bandwidth_gb_per_s(device, sizes.memory_mb, min_s=sizes.min_s)
    )


def _transfer_step(result: BenchResult, sizes: BenchSizes) -> None:
    for pinned in (True, False):
        for to_device in (True, False):
            rate = transfer_gb_per_s(
                sizes.transfer_mb, pinned=pinned, to_device=to_device, min_s=sizes.min_s
            )
            direction = "h2d" if to_device else "d2h"
            kind = "pinned" if pinned else "pageable"
            setattr(result, f"{direction}_{kind}_gb_per_s", significant(rate))


def _disk_step(result: BenchResult, directory: Path, sizes: BenchSizes) -> None:
    rate, dropped = disk_read_gb_per_s(directory, sizes.disk_mb)
    result.disk_read_gb_per_s = significant(rate)
    result.disk_dir = str(directory)
    result.disk_cache_dropped = dropped


def _cpu_step(result: BenchResult, sizes: BenchSizes) -> None:
    result.cpu_images_per_s_per_core = significant(cpu_images_per_s(sizes.cpu_s))


def _compare(result: BenchResult, spec: GPUSpec | None) -> None:
    """Fill the % of spec figures and the anomalies."""
    if result.device == "cuda" and spec is None:
        result.anomalies.append(
            f"GPU '{result.device_name}' is not in the catalog: no % of peak "
            "(add it with a gpus.csv row under --catalog)"
        )
    if spec is not None:
        for dtype, best in result.matmul_best_tflops.items():
            peak = spec.peak_tflops(dtype)
            if peak:
                result.matmul_fraction[dtype] = round(best / peak, 4)
        if result.memory_gb_per_s and spec.memory_bandwidth_gbps:
            result.memory_fraction = round(result.memory_gb_per_s / spec.memory_bandwidth_gbps, 4)
        nominal = PCIE_GB_PER_S.get(spec.pcie_gen or 0)
        if nominal and result.h2d_pinned_gb_per_s:
            result.pcie_fraction = round(result.h2d_pinned_gb_per_s / nominal, 4)
    result.anomalies.extend(find_anomalies(result, spec))


def find_anomalies(result: BenchResult, spec: GPUSpec | None) -> list[str]:
    """What looks wrong, one sentence each with what to check."""
    found: list[str] = []
    for dtype in ("bf16", "fp16"):
        fraction = result.matmul_fraction.get(dtype)
        if fraction is not None and fraction < 0.5 and spec is not None:
            found.append(
                f"{dtype} matmul reaches {fraction:.0%} of {spec.name}'s "
                f"{spec.peak_tflops(dtype):g} TFLOPS: clocks throttled (power, heat), a shared or "
                "MIG-partitioned GPU, or a lower-power variant; check nvidia-smi -q -d CLOCK,POWER"
            )
            break
    if result.memory_fraction is not None and result.memory_fraction < 0.6:
        found.append(
            f"device memory copies reach {result.memory_fraction:.0%} of the datasheet bandwidth: "
            "memory clocks low or the GPU is busy"
        )
    if result.pcie_fraction is not None and result.pcie_fraction < 0.5 and spec is not None:
        found.append(
            f"pinned host-to-device copies reach {result.h2d_pinned_gb_per_s} GB/s, under half of "
            f"PCIe gen{spec.pcie_gen} x16: the link may run at a lower generation or width; "
            "check nvidia-smi -q -d PCIE"
        )
    pinned, pageable = result.h2d_pinned_gb_per_s, result.h2d_pageable_gb_per_s
    if pinned and pageable and pageable < 0.25 * pinned:
        found.append(
            f"pageable copies are {pinned / pageable:.0f}x slower than pinned: "
            "use DataLoader(pin_memory=True)"
        )
    if result.disk_read_gb_per_s is not None and result.disk_read_gb_per_s < 0.2:
        found.append(
            f"disk reads at {result.disk_read_gb_per_s:.2f} GB/s in {result.disk_dir}: slow for "
            "image datasets; stage the data on local NVMe"
        )
    return found


def save_bench(result: BenchResult, store: Any) -> str:
    """Record `result` as a completed run of kind 'bench'; returns the run id."""
    run_id = store.create_run(
        kind="bench",
        config={"device": result.device},
        host=result.host,
        gpu_name=result.gpu,
        gpu_count=1 if result.device == "cuda" else 0,
    )
    store.update_run(run_id, status="completed", summary=result.as_dict())
    return run_id


def latest_matmul_fractions(store: Any, limit: int = 500) -> dict[str, dict[str, float]]:
    """GPU name -> {dtype: matmul fraction} from the newest completed bench per GPU type."""
    found: dict[str, dict[str, float]] = {}
    for run in store.list_runs(limit=limit, status="completed"):
        if run.kind != "bench" or not run.gpu_name or run.gpu_name in found:
            continue
        fractions = run.summary.get("matmul_fraction") or {}
        if fractions:
            found[run.gpu_name] = {k: float(v) for k, v in fractions.items()}
    return found
