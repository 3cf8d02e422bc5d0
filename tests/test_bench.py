"""`cloudtrain bench`: measurements on CPU (quick sizes), comparisons with a spec,
anomalies, and the round trip through the store to the planner."""

from __future__ import annotations

import json

import pytest
import torch

from cloudtrain.catalog.types import GPUSpec
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


def test_matmul_flops_count():
    # 2 n^3 FLOPs in the measured time: a positive, finite rate on CPU
    assert 0 < bench.matmul_tflops("fp32", 64, "cpu", min_s=0.01) < 100


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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_bench_compares_with_the_catalog(tmp_path):
    from cloudtrain.catalog import load_catalog

    result = bench.run_bench(quick=True, data_dir=tmp_path, catalog=load_catalog())
    assert result.device == "cuda"
    assert result.h2d_pinned_gb_per_s and result.d2h_pageable_gb_per_s
    if result.gpu is not None:
        assert 0.2 < result.matmul_fraction["bf16"] < 1.1


def test_small_rates_keep_their_significant_digits():
    # a loaded CPU can run a bf16 matmul at well under 1 GFLOP/s: never report it as 0
    assert bench.significant(0.000123456) == 0.0001235
    assert bench.significant(1979.26) == 1979.0
