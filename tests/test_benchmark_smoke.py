"""The GPU benchmarks' code, run at tiny sizes on the CPU (the throughput comparison)
or over recorded NVML readings (the sampler's cost), so a session with a GPU spends
its minutes measuring rather than finding a bug in a script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPT = BENCHMARKS / "train_throughput.py"
NVML_RECORDING = Path(__file__).resolve().parent / "fixtures" / "nvml" / "h100_load.json"


@pytest.mark.slow
def test_train_throughput_smoke_runs_all_three_loops_for_both_models(tmp_path):
    out = tmp_path / "smoke.json"
    args = ["--skip-cpu", "--smoke", "--cuda-steps", "4", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    smoke = json.loads(out.read_text())["smoke"]
    assert set(smoke) == {"gpt2_124m", "resnet50"}
    for result in smoke.values():
        assert result["device"] == "cpu" and result["flops_per_step"] > 0
        times = {k: result[k]["step_s"] for k in ("a_plain_fp32", "b_hand_tuned", "c_trainer")}
        assert all(t > 0 for t in times.values())
        assert result["c_over_b"] == pytest.approx(times["b_hand_tuned"] / times["c_trainer"])
        assert result["c_trainer"]["mfu"] is None  # no catalog peak for a CPU: never a guess


def test_sampler_overhead_names_the_cost_of_each_nvml_reading(tmp_path):
    out = tmp_path / "overhead.json"
    args = ["--duration-s", "0.3", "--interval-s", "0.1", "--recording", str(NVML_RECORDING)]
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "sampler_overhead.py"), *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    costs = json.loads(out.read_text())["nvml_ms_per_tick"]
    # the per-tick readings, not the static ones read once at the first tick
    assert {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetPcieThroughput"} <= set(costs)
    assert "nvmlDeviceGetName" not in costs
    cpu_ms = [cost["cpu_ms"] for cost in costs.values()]
    assert all(ms >= 0 for ms in cpu_ms) and cpu_ms == sorted(cpu_ms, reverse=True)


@pytest.mark.slow
def test_validate_planner_traces_cases_and_writes_the_tables(tmp_path):
    """The validation pipeline (trace a zoo model, plan it, compare) on its first cases."""
    md, out = tmp_path / "validation.md", tmp_path / "validation.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "validate_planner.py"), "--limit", "2",
         "--out-md", str(md), "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert len(result["runs"]) == 7  # the published LLM runs
    traced = result["traced"]
    assert [row["case"] for row in traced] == ["resnet18", "resnet34"]
    for row in traced:
        assert row["predicted_s"] > 0 and row["error"] == pytest.approx(
            row["predicted_s"] / row["measured_s"] - 1
        )
    text = md.read_text()
    assert "# Step time of traced models" in text and "| resnet34 |" in text
