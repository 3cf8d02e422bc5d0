"""`cloudtrain bench`: measure what the planner needs on this machine.

- matmul TFLOP/s per dtype (fp32, tf32, bf16, fp16; fp8 through `torch._scaled_mm` on
  GPUs with compute capability >= 8.9) at a few square sizes, a transformer MLP shape
  ((8192 x 768) @ (768 x 3072) on a GPU) and a skinny one ((64 x 8192) @ (8192 x 8192)):
  2·M·K·N FLOPs per matmul;
- a 3x3 convolution, 64 -> 64 channels at 56x56 (batch 32 on a GPU, tiny on the CPU),
  forward + backward (3 x 2·N·C_out·H·W·C_in·9 FLOPs) in NCHW and channels_last, in bf16
  on a GPU (fp16 before Ampere) and fp32 on the CPU, cuDNN's default algorithm choice;
- a depthwise 3x3 convolution forward + backward: bytes/s, its bytes counted as the
  profiler counts them (inputs plus outputs of the forward and the backward op);
- a bandwidth-bound elementwise kernel, x * y + z (one `addcmul`: 3 reads, 1 write);
- a reduction/normalisation kernel: layer norm over rows of 4096 (read, write);
- launch latency: `x.add_(1)` on a 1-element tensor many times, synchronised at the end.
  On a GPU the tiny kernels are queued behind a sleeping kernel, so the GPU time per
  launch (CUDA events) and the host time to dispatch one eager op come apart; on the CPU
  both are the eager per-op host cost;
- device memory bandwidth: a large tensor copy (bytes read + bytes written per second);
- host-to-device and device-to-host copies, pinned and pageable (GPU only);
- disk read throughput of a directory (its files, or a file written there, with the
  page cache dropped for it where the OS allows);
- CPU samples/s of an image-decode-like pipeline on one core: zlib-inflate a 500x375
  RGB image (a stand-in for JPEG decode, no PIL needed), random 224 crop, flip, float
  conversion and normalisation.

Each figure is compared with the catalog's spec when the GPU resolves (% of peak), and
what looks wrong is flagged. What the planner reads back from the store:
`matmul_fraction` (best measured / dense peak per dtype) scales the default end-to-end
efficiency (see cloudtrain.plan.perf), and `rates`, achievable-rate rows keyed by the
catalog GPU name (see cloudtrain.catalog.rates and `bench_rates`), lay over the
catalog's for the per-op roofline of a traced model (`latest_rates`).
"""

from __future__ import annotations

import math
import os
import platform
import socket
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from cloudtrain.catalog.rates import KERNELS, LAYOUTS, RATE_DTYPES, RateTable, rate_table
from cloudtrain.catalog.types import AchievableRate, Catalog, GPUSpec

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
    """dtype -> {shape: TFLOP/s}; shape 'n' for n x n x n, 'MxKxN' for (M x K) @ (K x N)."""
    matmul_best_tflops: dict[str, float] = field(default_factory=dict)
    matmul_fraction: dict[str, float] = field(default_factory=dict)
    """dtype -> best measured / the catalog's dense peak (GPU in the catalog only)."""
    memory_gb_per_s: float | None = None
    memory_fraction: float | None = None
    kernel_dtype: str | None = None
    """dtype of the convolutions, the elementwise and the reduction kernel."""
    conv_shape: str | None = None
    """N x C x H x W of the 3x3 convolution (C -> C channels)."""
    conv_tflops: dict[str, float] = field(default_factory=dict)
    """layout ('nchw', 'nhwc' = channels_last) -> TFLOP/s, forward + backward."""
    depthwise_shape: str | None = None
    depthwise_gb_per_s: float | None = None
    """Depthwise 3x3 convolution, forward + backward: bytes read + written per second."""
    elementwise_gb_per_s: float | None = None
    """x * y + z on large tensors: bytes read + written per second."""
    reduction_gb_per_s: float | None = None
    """Layer norm over rows of 4096: bytes read + written per second."""
    kernel_fraction: dict[str, float] = field(default_factory=dict)
    """'conv nchw', 'conv nhwc' (of the dtype's dense peak), 'conv_depthwise',
    'elementwise', 'reduction' (of the memory bandwidth) -> measured share, unclipped
    (GPU in the catalog only)."""
    launch_us: float | None = None
    """Time per launch of a tiny kernel queued back to back: GPU time on a GPU, the eager
    per-op time on the CPU."""
    host_op_us: float | None = None
    """Host time to dispatch one eager op (the 'host' kernel kind's overhead)."""
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
    rates: list[dict[str, Any]] = field(default_factory=list)
    """Achievable-rate rows (AchievableRate fields) for the planner, keyed by `gpu` (GPU in
    the catalog only); see `bench_rates`."""
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


