"""`cloudtrain plan --model FILE.py:FUNC`: a traced model through the whole planner —
breakdown, --explain, --micro-batch, errors — and plans that learn from recorded runs."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

MODEL_FILE = textwrap.dedent(
    """
    import torch
    from torch import nn

    def cnn():
        model = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1, groups=32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
        )
        images = torch.randn(4, 3, 32, 32)
        labels = torch.randint(0, 10, (4,))
        loss = lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1])
        return model, (images, labels), loss

    def mlp():
        return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)), torch.randn(8, 64)

    def broken():
        return nn.Linear(64, 8), torch.randn(2, 3)

    def not_a_pair():
        return 42

    def raises():
        raise RuntimeError("no weights here")
    """
)


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "models.py"
    path.write_text(MODEL_FILE)
    return path


def plan_json(run_cli, *args: str) -> dict:
    result = run_cli("plan", *args, "--json")
    assert result.code == 0, result.stderr
    return json.loads(result.stdout)


def test_plan_model_prices_the_traced_ops_and_keeps_every_plan_feature(run_cli, model_file):
    data = plan_json(
        run_cli, "--model", f"{model_file}:cnn", "--samples", "1e6", "--global-batch", "256",
        "--gpu", "H100-SXM", "--gpu", "L4", "--top", "0",
    )  # fmt: skip
    assert data["workload"]["profile"]["parameters"] > 1000
    assert data["assumptions"]["step_model"] == "roofline"
    for estimate in data["estimates"]:
        breakdown = estimate["breakdown"]
        assert estimate["gpu"] in ("H100-SXM", "L4")
        assert estimate["compute_s"] > 0 and estimate["total_s"] > 0 and estimate["cost"] > 0
        shares = [entry["share"] for entry in breakdown["by_class"].values()]
        assert sum(shares) == pytest.approx(1.0)
        assert {"convolution", "optimizer"} <= set(breakdown["by_class"])
        assert any(kind.startswith("conv_depthwise") for kind in breakdown["calibration"])
        assert breakdown["top_ops"][0]["seconds"] >= breakdown["top_ops"][-1]["seconds"]
    by_gpu = {e["gpu"]: e["compute_s"] for e in data["estimates"] if e["nodes"] == 1}
    assert by_gpu["L4"] > by_gpu["H100-SXM"]  # a third of the bandwidth, an eighth of the peak


def test_micro_batch_is_fixed_and_compile_and_fused_optimizer_are_inputs(run_cli, model_file):
    common = ("--model", f"{model_file}:mlp", "--samples", "1e6", "--global-batch", "512",
              "--gpu", "H100-SXM", "--max-nodes", "1", "--no-spot", "--no-reserved")  # fmt: skip
    fixed = plan_json(run_cli, *common, "--micro-batch", "64")
    best = fixed["estimates"][0]
    assert (best["micro_batch"], best["accumulation_steps"]) == (64, 8)
    fused = plan_json(run_cli, *common, "--micro-batch", "64", "--fused-optimizer")
    compiled = plan_json(run_cli, *common, "--micro-batch", "64", "--compile")
    assert fused["estimates"][0]["compute_s"] < best["compute_s"]
    assert compiled["estimates"][0]["compute_s"] < best["compute_s"]


def test_explain_prints_where_the_time_goes(run_cli, model_file):
    result = run_cli(
        "plan", "--model", f"{model_file}:cnn", "--samples", "1e5", "--gpu", "A100-80GB",
        "--top", "2", "--explain",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    assert "op class" in result.stdout and "Top ops" in result.stdout
    assert "convolution" in result.stdout and "aten." in result.stdout
    assert "roofline" in result.stdout


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("{file}:nothing", "no function 'nothing'"),
        ("{file}:broken", "broken"),
        ("{file}:not_a_pair", "must return (model, batch)"),
        ("{file}:raises", "no weights here"),
        ("{dir}/absent.py:cnn", "is not a file"),
        ("{file}", "FILE.py:FUNCTION"),
    ],
)
def test_bad_model_files_are_one_line_exit_2(run_cli, model_file, spec, expected):
    given = spec.format(file=model_file, dir=model_file.parent)
    result = run_cli("plan", "--model", given, "--samples", "1e5")
    assert result.code == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]
    assert "Traceback" not in result.stderr


def test_a_model_file_that_does_not_import_names_the_file(run_cli, tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("import torch\nraise ImportError('no module named fancy_layers')\n")
    result = run_cli("plan", "--model", f"{path}:build", "--samples", "1e5")
    assert result.code == 2
    assert str(path) in result.stderr and "fancy_layers" in result.stderr


def test_data_amount_is_required_for_a_model(run_cli, model_file):
    result = run_cli("plan", "--model", f"{model_file}:mlp")
    assert result.code == 2
    assert "--samples" in result.stderr


def test_a_recorded_run_of_the_same_model_corrects_the_plan(run_cli, model_file):
    from cloudtrain.store import RunStore
    from cloudtrain.store.records import StepRecord

    common = ("--model", f"{model_file}:mlp", "--samples", "1e6", "--global-batch", "64",
              "--micro-batch", "64", "--gpu", "H100-SXM", "--max-nodes", "1",
              "--no-spot", "--no-reserved")  # fmt: skip
    before = plan_json(run_cli, *common)
    fingerprint = before["workload"]["profile"]["fingerprint"]
    predicted_s = before["estimates"][0]["compute_s"]
    config = {"model_fingerprint": fingerprint, "planner_precision": "bf16",
              "micro_batch_size": 64, "global_batch_size": 64, "world_size": 1,
              "compile": False, "optimizer_name": "adamw", "optimizer_impl": "foreach"}  # fmt: skip
    with RunStore.open() as store:
        run_id = store.create_run(name="mlp-run", config=config, gpu_name="H100-SXM", gpu_count=1)
        store.add_steps([
            StepRecord(run_id=run_id, step=n, time_unix_s=float(n), step_s=3 * predicted_s,
                       data_wait_s=0.0)
            for n in range(1, 8)
        ])  # fmt: skip
    after = plan_json(run_cli, *common, "--from-run", run_id)
    assert after["assumptions"]["learned_from"]["factor"] == pytest.approx(3.0, rel=1e-3)
    assert after["estimates"][0]["compute_s"] == pytest.approx(3 * predicted_s, rel=1e-3)
    assert "corrected" in after["estimates"][0]["efficiency_source"]
    automatic = plan_json(run_cli, *common)  # the store holds a run of this fingerprint
    assert automatic["assumptions"]["learned_from"]["runs"][0]["run_id"] == run_id
    other = run_cli("plan", "--model", f"{model_file}:cnn", "--samples", "1e5",
                    "--from-run", run_id)  # fmt: skip
    assert other.code == 2 and "another model" in other.stderr


def test_the_readme_example_plans_gpt2_from_its_definition(run_cli):
    examples = Path(__file__).resolve().parents[1] / "examples"
    data = plan_json(
        run_cli, "--model", f"{examples / 'plan_models.py'}:gpt2", "--tokens", "10e9",
        "--global-batch", "512", "--gpu", "H100-SXM", "--top", "1",
    )  # fmt: skip
    profile = data["workload"]["profile"]
    assert 123e6 < profile["parameters"] < 126e6  # GPT-2 small, head tied to the embedding
    assert profile["traced_on"] == "meta"
    assert data["workload"]["seq_len"] == 1024
    best = data["estimates"][0]
    assert {"matmul", "attention", "optimizer"} <= set(best["breakdown"]["by_class"])
    assert best["tokens_per_s_per_gpu"] > 0
