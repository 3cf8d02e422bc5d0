"""The per-op roofline against hand-computed cases, and the achievable-rates data."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from cloudtrain.catalog import load_catalog
from cloudtrain.catalog.rates import KERNELS, RateTable, rate_table
from cloudtrain.catalog.types import AchievableRate, GPUSpec
from cloudtrain.errors import DataError
from cloudtrain.plan.profile import Affine, ModelProfile, OpRecord
from cloudtrain.plan.roofline import (
    COMPILE_LAUNCHES_KEPT,
    COMPILE_TRAFFIC_KEPT,
    OPTIMIZER_PASSES,
    Roofline,
    StepOptions,
    kernel_of,
    rate_dtype,
)

GPU = GPUSpec(
    name="TestGPU", vendor="nvidia", architecture="testarch", memory_gib=80,
    memory_bandwidth_gbps=1000.0, tdp_w=400, compute_capability="9.9", fp32_tflops=50.0,
    tf32_tflops=400.0, bf16_tflops=800.0, fp16_tflops=800.0,
)  # fmt: skip


def rate(kernel: str, compute: float, bandwidth: float, overhead_us: float, **kw) -> AchievableRate:
    return AchievableRate(
        key=kw.get("key", "default"), kernel=kernel, dtype=kw.get("dtype", "any"),
        layout=kw.get("layout", "any"), compute_fraction=compute,
        bandwidth_fraction=bandwidth, overhead_us=overhead_us, source="test", as_of="2026-12-01",
    )  # fmt: skip


RATES = RateTable(
    [
        rate("matmul", 0.5, 0.5, 10.0),
        rate("elementwise", 0.5, 0.8, 2.0),
        rate("conv", 0.4, 0.5, 5.0, layout="nchw"),
        rate("conv", 0.8, 0.5, 5.0, layout="nhwc"),
        rate("conv_depthwise", 0.1, 0.25, 5.0),
        rate("optimizer", 0.5, 0.5, 4.0),
        rate("host", 0.0, 0.0, 1.0),
    ]
)


def op(op_class: str, flops: float, nbytes: float, **kw) -> OpRecord:
    return OpRecord(
        op=kw.pop("name", f"aten.{op_class}"), op_class=op_class, phase=kw.pop("phase", "forward"),
        dtype=kw.pop("dtype", "bf16"), count=kw.pop("count", 1),
        flops=Affine(0.0, flops), bytes=Affine(0.0, nbytes), **kw,
    )  # fmt: skip


def profile(*ops: OpRecord, precision: str = "bf16", params: int = 1000, tensors: int = 2):
    return ModelProfile(
        name="t", fingerprint="f", precision=precision, channels_last=False, parameters=params,
        parameter_tensors=tensors, frozen_parameters=0, ops=tuple(ops),
        activation_bytes=Affine(0.0, 1.0),
    )  # fmt: skip


def test_compute_bound_matmul_is_flops_over_peak_share_plus_launch():
    # 8e12 FLOPs per sample, 1 MB: compute 8e12 / (800e12 * 0.5) = 20 ms >> memory.
    line = Roofline(profile(op("matmul", 8e12, 1e6)), RATES, StepOptions())
    cost = line.op_cost(GPU, line.profile.ops[0], batch=1)
    assert cost.seconds == pytest.approx(0.020 + 10e-6)
    assert cost.bound == "compute"


def test_memory_bound_elementwise_is_bytes_over_bandwidth_share():
    # 1e9 bytes per sample at 1000 GB/s x 0.8: 1.25 ms per sample, batch 4: 5 ms.
    line = Roofline(profile(op("elementwise", 1e6, 1e9)), RATES, StepOptions())
    cost = line.op_cost(GPU, line.profile.ops[0], batch=4)
    assert cost.seconds == pytest.approx(4 * 1.25e-3 + 2e-6)
    assert cost.bound == "memory"


def test_tiny_ops_are_launch_bound_and_count_multiplies():
    line = Roofline(profile(op("elementwise", 10, 100, count=50)), RATES, StepOptions())
    cost = line.op_cost(GPU, line.profile.ops[0], batch=1)
    assert cost.bound == "launch"
    assert cost.seconds == pytest.approx(50 * (100 / 0.8e12 + 2e-6))


def test_fp32_precision_follows_pytorch_defaults():
    mm = op("matmul", 1, 1, dtype="fp32")
    conv = op("convolution", 1, 1, dtype="fp32", gemm=(Affine(0, 1), Affine(64, 0), Affine(9, 0)))
    defaults = StepOptions()
    assert rate_dtype(mm, "matmul", "fp32", defaults) == "fp32"  # matmul TF32 off by default
    assert rate_dtype(conv, "conv", "fp32", defaults) == "tf32"  # cuDNN TF32 on by default
    assert rate_dtype(mm, "matmul", "tf32", defaults) == "tf32"
    strict = StepOptions(tf32_matmul=False, tf32_conv=False)
    assert rate_dtype(conv, "conv", "fp32", strict) == "fp32"
    assert rate_dtype(op("matmul", 1, 1), "matmul", "fp32", strict) == "bf16"


def test_channels_last_and_depthwise_convolutions_use_their_rates():
    dense = Affine(0, 100), Affine(64, 0), Affine(576, 0)
    depthwise = Affine(0, 100), Affine(1, 0), Affine(9, 0)
    nchw = op("convolution", 1e12, 1e3, gemm=dense)
    nhwc = op("convolution", 1e12, 1e3, gemm=dense, channels_last=True)
    dw = op("convolution", 1e9, 1e9, gemm=depthwise, groups=64)
    assert kernel_of(dw) == "conv_depthwise"
    assert kernel_of(op("convolution", 1, 1, gemm=dense, groups=4)) == "conv_grouped"
    line = Roofline(profile(nchw, nhwc, dw), RATES, StepOptions())
    t_nchw, t_nhwc, t_dw = (line.op_cost(GPU, o, 1).seconds for o in line.profile.ops)
    assert t_nchw == pytest.approx(1e12 / (800e12 * 0.4) + 5e-6)
    assert t_nhwc == pytest.approx(1e12 / (800e12 * 0.8) + 5e-6)
    assert t_dw == pytest.approx(1e9 / (1000e9 * 0.25) + 5e-6)  # memory-bound at 25%


def test_compile_fuses_elementwise_traffic_and_launches_but_not_gemms():
    ops = (op("elementwise", 0, 1e9, count=8), op("matmul", 8e12, 1e6))
    eager = Roofline(profile(*ops), RATES, StepOptions())
    compiled = Roofline(profile(*ops), RATES, StepOptions(compile=True))
    e_mm = eager.op_cost(GPU, ops[1], 1)
    c_elem, c_mm = (compiled.op_cost(GPU, o, 1) for o in ops)
    assert c_mm.seconds == e_mm.seconds
    assert c_elem.count == pytest.approx(8 * COMPILE_LAUNCHES_KEPT)
    traffic_s = 8 * 1e9 * COMPILE_TRAFFIC_KEPT / 0.8e12
    assert c_elem.seconds == pytest.approx(traffic_s + 8 * COMPILE_LAUNCHES_KEPT * 2e-6)


def test_optimizer_step_fused_beats_foreach_beats_plain():
    tensors, params = 200, 10_000_000
    times = {}
    for impl in ("fused", "foreach", "plain"):
        line = Roofline(profile(params=params, tensors=tensors), RATES,
                        StepOptions(optimizer_impl=impl))  # fmt: skip
        gpu_s, host_s = line.optimizer_step(GPU)
        times[impl] = max(gpu_s, host_s)
    fused_bytes = OPTIMIZER_PASSES["adamw"].fused_bytes * params
    launches = math.ceil(tensors / 48)
    assert times["fused"] == pytest.approx(fused_bytes / 0.5e12 + launches * 4e-6)
    assert times["fused"] < times["foreach"] < times["plain"]


def test_step_sums_micro_steps_and_one_optimizer_step_and_host_bound_is_named():
    ops = (op("elementwise", 0, 100, count=1000),)  # 1000 tiny ops: host 5 ms > GPU 2 ms
    slow_host = RATES.with_rows([rate("host", 0.0, 0.0, 5.0)])
    line = Roofline(profile(*ops), slow_host, StepOptions(optimizer_impl="fused"))
    step = line.step(GPU, micro_batch=2, accumulation=3)
    opt_gpu, opt_host = line.optimizer_step(GPU)
    assert step.host_s == pytest.approx(3 * 1000 * 5e-6)
    assert step.step_s == pytest.approx(step.host_s + max(opt_gpu, opt_host))
    assert step.host_bound and "host-bound" in step.notes[0]
    assert sum(step.by_class_s.values()) == pytest.approx(step.gpu_s + opt_gpu)


def test_recompute_runs_the_forward_twice():
    ops = (op("matmul", 1e12, 0), op("matmul", 2e12, 0, phase="backward"))
    line = Roofline(profile(*ops), RATES, StepOptions())
    plain = line.step(GPU, 1)
    again = line.step(GPU, 1, recompute=True)
    assert again.flops == pytest.approx(plain.flops + 1e12)


def test_most_specific_rate_row_wins():
    table = RateTable([
        rate("matmul", 0.5, 0.5, 1.0),
        rate("matmul", 0.6, 0.5, 1.0, key="testarch"),
        rate("matmul", 0.7, 0.5, 1.0, key="9.9"),
        rate("matmul", 0.8, 0.5, 1.0, key="TestGPU", dtype="bf16"),
    ])  # fmt: skip
    assert table.lookup(GPU, "matmul", "bf16").compute_fraction == 0.8
    assert table.lookup(GPU, "matmul", "fp32").compute_fraction == 0.7
    other = GPUSpec(name="Other", vendor="nvidia", architecture="testarch", memory_gib=1,
                    memory_bandwidth_gbps=1, tdp_w=1)  # fmt: skip
    assert table.lookup(other, "matmul", "bf16").compute_fraction == 0.6
    with pytest.raises(KeyError):
        table.lookup(GPU, "attention", "bf16")


def test_bundled_rates_cover_every_kernel_for_every_catalog_gpu():
    catalog = load_catalog(include_user=False)
    table = rate_table(catalog.rates)
    for gpu in catalog.gpus:
        for kernel in KERNELS:
            found = table.lookup(gpu, kernel, "bf16", "nchw")
            assert found.source and found.as_of


HEADER = "key,kernel,dtype,layout,compute_fraction,bandwidth_fraction,overhead_us,source,as_of\n"


@pytest.mark.parametrize(
    ("row", "column", "problem"),
    [
        ("hopper,matmul,bf16,any,1.5,0.8,5,s,2026-12-01", "compute_fraction", "[0, 1]"),
        ("hopper,matmal,bf16,any,0.5,0.8,5,s,2026-12-01", "kernel", "expected one of"),
        ("hopper,matmul,bf17,any,0.5,0.8,5,s,2026-12-01", "dtype", "expected one of"),
        ("hopper,matmul,bf16,any,0.5,nan,5,s,2026-12-01", "bandwidth_fraction", "number"),
        ("hopper,matmul,bf16,any,0.5,0.8,-1,s,2026-12-01", "overhead_us", "number"),
        ("hopper,matmul,bf16,any,0.5,0.8,5,s,yesterday", "as_of", "ISO date"),
        ("hopper,matmul,bf16,any,0.5,0.8,5,,2026-12-01", "source", "missing"),
    ],
)
def test_bad_rate_rows_name_file_line_and_column(tmp_path: Path, row, column, problem):
    path = tmp_path / "rates.csv"
    path.write_text("# my measurements\n" + HEADER + "hopper,conv,any,any,0.5,0.5,5,s,2026-12-01\n"
                    + row + "\n")  # fmt: skip
    with pytest.raises(DataError) as caught:
        load_catalog([path], include_user=False, use_cache=False)
    message = str(caught.value)
    assert message.startswith(f"{path}:4: column '{column}'")
    assert problem in message


def test_a_user_rates_file_overrides_the_bundled_row(tmp_path: Path):
    path = tmp_path / "rates.csv"
    path.write_text(HEADER + "H200,matmul,bf16,any,0.33,0.5,5,my bench,2026-12-01\n")
    catalog = load_catalog([path], include_user=False, use_cache=False)
    table = rate_table(catalog.rates)
    assert table.lookup(catalog.gpu("H200"), "matmul", "bf16").compute_fraction == 0.33


def test_a_zero_share_makes_the_kernel_infinitely_slow_not_a_crash():
    zero = RATES.with_rows([rate("matmul", 0.0, 0.0, 1.0)])
    line = Roofline(profile(op("matmul", 1e9, 1e6)), zero, StepOptions())
    cost = line.op_cost(GPU, line.profile.ops[0], 1)
    assert math.isinf(cost.seconds)


def test_a_traced_workload_fits_memory_by_its_traced_activations():
    from cloudtrain.plan import traced_workload
    from cloudtrain.plan.memory import FRAMEWORK_OVERHEAD_GIB, GIB, memory_fit

    traced = replace(
        profile(params=1_000_000),
        activation_bytes=Affine(2 * GIB, 0.5 * GIB),  # 2 GiB whatever the batch + 0.5 per sample
    )
    workload = traced_workload(traced, global_batch=64, samples_per_epoch=1e6)
    fit = memory_fit(workload, memory_gib=80, gpus=1, sharding="ddp", recompute=False)
    states_gib = 1_000_000 * 16 / GIB  # bf16 AdamW: 16 bytes per parameter
    assert fit.activations_gib_per_sample == pytest.approx(0.5)
    assert fit.overhead_gib == pytest.approx(FRAMEWORK_OVERHEAD_GIB + 2.0)
    usable = 80 * 0.9 - states_gib - FRAMEWORK_OVERHEAD_GIB - 2.0
    assert fit.max_micro_batch == math.floor(usable / 0.5)
