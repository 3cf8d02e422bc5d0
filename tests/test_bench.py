"""`cloudtrain bench`: measurements on CPU (quick sizes), comparisons with a spec,
anomalies, and the round trip through the store to the planner."""

from __future__ import annotations

import json
import math

import pytest
import torch

from cloudtrain.catalog import load_catalog
from cloudtrain.catalog.rates import rate_table
from cloudtrain.catalog.types import AchievableRate, GPUSpec
from cloudtrain.monitor import bench

H100 = GPUSpec(
    "H100-SXM", "nvidia", "hopper", 80, 3350, 700, bf16_tflops=989, fp16_tflops=989, pcie_gen=5
)


def test_quick_cpu_bench_measures_everything_it_can(tmp_path):
    seen: list[str] = []
    result = bench.run_bench(
        quick=True,
        data_dir=tmp_path,
        device="cpu",
        on_progress=lambda label, d, t: seen.append(label),
    )
    assert result.device == "cpu" and result.gpu is None
    assert set(result.matmul_tflops) == {"fp32", "bf16"}
    assert all(v > 0 for sizes in result.matmul_tflops.values() for v in sizes.values())
    assert result.matmul_best_tflops["fp32"] == max(result.matmul_tflops["fp32"].values())
    assert result.memory_gb_per_s > 0 and result.disk_read_gb_per_s > 0
    assert result.cpu_images_per_s_per_core > 0
    assert result.h2d_pinned_gb_per_s is None  # no device here
    assert seen[0].startswith("matmul") and seen[-1] == "done"
    assert list(tmp_path.iterdir()) == []  # the scratch file is gone
    # the kernel measurements: every shape per dtype, conv both layouts, the rest once
    assert {"128", "256", "512x96x384", "8x512x512"} == set(result.matmul_tflops["bf16"])
    assert result.kernel_dtype == "fp32" and set(result.conv_tflops) == {"nchw", "nhwc"}
    measured = [
        *result.conv_tflops.values(), result.depthwise_gb_per_s, result.elementwise_gb_per_s,
        result.reduction_gb_per_s, result.launch_us, result.host_op_us,
    ]  # fmt: skip
    assert all(value is not None and 0 < value < math.inf for value in measured)
    assert result.launch_us == result.host_op_us  # on the CPU the op runs where it is sent
    assert result.rates == [] and result.kernel_fraction == {}  # no catalog GPU: no rows


def test_matmul_flops_count():
    # 2 n^3 FLOPs in the measured time: a positive, finite rate on CPU
    assert 0 < bench.matmul_tflops("fp32", 64, "cpu", min_s=0.01) < 100


def test_kernel_measurements_on_the_cpu_at_tiny_sizes():
    rates = [
        bench.matmul_shape_tflops("fp32", 64, 16, 48, "cpu", min_s=0.005),
        bench.matmul_shape_tflops("bf16", 4, 64, 64, "cpu", min_s=0.005),
        bench.conv_tflops("cpu", "fp32", (1, 8, 8), channels_last=False, min_s=0.005),
        bench.conv_tflops("cpu", "fp32", (1, 8, 8), channels_last=True, min_s=0.005),
        bench.depthwise_gb_per_s("cpu", "fp32", (1, 8, 8), min_s=0.005),
        bench.elementwise_gb_per_s("cpu", "fp32", 1, min_s=0.005),
        bench.reduction_gb_per_s("cpu", "fp32", 1, min_s=0.005, width=256),
        *bench.launch_latency_us("cpu", 200, repeats=2),
    ]
    assert all(0 < value < math.inf for value in rates)