_TORCH_DTYPES = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


def kernel_dtype(device: str) -> str:
    """The dtype of the convolution, elementwise and reduction measurements: what mixed
    precision training runs them in (bf16 from Ampere on, fp16 before), fp32 on the CPU."""
    if device == "cpu":
        return "fp32"
    return "bf16" if torch.cuda.get_device_capability()[0] >= 8 else "fp16"


def matmul_tflops(dtype: str, n: int, device: str, *, min_s: float) -> float:
    """TFLOP/s of an n x n x n matmul in `dtype` (2·n³ FLOPs)."""
    return matmul_shape_tflops(dtype, n, n, n, device, min_s=min_s)


def matmul_shape_tflops(dtype: str, m: int, k: int, n: int, device: str, *, min_s: float) -> float:
    """TFLOP/s of (m x k) @ (k x n) in `dtype` (2·m·k·n FLOPs)."""
    torch_dtype = _TORCH_DTYPES.get(dtype, torch.float16)
    a = torch.randn(m, k, device=device).to(torch_dtype)
    b = torch.randn(k, n, device=device).to(torch_dtype)
    if dtype == "fp8":
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.to(torch.float8_e4m3fn).t().contiguous().t()  # column-major, as cuBLASLt wants
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
    return 2.0 * m * k * n / seconds / 1e12


