"""Rules about how well a run uses its GPU: input-bound, host-bound, small micro-batch,
fp32, TF32, MFU, memory headroom. Each takes a `RunData` and returns a `Finding` or None.
Thresholds are module constants, named and documented."""

from __future__ import annotations

from cloudtrain.diagnose.data import RunData, mean, median, share
from cloudtrain.store import Finding

INPUT_WAIT_SHARE = 0.15
"""Data-wait share of step time above which a run is input-bound (0.40: critical)."""
HOST_CPU_PCT = 85.0
"""Host CPU (mean over cores) at or above which the host counts as saturated."""
HOST_CORE_PCT = 95.0
"""Busiest core at or above which one thread (the Python loop) is the bottleneck."""
GPU_BUSY_PCT = 70.0
"""GPU utilization below which a saturated host is holding the GPU back."""
UNDERUSED_UTIL_PCT = 60.0
UNDERUSED_MFU = 0.20
HEADROOM_FRACTION = 0.60
"""Peak memory share below which there is room for a larger micro-batch."""
LOW_MFU = 0.20
"""Median MFU below which the run is far from what the GPU reaches (good dense training
reaches 0.35-0.55; the best matmuls reach about 0.8 of peak on A100/H100)."""
TARGET_MFU = 0.40
MEMORY_TARGET_FRACTION = 0.85


def _finding(run_data: RunData, rule: str, severity: str, **fields) -> Finding:
    return Finding(run_id=run_data.run.id, rule=rule, severity=severity, **fields)


def input_bound(data: RunData) -> Finding | None:
    steps = data.main_steps
    wait = share([(s.data_wait_s, s.step_s) for s in steps])
    if wait is None or wait < INPUT_WAIT_SHARE:
        return None
    waits = median(s.data_wait_s for s in steps) or 0.0
    step = median(s.step_s for s in steps) or 0.0
    workers = data.config_value("num_workers")
    return _finding(
        data,
        "input_bound",
        "critical" if wait >= 0.40 else "warn",
        symptom=f"{wait:.0%} of step time is spent waiting for the next batch",
        evidence=f"median data wait {waits * 1000:.0f} ms of a {step * 1000:.0f} ms step over "
        f"{len(steps)} steps (DataLoader num_workers={workers if workers is not None else '?'})",
        cause="the input pipeline (reading, decoding, augmenting) is slower than the GPU",
        fix="raise DataLoader num_workers (about 4-8 per GPU), set pin_memory=True and "
        "persistent_workers=True, prefetch_factor 4; pre-decode or shard the data on local "
        "NVMe; move augmentation to the GPU",
        expected_gain=f"up to {1 / (1 - wait):.2f}x steps/s if loading fully overlaps compute",
        data={"data_wait_share": wait, "median_data_wait_s": waits, "median_step_s": step},
    )


def host_bound(data: RunData) -> Finding | None:
    cpu = median(data.series("host/cpu_pct"))
    core = median(data.series("host/cpu_max_core_pct"))
    util = median(data.gpu_mean_per_sample("util_pct"))
    if util is None or util >= GPU_BUSY_PCT:
        return None
    all_cores = cpu is not None and cpu >= HOST_CPU_PCT
    one_core = core is not None and core >= HOST_CORE_PCT
    if not (all_cores or one_core):
        return None
    count = median(data.series("host/cpu_count"))
    if all_cores:
        evidence = f"host CPU {cpu:.0f}% busy (median over {count or '?':.0f} cores)"
        cause = "the CPUs are saturated (data loading, augmentation, other processes)"
        fix = (
            "rent more vCPUs per GPU, do augmentation on the GPU (DALI, torchvision v2 on "
            "CUDA tensors), cache decoded samples"
        )
    else:
        evidence = f"one core {core:.0f}% busy while the host averages {cpu or 0:.0f}%"
        cause = "one Python thread (the training loop) cannot launch kernels fast enough"
        fix = (
            "use torch.compile (mode='reduce-overhead' uses CUDA graphs), a larger "
            "micro-batch so each kernel does more work, fused optimizers (fused=True)"
        )
    return _finding(
        data,
        "host_bound",
        "warn",
        symptom=f"the GPU waits on the host: {util:.0f}% GPU utilization with a saturated CPU",
        evidence=f"{evidence}; GPUs {util:.0f}% busy (median of {len(data.samples)} samples)",
        cause=cause,
        fix=fix,
        expected_gain=f"up to {90.0 / max(util, 1.0):.1f}x if the GPU were kept 90% busy",
        data={"host_cpu_pct": cpu, "max_core_pct": core, "gpu_util_pct": util},
    )


def small_micro_batch(data: RunData) -> Finding | None:
    util = median(data.gpu_mean_per_sample("util_pct"))
    mfu = median(s.mfu for s in data.main_steps)
    memory = data.memory_peak_fraction()
    micro = median(s.micro_batch for s in data.main_steps)
    underused = (util is not None and util < UNDERUSED_UTIL_PCT) or (
        util is None and mfu is not None and mfu < UNDERUSED_MFU
    )
    if not underused or memory is None or memory >= HEADROOM_FRACTION or micro is None:
        return None
    suggested = max(int(micro) + 1, int(micro * MEMORY_TARGET_FRACTION / max(memory, 0.01)))
    busy = f"GPU {util:.0f}% busy" if util is not None else f"MFU {mfu:.1%}"
    return _finding(
        data,
        "small_micro_batch",
        "warn",
        symptom=f"the GPU is underused ({busy}) with a small micro-batch of {micro:.0f}",
        evidence=f"peak memory {memory:.0%} of the GPU; micro-batch {micro:.0f}; {busy}",
        cause="each step launches too little work to fill the GPU, so launch and "
        "synchronisation overheads dominate",
        fix=f"raise the micro-batch to about {suggested} (TrainConfig(micro_batch_size='auto') "
        "finds the largest that fits) and keep the global batch with fewer accumulation steps",
        expected_gain="typically 1.3-2x samples/s when the GPU was under 60% busy",
        data={
            "micro_batch": micro,
            "memory_fraction": memory,
            "suggested_micro_batch": suggested,
            "gpu_util_pct": util,
            "mfu": mfu,
        },
    )