def test_disk_read_uses_existing_files(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"x" * 3_000_000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.bin").write_bytes(b"y" * 3_000_000)
    rate, _ = bench.disk_read_gb_per_s(tmp_path, size_mb=4)
    assert rate > 0
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a.bin", "b.bin", "sub"]


def test_comparison_with_the_spec_and_anomalies():
    result = bench.BenchResult("cuda", "NVIDIA H100 80GB HBM3", "H100-SXM", {})
    result.matmul_best_tflops = {"bf16": 300.0}
    result.memory_gb_per_s = 3000.0
    result.h2d_pinned_gb_per_s = 12.0
    result.h2d_pageable_gb_per_s = 2.0
    result.disk_read_gb_per_s = 0.05
    result.disk_dir = "/data"
    bench._compare(result, H100)
    assert result.matmul_fraction["bf16"] == pytest.approx(300 / 989, abs=1e-4)
    assert result.memory_fraction == pytest.approx(3000 / 3350, abs=1e-4)
    assert result.pcie_fraction == pytest.approx(12 / 63, abs=1e-4)
    text = " | ".join(result.anomalies)
    assert "bf16 matmul reaches 30%" in text
    assert "PCIe gen5" in text and "pin_memory" in text and "local NVMe" in text
    assert "device memory" not in text  # 90% of the datasheet is fine


def test_unknown_gpu_is_flagged_not_guessed():
    result = bench.BenchResult("cuda", "NVIDIA Mystery 9000", None, {})
    bench._compare(result, None)
    assert result.matmul_fraction == {}
    assert "not in the catalog" in result.anomalies[0]


def test_saved_bench_feeds_the_planner():
    from cloudtrain.store import RunStore

    older = bench.BenchResult("cuda", "NVIDIA H100 80GB HBM3", "H100-SXM", {})
    older.matmul_fraction = {"bf16": 0.5}
    newer = bench.BenchResult("cuda", "NVIDIA H100 80GB HBM3", "H100-SXM", {})
    newer.matmul_fraction = {"bf16": 0.79, "fp8": 0.7}
    cpu = bench.BenchResult("cpu", "x86_64", None, {})
    with RunStore.open() as store:
        bench.save_bench(older, store)
        run_id = bench.save_bench(newer, store)
        bench.save_bench(cpu, store)
        assert store.get_run(run_id).kind == "bench"
        assert store.get_run(run_id).summary["matmul_fraction"]["bf16"] == 0.79
        assert bench.latest_matmul_fractions(store) == {"H100-SXM": {"bf16": 0.79, "fp8": 0.7}}


def test_cli_bench_quick_json_saves_a_run(run_cli, tmp_path):
    result = run_cli("bench", "--quick", "--json", "--data-dir", str(tmp_path))
    assert result.code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["device"] in ("cpu", "cuda") and data["run_id"]
    from cloudtrain.store import RunStore

    with RunStore.open() as store:
        assert store.get_run(data["run_id"]).kind == "bench"


def test_cli_bench_table(run_cli, tmp_path):
    result = run_cli("bench", "--quick", "--no-save", "--data-dir", str(tmp_path))
    assert result.code == 0, result.stderr
    assert "matmul fp32" in result.stdout and "disk read" in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 100
    missing = run_cli("bench", "--quick", "--data-dir", str(tmp_path / "nope"))
    assert missing.code == 2 and "not a directory" in missing.stderr


def h200_bench(**changes) -> bench.BenchResult:
    """A bench on an H200 with known numbers (peaks: bf16 989, fp32 67, fp8 1979 TFLOP/s;
    memory 4800 GB/s)."""
    result = bench.BenchResult("cuda", "NVIDIA H200", "H200", {"hostname": "node7"})
    result.matmul_best_tflops = {"bf16": 500.0, "fp32": 50.0, "fp8": 2500.0}
    result.memory_gb_per_s = 4000.0
    result.kernel_dtype = "bf16"
    result.conv_tflops = {"nchw": 300.0, "nhwc": 450.0}
    result.depthwise_gb_per_s = 2400.0
    result.elementwise_gb_per_s = 4200.0
    result.reduction_gb_per_s = 3600.0
    result.launch_us = 2.5
    result.host_op_us = 6.0
    for name, value in changes.items():
        setattr(result, name, value)
    return result


def test_rate_rows_from_a_bench_on_a_catalog_gpu():
    catalog = load_catalog()
    spec, table = catalog.gpu("H200"), rate_table(catalog.rates)
    rows = bench.bench_rates(h200_bench(), spec, table, today="2026-01-02")
    by_kind = {(r.kernel, r.dtype, r.layout): r for r in rows}
    assert set(by_kind) == {
        ("matmul", "bf16", "any"), ("matmul", "fp32", "any"), ("matmul", "fp8", "any"),
        ("conv", "bf16", "nchw"), ("conv", "bf16", "nhwc"), ("conv_depthwise", "any", "nchw"),
        ("elementwise", "any", "any"), ("reduction", "any", "any"),
        ("data_movement", "any", "any"), ("host", "any", "any"),
    }  # fmt: skip
    assert all(r.key == "H200" and r.as_of == "2026-01-02" for r in rows)
    assert rows[0].source == "cloudtrain bench on node7 (2026-01-02)"
    assert all(0 < r.compute_fraction <= 1 and 0 < r.bandwidth_fraction <= 1
               for r in rows if r.kernel != "host")  # fmt: skip
    # measured: compute shares of the dense peak, bandwidth shares of 4800 GB/s
    assert by_kind["matmul", "bf16", "any"].compute_fraction == 0.5056  # 500 / 989
    assert by_kind["matmul", "fp32", "any"].compute_fraction == 0.7463  # 50 / 67
    assert by_kind["matmul", "fp8", "any"].compute_fraction == 1.0  # 2500 / 1979, clipped
    assert by_kind["conv", "bf16", "nchw"].compute_fraction == 0.3033  # 300 / 989
    assert by_kind["conv", "bf16", "nhwc"].compute_fraction == 0.455  # 450 / 989
    assert by_kind["conv_depthwise", "any", "nchw"].bandwidth_fraction == 0.5  # 2400 / 4800
    assert by_kind["elementwise", "any", "any"].bandwidth_fraction == 0.875  # 4200 / 4800
    assert by_kind["reduction", "any", "any"].bandwidth_fraction == 0.75  # 3600 / 4800
    assert by_kind["data_movement", "any", "any"].bandwidth_fraction == 0.8333  # 4000 / 4800
    # overheads: the launch latency; the host row the dispatch time per op
    for kind in ("matmul", "elementwise", "reduction", "data_movement"):
        assert all(r.overhead_us == 2.5 for r in rows if r.kernel == kind)
    assert by_kind["host", "any", "any"].overhead_us == 6.0
    # what was not measured is the catalog's row for the GPU
    catalog_conv = table.lookup(spec, "conv", "bf16", "nhwc")
    assert by_kind["conv", "bf16", "nhwc"].overhead_us == catalog_conv.overhead_us
    assert by_kind["conv", "bf16", "nhwc"].bandwidth_fraction == catalog_conv.bandwidth_fraction
    catalog_add = table.lookup(spec, "elementwise", "any")
    assert by_kind["elementwise", "any", "any"].compute_fraction == catalog_add.compute_fraction


def test_compare_fills_the_rates_and_the_shares_shown():
    catalog = load_catalog()
    result = h200_bench()
    bench._compare(result, catalog.gpu("H200"), rate_table(catalog.rates))
    assert result.kernel_fraction == {
        "conv nchw": 0.3033, "conv nhwc": 0.455, "conv_depthwise": 0.5,
        "elementwise": 0.875, "reduction": 0.75,
    }  # fmt: skip
    assert len(result.rates) == 10 and result.as_dict()["rates"] == result.rates
    assert AchievableRate(**result.rates[0]).key == "H200"
    from cloudtrain.cli.plan_cmds import _bench_rows

    result.disk_read_gb_per_s, result.disk_dir, result.cpu_images_per_s_per_core = 1.0, "/d", 99.0
    rows = _bench_rows(result)
    labels = [row[0] for row in rows]
    assert "conv 3x3 channels_last" in labels and "launch latency" in labels
    assert "rate matmul bf16/any" in labels and "rate host any/any" in labels
    assert rows[labels.index("conv 3x3 NCHW")][:3] == ["conv 3x3 NCHW", "300 TFLOP/s", "30%"]


def test_no_rate_rows_without_a_catalog_gpu():
    catalog = load_catalog()
    unknown = h200_bench(gpu=None, device_name="NVIDIA Mystery 9000")
    assert bench.bench_rates(unknown, None) == []
    bench._compare(unknown, None)
    assert unknown.rates == []
    # nothing measured: no row (a zero would make the planner divide by it)
    empty = bench.BenchResult("cuda", "NVIDIA H200", "H200", {})
    assert bench.bench_rates(empty, catalog.gpu("H200")) == []


def test_saved_rates_round_trip_through_the_store():
    from cloudtrain.cli.plan_cmds import _measured_rates
    from cloudtrain.store import RunStore

    assert _measured_rates() == []  # no store yet
    catalog = load_catalog()
    h200, h100 = catalog.gpu("H200"), catalog.gpu("H100-SXM")
    older = h200_bench()
    bench._compare(older, h200)
    newer = h200_bench(matmul_best_tflops={"bf16": 700.0})
    bench._compare(newer, h200)
    other = h200_bench(gpu="H100-SXM", device_name="NVIDIA H100 80GB HBM3")
    bench._compare(other, h100)
    legacy = bench.BenchResult("cuda", "NVIDIA H200", "H200", {})  # saved before rates
    legacy.matmul_fraction = {"bf16": 0.6}
    with RunStore.open() as store:
        for result in (older, newer, other, legacy, bench.BenchResult("cpu", "x86_64", None, {})):
            bench.save_bench(result, store)
        rows = bench.latest_rates(store)
    assert all(isinstance(row, AchievableRate) for row in rows)
    assert [r for r in rows if r.key == "H200"] == [AchievableRate(**r) for r in newer.rates]
    assert [r for r in rows if r.key == "H100-SXM"] == [AchievableRate(**r) for r in other.rates]
    assert len(rows) == len(newer.rates) + len(other.rates)
    h200_bf16 = next(r for r in rows if r.key == "H200" and r.kernel == "matmul")
    assert h200_bf16.compute_fraction == 0.7078  # 700 / 989: the newer bench
    assert _measured_rates() == rows  # what `cloudtrain plan` passes to the planner


def test_latest_rates_passes_over_rows_that_do_not_read():
    class Store:
        def list_runs(self, limit, status):
            from types import SimpleNamespace

            good = {"key": "H200", "kernel": "matmul", "dtype": "bf16", "layout": "any",
                    "compute_fraction": 0.6, "bandwidth_fraction": 0.8, "overhead_us": 2.0,
                    "source": "s", "as_of": "2026-01-02"}  # fmt: skip
            bad = [
                {**good, "kernel": "warp"},
                {**good, "compute_fraction": 1.5},
                {"key": "H200"},
                "x",
            ]
            run = SimpleNamespace(kind="bench", gpu_name="H200", summary={"rates": [good, *bad]})
            return [run]

    assert [r.kernel for r in bench.latest_rates(Store())] == ["matmul"]


def test_plan_prices_a_traced_model_with_the_measured_rates():
    from cloudtrain.plan import Constraints, plan, traced_workload
    from cloudtrain.plan.profile import Affine, ModelProfile, OpRecord

    # 12 bf16 matmuls of 2e11 FLOPs per sample: compute-bound on an H200
    ops = tuple(
        OpRecord(op="aten.mm", op_class="matmul", phase=phase, dtype="bf16", count=count,
                 flops=Affine(0.0, 2e11), bytes=Affine(0.0, 1e7))
        for phase, count in (("forward", 4), ("backward", 8))
    )  # fmt: skip
    profile = ModelProfile(
        name="toy", fingerprint="f", precision="bf16", channels_last=False,
        parameters=10_000_000, parameter_tensors=8, frozen_parameters=0, ops=ops,
        activation_bytes=Affine(0.0, 1e7), sample_shape=(3, 32, 32),
    )  # fmt: skip
    workload = traced_workload(profile, global_batch=64, samples_per_epoch=1e5, micro_batch=16)
    catalog = load_catalog()
    spec = catalog.gpu("H200")
    catalog_mm = rate_table(catalog.rates).lookup(spec, "matmul", "bf16")
    measured = bench.bench_rates(h200_bench(matmul_best_tflops={"bf16": 200.0}), spec)
    mm = next(r for r in measured if r.kernel == "matmul")
    assert mm.compute_fraction == 0.2022 < catalog_mm.compute_fraction  # 200 / 989
    constraints = Constraints(gpus=("H200",), max_nodes=1)
    base = plan(workload, constraints, catalog)
    slow = plan(workload, constraints, catalog, measured_rates=measured)

    def key(e):
        return (e.label, e.micro_batch, e.accumulation_steps, e.sharding)

    slower = {key(e): e for e in slow.estimates}
    assert base.estimates and set(slower) == {key(e) for e in base.estimates}
    for estimate in base.estimates:
        after = slower[key(estimate)]
        # per GPU: 12 matmuls x micro-batch x 2e11 FLOPs, accumulation micro-steps; the
        # measured row also swaps the catalog's launch overhead for the measured 2.5 µs
        micro, acc = estimate.micro_batch, estimate.accumulation_steps
        flops_s = 12 * micro * 2e11 / 989e12
        expected = acc * (
            flops_s * (1 / mm.compute_fraction - 1 / catalog_mm.compute_fraction)
            + 12 * (mm.overhead_us - catalog_mm.overhead_us) * 1e-6
        )
        assert after.compute_s - estimate.compute_s == pytest.approx(expected, rel=1e-6)
        assert after.compute_s > estimate.compute_s
    calibration = slow.best.breakdown["calibration"]
    assert "cloudtrain bench on node7" in calibration["matmul bf16"]["source"]
    assert "cloudtrain bench" not in base.best.breakdown["calibration"]["matmul bf16"]["source"]


def test_cli_plan_of_a_traced_model_uses_the_saved_bench(run_cli, tmp_path):
    from cloudtrain.store import RunStore

    (tmp_path / "mlp.py").write_text(
        "import torch\nfrom torch import nn\n\n\ndef build():\n"
        "    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 10))\n"
        "    return model, torch.randn(8, 256)\n"
    )
    args = ("plan", "--model", f"{tmp_path / 'mlp.py'}:build", "--samples", "1e5",
            "--gpu", "H200", "--max-nodes", "1", "--json", "--top", "1")  # fmt: skip

    def calibration() -> dict[str, dict[str, str]]:
        done = run_cli(*args)
        assert done.code == 0, done.stderr
        return json.loads(done.stdout)["estimates"][0]["breakdown"]["calibration"]

    assert "cloudtrain bench" not in calibration()["matmul bf16"]["source"]
    result = h200_bench()
    bench._compare(result, load_catalog().gpu("H200"))
    with RunStore.open() as store:
        bench.save_bench(result, store)
    used = calibration()
    assert used["matmul bf16"]["row"] == "H200 matmul bf16/any"
    assert used["matmul bf16"]["source"].startswith("cloudtrain bench on node7")
    assert "cloudtrain bench on node7" in used["host any"]["source"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_bench_compares_with_the_catalog(tmp_path):
    from cloudtrain.catalog import load_catalog

    result = bench.run_bench(quick=True, data_dir=tmp_path, catalog=load_catalog())
    assert result.device == "cuda"
    assert result.h2d_pinned_gb_per_s and result.d2h_pageable_gb_per_s
    if result.gpu is not None:
        assert 0.2 < result.matmul_fraction["bf16"] < 1.1
        assert {row["kernel"] for row in result.rates} >= {"matmul", "conv", "host"}
    assert 0 < result.launch_us < 100 and 0 < result.host_op_us < 1000
    assert set(result.conv_tflops) == {"nchw", "nhwc"} and result.kernel_dtype in ("bf16", "fp16")


def test_small_rates_keep_their_significant_digits():
    # a loaded CPU can run a bf16 matmul at well under 1 GFLOP/s: never report it as 0
    assert bench.significant(0.000123456) == 0.0001235
    assert bench.significant(1979.26) == 1979.0