def _conv_inputs(
    device: str, dtype: str, shape: tuple[int, int, int], *, depthwise: bool, channels_last: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, channels, size = shape
    torch_dtype = _TORCH_DTYPES[dtype]
    layout = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(batch, channels, size, size, device=device, dtype=torch_dtype)
    w = torch.randn(channels, 1 if depthwise else channels, 3, 3, device=device) * 0.05
    grad = torch.randn_like(x)  # padding 1, stride 1: the output has the input's shape
    x = x.to(memory_format=layout).requires_grad_()
    w = w.to(torch_dtype).to(memory_format=layout).requires_grad_()
    return x, w, grad.to(memory_format=layout)


def _conv_step(x: torch.Tensor, w: torch.Tensor, grad: torch.Tensor, groups: int) -> Any:
    """Forward + backward (grad input and grad weight, not accumulated anywhere)."""
    y = F.conv2d(x, w, padding=1, groups=groups)
    return torch.autograd.grad(y, (x, w), grad)


def conv_tflops(
    device: str, dtype: str, shape: tuple[int, int, int], *, channels_last: bool, min_s: float
) -> float:
    """TFLOP/s of a 3x3 convolution C -> C at (N, C, H = W) = `shape`, padding 1, forward +
    backward: 3 x 2·N·C·H·W·C·9 FLOPs (grad input and grad weight cost a forward each)."""
    x, w, grad = _conv_inputs(device, dtype, shape, depthwise=False, channels_last=channels_last)
    seconds = _timed(lambda: _conv_step(x, w, grad, 1), device, min_s=min_s)
    batch, channels, size = shape
    return 3 * 2.0 * batch * channels * channels * 9 * size * size / seconds / 1e12


def depthwise_gb_per_s(
    device: str, dtype: str, shape: tuple[int, int, int], *, min_s: float
) -> float:
    """Bytes/s of a depthwise 3x3 convolution (groups = C) forward + backward, NCHW. Bytes
    as the profiler counts them: forward x, w, y; backward grad y, x, w, grad x, grad w."""
    x, w, grad = _conv_inputs(device, dtype, shape, depthwise=True, channels_last=False)
    seconds = _timed(lambda: _conv_step(x, w, grad, shape[1]), device, min_s=min_s)
    nbytes = 5 * x.numel() * x.element_size() + 4 * w.numel() * w.element_size()
    return nbytes / seconds / 1e9


def elementwise_gb_per_s(device: str, dtype: str, size_mb: int, *, min_s: float) -> float:
    """Bytes/s of out = x * y + z over tensors of `size_mb` each: one addcmul kernel that
    reads three tensors and writes one."""
    torch_dtype = _TORCH_DTYPES[dtype]
    count = max(1, size_mb * 1024 * 1024 // torch.tensor([], dtype=torch_dtype).element_size())
    x, y, z = (torch.randn(count, device=device).to(torch_dtype) for _ in range(3))
    out = torch.empty_like(x)
    seconds = _timed(lambda: torch.addcmul(z, x, y, out=out), device, min_s=min_s)
    return 4 * count * x.element_size() / seconds / 1e9


def reduction_gb_per_s(
    device: str, dtype: str, size_mb: int, *, min_s: float, width: int = 4096
) -> float:
    """Bytes/s of a layer norm over rows of `width` (a tensor of `size_mb`): read x, write
    y (and the fp32 mean and rstd per row; the weight and bias once)."""
    torch_dtype = _TORCH_DTYPES[dtype]
    element = torch.tensor([], dtype=torch_dtype).element_size()
    rows = max(1, size_mb * 1024 * 1024 // (width * element))
    x = torch.randn(rows, width, device=device).to(torch_dtype)
    weight = torch.ones(width, device=device, dtype=torch_dtype)
    bias = torch.zeros(width, device=device, dtype=torch_dtype)
    with torch.no_grad():
        seconds = _timed(lambda: F.layer_norm(x, (width,), weight, bias), device, min_s=min_s)
    nbytes = 2 * rows * width * element + 2 * width * element + 2 * rows * 4
    return nbytes / seconds / 1e9


def launch_latency_us(device: str, launches: int, *, repeats: int = 3) -> tuple[float, float]:
    """(time per launch, host dispatch time per op) in µs of `x.add_(1)` on a 1-element
    tensor, `launches` times in a row, synchronised at the end; the best of `repeats`.

    On a GPU the launches are queued behind a sleeping kernel (`torch.cuda._sleep`), so
    the host never waits on the GPU and the GPU never waits on the host: CUDA events
    around the queued kernels give the GPU time per launch, the host clock around the
    loop the dispatch time. Keep `launches` under the launch queue's depth (~1000).
    On the CPU the op runs where it is dispatched: both are the eager per-op cost."""
    x = torch.zeros(1, device=device)
    for _ in range(min(launches, 100)):
        x.add_(1)
    _sync(device)
    if device != "cuda":
        best = math.inf
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(launches):
                x.add_(1)
            best = min(best, time.perf_counter() - start)
        per_op_us = best / launches * 1e6
        return per_op_us, per_op_us
    return _cuda_launch_latency_us(x, launches, repeats)


def _cuda_launch_latency_us(x: torch.Tensor, launches: int, repeats: int) -> tuple[float, float]:
    start = time.perf_counter()
    for _ in range(launches):
        x.add_(1)
    torch.cuda.synchronize()
    unhidden_s = time.perf_counter() - start  # GPU or host bound, whichever is slower
    sleep = getattr(torch.cuda, "_sleep", None)
    # A few GHz of GPU clock: cycles for three times as long as queuing the launches takes.
    cycles = int(unhidden_s * 2e9 * 3) + 1_000_000
    best_gpu = best_host = math.inf
    done = 0
    for _ in range(4 * repeats):
        if done >= repeats:
            break
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        if sleep is not None:
            sleep(cycles)
        begin.record()
        start = time.perf_counter()
        for _ in range(launches):
            x.add_(1)
        host_s = time.perf_counter() - start
        starved = sleep is not None and begin.query()  # the sleep ended before the queue did
        end.record()
        torch.cuda.synchronize()
        if starved:
            cycles *= 4
            continue
        done += 1
        best_gpu = min(best_gpu, begin.elapsed_time(end) * 1e3 / launches)
        best_host = min(best_host, host_s * 1e6 / launches)
    if done == 0:  # never queued ahead of the GPU: both bounded by the slower side
        per_op_us = unhidden_s * 1e6 / launches
        return per_op_us, per_op_us
    return best_gpu, best_host


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
    """Size of the copied tensor, and of each elementwise and reduction tensor."""
    transfer_mb: int
    disk_mb: int
    cpu_s: float
    matmul_shapes: tuple[tuple[int, int, int], ...] = ()
    """(M, K, N), (M x K) @ (K x N), beyond the squares: a transformer MLP, a skinny one."""
    conv: tuple[int, int, int] = (1, 64, 28)
    """(N, C, H = W) of the 3x3 C -> C convolution."""
    depthwise: tuple[int, int, int] = (1, 64, 28)
    """(N, C, H = W) of the depthwise 3x3 convolution."""
    launches: int = 500
    """Tiny kernels per launch-latency measurement (GPU: under the launch queue's depth)."""


GPU_MATMUL_SHAPES = ((8192, 768, 3072), (64, 8192, 8192))
"""A transformer MLP's up projection (8192 tokens, d 768) and a skinny matmul."""


def bench_sizes(device: str, quick: bool) -> BenchSizes:
    if device == "cuda":
        # The depthwise tensors (51 MB each in bf16) outgrow the L2 caches (50 MB on H100).
        gpu = {"matmul_shapes": GPU_MATMUL_SHAPES, "conv": (32, 64, 56), "launches": 500,
               "depthwise": (32, 256, 56)}  # fmt: skip
        if quick:
            return BenchSizes((1024, 4096), 0.05, 256, 64, 64, 0.3, **gpu)
        return BenchSizes((2048, 4096, 8192), 0.25, 1024, 256, 512, 2.0, **gpu)
    if quick:
        return BenchSizes((128, 256), 0.02, 16, 0, 8, 0.2, ((512, 96, 384), (8, 512, 512)),
                          conv=(1, 64, 28), depthwise=(1, 64, 28), launches=2000)  # fmt: skip
    return BenchSizes((256, 512, 1024), 0.2, 256, 0, 256, 1.0, ((1024, 192, 768), (16, 1024, 1024)),
                      conv=(2, 64, 56), depthwise=(2, 128, 56), launches=20000)  # fmt: skip


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
    shapes = [(n, n, n) for n in sizes.matmul_n] + list(sizes.matmul_shapes)
    steps: list[tuple[str, Callable[[], None]]] = [
        (f"matmul {dtype} {_shape_label(shape)}", _matmul_step(result, dtype, shape, device, sizes))
        for dtype in dtypes
        for shape in shapes
    ]
    steps.append(("device memory copy", lambda: _memory_step(result, device, sizes)))
    result.kernel_dtype = kernel_dtype(device)
    for layout in ("nchw", "nhwc"):
        steps.append((f"conv 3x3 {layout}", _conv_step_of(result, layout, device, sizes)))
    steps.append(("depthwise conv 3x3", lambda: _depthwise_step(result, device, sizes)))
    steps.append(("elementwise x*y+z", lambda: _elementwise_step(result, device, sizes)))
    steps.append(("layer norm", lambda: _reduction_step(result, device, sizes)))
    steps.append(("launch latency", lambda: _launch_step(result, device, sizes)))
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
    _compare(result, spec, rate_table(catalog.rates) if catalog is not None else None)
    result.seconds = time.perf_counter() - start
    return result


def significant(value: float, digits: int = 4) -> float:
    """`value` to `digits` significant digits: a slow machine's small rates stay non-zero."""
    return float(f"{value:.{digits}g}")


def _shape_label(shape: tuple[int, int, int]) -> str:
    """'n' for a square n x n x n matmul, 'MxKxN' for (M x K) @ (K x N)."""
    m, k, n = shape
    return str(n) if m == k == n else f"{m}x{k}x{n}"


def _matmul_step(
    result: BenchResult, dtype: str, shape: tuple[int, int, int], device: str, sizes: BenchSizes
) -> Callable[[], None]:
    def step() -> None:
        tflops = matmul_shape_tflops(dtype, *shape, device, min_s=sizes.min_s)
        result.matmul_tflops.setdefault(dtype, {})[_shape_label(shape)] = significant(tflops)
        best = max(result.matmul_best_tflops.get(dtype, 0.0), tflops)
        result.matmul_best_tflops[dtype] = significant(best)

    return step


def _memory_step(result: BenchResult, device: str, sizes: BenchSizes) -> None:
    result.memory_gb_per_s = significant(
        memory_bandwidth_gb_per_s(device, sizes.memory_mb, min_s=sizes.min_s)
    )


def _conv_step_of(
    result: BenchResult, layout: str, device: str, sizes: BenchSizes
) -> Callable[[], None]:
    def step() -> None:
        dtype = result.kernel_dtype or kernel_dtype(device)
        tflops = conv_tflops(
            device, dtype, sizes.conv, channels_last=layout == "nhwc", min_s=sizes.min_s
        )
        result.conv_tflops[layout] = significant(tflops)
        batch, channels, size = sizes.conv
        result.conv_shape = f"{batch}x{channels}x{size}x{size}"

    return step


def _depthwise_step(result: BenchResult, device: str, sizes: BenchSizes) -> None:
    dtype = result.kernel_dtype or kernel_dtype(device)
    rate = depthwise_gb_per_s(device, dtype, sizes.depthwise, min_s=sizes.min_s)
    result.depthwise_gb_per_s = significant(rate)
    batch, channels, size = sizes.depthwise
    result.depthwise_shape = f"{batch}x{channels}x{size}x{size}"


def _elementwise_step(result: BenchResult, device: str, sizes: BenchSizes) -> None:
    dtype = result.kernel_dtype or kernel_dtype(device)
    rate = elementwise_gb_per_s(device, dtype, sizes.memory_mb, min_s=sizes.min_s)
    result.elementwise_gb_per_s = significant(rate)


def _reduction_step(result: BenchResult, device: str, sizes: BenchSizes) -> None:
    dtype = result.kernel_dtype or kernel_dtype(device)
    rate = reduction_gb_per_s(device, dtype, sizes.memory_mb, min_s=sizes.min_s)
    result.reduction_gb_per_s = significant(rate)


def _launch_step(result: BenchResult, device: str, sizes: BenchSizes) -> None:
    launch_us, host_us = launch_latency_us(device, sizes.launches)
    result.launch_us = significant(launch_us)
    result.host_op_us = significant(host_us)


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


def _compare(result: BenchResult, spec: GPUSpec | None, rates: RateTable | None = None) -> None:
    """Fill the % of spec figures, the achievable-rate rows (unmeasured parts from `rates`,
    default the bundled achievable.csv) and the anomalies."""
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
        result.kernel_fraction = _kernel_fractions(result, spec)
        result.rates = [asdict(row) for row in bench_rates(result, spec, rates)]
    result.anomalies.extend(find_anomalies(result, spec))


def _kernel_fractions(result: BenchResult, spec: GPUSpec) -> dict[str, float]:
    """Measured shares of the peak (convolutions) and of the memory bandwidth (the rest)."""
    shares: dict[str, float] = {}
    peak = spec.op_peak_tflops(result.kernel_dtype or "fp32")
    for layout, tflops in result.conv_tflops.items():
        if peak and tflops:
            shares[f"conv {layout}"] = significant(tflops / peak)
    bandwidth = spec.memory_bandwidth_gbps
    for name, value in (
        ("conv_depthwise", result.depthwise_gb_per_s),
        ("elementwise", result.elementwise_gb_per_s),
        ("reduction", result.reduction_gb_per_s),
    ):
        if value and bandwidth:
            shares[name] = significant(value / bandwidth)
    return shares


def _share(value: float | None) -> float | None:
    """A measured share of a peak as a rate row holds it: in (0, 1], 4 digits; None when
    nothing (or nothing sensible) was measured."""
    if value is None or not math.isfinite(value) or value <= 0:
        return None
    return min(1.0, significant(value))


def bench_rates(
    result: BenchResult,
    spec: GPUSpec | None,
    rates: RateTable | None = None,
    *,
    today: str | None = None,
) -> list[AchievableRate]:
    """Achievable-rate rows keyed by the catalog GPU name from what `result` measured;
    none unless the GPU resolved in the catalog (`result.gpu` and `spec`).

    - matmul per dtype: compute_fraction = the best shape / the dense peak;
    - conv per layout (nchw, nhwc) in the dtype measured: compute_fraction;
    - conv_depthwise, elementwise, reduction: bandwidth_fraction (dtype 'any');
    - data_movement: bandwidth_fraction of the device memory copy;
    - host: overhead_us = the host dispatch time per eager op.
    overhead_us is the measured launch latency for matmul, elementwise, reduction and
    data_movement. What was not measured (the bandwidth share of a matmul, the compute
    share of an elementwise kernel, the convolutions' overhead) is the row `rates`
    (default: the bundled achievable.csv) has for this GPU. Shares are clipped to (0, 1].
    """
    if spec is None or result.gpu is None:
        return []
    tables = [rates] if rates is not None else []
    tables.append(rate_table(()))
    today = today or date.today().isoformat()
    source = f"cloudtrain bench on {result.host.get('hostname') or 'unknown host'} ({today})"
    launch_us = result.launch_us if result.launch_us and result.launch_us > 0 else None
    rows: list[AchievableRate] = []

    def add(kernel: str, dtype: str, layout: str = "any", *, compute: float | None = None,
            bandwidth: float | None = None, overhead_us: float | None = None) -> None:  # fmt: skip
        base = _base_row(tables, spec, kernel, dtype, layout)
        rows.append(
            AchievableRate(
                key=result.gpu or spec.name,
                kernel=kernel,
                dtype=dtype,
                layout=layout,
                compute_fraction=base.compute_fraction if compute is None else compute,
                bandwidth_fraction=base.bandwidth_fraction if bandwidth is None else bandwidth,
                overhead_us=base.overhead_us if overhead_us is None else overhead_us,
                source=source,
                as_of=today,
            )
        )

    for dtype, best in result.matmul_best_tflops.items():
        peak = spec.op_peak_tflops(dtype)
        share = _share(best / peak) if peak and dtype in RATE_DTYPES else None
        if share is not None:
            add("matmul", dtype, compute=share, overhead_us=launch_us)
    conv_peak = spec.op_peak_tflops(result.kernel_dtype or "fp32")
    for layout, tflops in result.conv_tflops.items():
        share = _share(tflops / conv_peak) if conv_peak else None
        if share is not None and result.kernel_dtype:
            add("conv", result.kernel_dtype, layout, compute=share)
    bandwidth = spec.memory_bandwidth_gbps
    for kernel, layout, value, overhead in (
        ("conv_depthwise", "nchw", result.depthwise_gb_per_s, None),  # measured in NCHW
        ("elementwise", "any", result.elementwise_gb_per_s, launch_us),
        ("reduction", "any", result.reduction_gb_per_s, launch_us),
        ("data_movement", "any", result.memory_gb_per_s, launch_us),
    ):
        share = _share(value / bandwidth) if value and bandwidth else None
        if share is not None:
            add(kernel, "any", layout, bandwidth=share, overhead_us=overhead)
    if result.host_op_us and result.host_op_us > 0 and math.isfinite(result.host_op_us):
        add("host", "any", overhead_us=result.host_op_us)
    return rows


def _base_row(
    tables: list[RateTable], spec: GPUSpec, kernel: str, dtype: str, layout: str
) -> AchievableRate:
    """The catalog's row for what a measured row does not measure."""
    for table in tables:
        try:
            return table.lookup(spec, kernel, dtype, layout)
        except KeyError:
            continue
    raise KeyError(f"no achievable rate for {kernel} {dtype} on {spec.name}")


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


def latest_rates(store: Any, limit: int = 500) -> list[AchievableRate]:
    """The achievable-rate rows of the newest completed bench per GPU type (benches saved
    before benches measured them, or without a catalog GPU, have none and are passed
    over); rows that do not read as rates are left out."""
    found: dict[str, list[AchievableRate]] = {}
    for run in store.list_runs(limit=limit, status="completed"):
        if run.kind != "bench" or not run.gpu_name or run.gpu_name in found:
            continue
        rows = [row for row in map(_rate_of, run.summary.get("rates") or []) if row is not None]
        if rows:
            found[run.gpu_name] = rows
    return [row for rows in found.values() for row in rows]


def _rate_of(data: Any) -> AchievableRate | None:
    """A stored rate row, or None when it does not read as one."""
    try:
        row = AchievableRate(
            key=str(data["key"]), kernel=str(data["kernel"]), dtype=str(data["dtype"]),
            layout=str(data["layout"]), compute_fraction=float(data["compute_fraction"]),
            bandwidth_fraction=float(data["bandwidth_fraction"]),
            overhead_us=float(data["overhead_us"]), source=str(data.get("source", "")),
            as_of=str(data.get("as_of", "")),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    valid = (
        row.kernel in KERNELS and row.dtype in RATE_DTYPES and row.layout in LAYOUTS
        and 0.0 <= row.compute_fraction <= 1.0 and 0.0 <= row.bandwidth_fraction <= 1.0
        and 0.0 <= row.overhead_us < math.inf
    )  # fmt: skip
    return row if valid else None


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