def fp32_precision(data: RunData) -> Finding | None:
    spec = data.gpu
    if data.precision() != "fp32" or spec is None or not spec.bf16_tflops:
        return None
    base_name = "tf32" if data.tf32_enabled() and spec.tf32_tflops else "fp32"
    base = spec.peak_tflops(base_name) or spec.fp32_tflops
    if not base:
        return None
    ratio = spec.bf16_tflops / base
    return _finding(
        data,
        "fp32_precision",
        "warn",
        symptom=f"training in fp32 on a {spec.name}, which has bf16 tensor cores",
        evidence=f"{spec.name}: {spec.bf16_tflops:g} TFLOP/s bf16 vs {base:g} TFLOP/s "
        f"{base_name} (dense peaks, catalog)",
        cause="matmuls and convolutions run on the slower fp32 path",
        fix="train in bf16 mixed precision: TrainConfig(precision='bf16') or "
        "torch.autocast('cuda', dtype=torch.bfloat16); fp16 with a GradScaler on GPUs "
        "without bf16",
        expected_gain=f"up to {ratio:.1f}x on matmul-bound steps (peak ratio); typically "
        "1.5-3x end to end, and half the activation memory",
        data={"peak_ratio": ratio, "bf16_tflops": spec.bf16_tflops, "base": base_name},
    )


def tf32_off(data: RunData) -> Finding | None:
    spec = data.gpu
    if (
        data.precision() != "fp32"
        or data.tf32_enabled() is not False
        or spec is None
        or not spec.tf32_tflops
        or not spec.fp32_tflops
    ):
        return None
    ratio = spec.tf32_tflops / spec.fp32_tflops
    return _finding(
        data,
        "tf32_off",
        "warn",
        symptom="fp32 matmuls run without TF32 tensor cores",
        evidence=f"tf32 disabled in the run's config; {spec.name}: {spec.tf32_tflops:g} "
        f"TFLOP/s tf32 vs {spec.fp32_tflops:g} fp32",
        cause="PyTorch keeps fp32 matmuls on CUDA cores unless TF32 is allowed",
        fix="TrainConfig(tf32=True), or torch.backends.cuda.matmul.allow_tf32 = True and "
        "torch.backends.cudnn.allow_tf32 = True (torch.set_float32_matmul_precision('high'))",
        expected_gain=f"up to {ratio:.1f}x on fp32 matmuls, with a 10-bit mantissa",
        data={"peak_ratio": ratio},
    )


def low_mfu(data: RunData) -> Finding | None:
    steps = data.main_steps
    mfu = median(s.mfu for s in steps)
    if mfu is None or mfu >= LOW_MFU:
        return None
    achieved = median(s.flops / s.step_s / 1e12 for s in steps if s.flops and s.step_s)
    name = data.gpu.name if data.gpu else (data.run.gpu_name or "this GPU")
    tflops = f" ({achieved:.0f} TFLOP/s per GPU)" if achieved else ""
    return _finding(
        data,
        "low_mfu",
        "critical" if mfu < 0.05 else "warn",
        symptom=f"MFU {mfu:.1%}: far below what a {name} reaches",
        evidence=f"median MFU {mfu:.1%}{tflops} over {len(steps)} steps; well-tuned dense "
        "training reaches 35-55%, the best matmuls about 80% of peak",
        cause="see the other findings: input, host, micro-batch, precision and communication "
        "limits all show up as low MFU",
        fix="fix the other findings first; then torch.compile, fused optimizers, "
        "scaled_dot_product_attention (FlashAttention), and fewer host syncs (.item())",
        expected_gain=f"reaching {TARGET_MFU:.0%} MFU would be {TARGET_MFU / max(mfu, 1e-3):.1f}x "
        "faster",
        data={"mfu": mfu, "achieved_tflops": achieved},
    )


def memory_headroom(data: RunData) -> Finding | None:
    memory = data.memory_peak_fraction()
    util = median(data.gpu_mean_per_sample("util_pct"))
    if memory is None or memory >= 0.5 or (util is not None and util < UNDERUSED_UTIL_PCT):
        return None  # an underused GPU is small_micro_batch's finding
    checkpointing = bool(data.config_value("activation_checkpointing"))
    if checkpointing:
        fix = (
            "turn activation checkpointing off (it recomputes the forward pass); the "
            "memory is there"
        )
        gain = "about 1.3x: no forward recomputation (one forward of every three passes)"
    else:
        fix = "raise the micro-batch (fewer accumulation steps) or train a larger model"
        gain = "a few % from larger kernels; more if MFU is low"
    used = mean(data.gpu_mean_per_sample("memory_used_gib"))
    return _finding(
        data,
        "memory_headroom",
        "info",
        symptom=f"only {memory:.0%} of GPU memory used at peak",
        evidence=f"peak memory {memory:.0%}"
        + (f", mean {used:.1f} GiB" if used else "")
        + (", activation checkpointing on" if checkpointing else ""),
        cause="the micro-batch (or checkpointing) is sized for a smaller GPU",
        fix=fix,
        expected_gain=gain,
        data={"memory_fraction": memory, "activation_checkpointing": checkpointing},
    )
