"""`cloudtrain plan`: table, JSON, workload files, exit codes, impossible requests."""

from __future__ import annotations

import json

import pytest


def test_plan_table_fits_100_columns_and_explains(run_cli):
    result = run_cli("plan", "--preset", "gpt2-124m", "--tokens", "1e9", "--top", "5")
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert "Why:" in result.stdout and "Pareto frontier" in result.stdout
    assert any(line.startswith("│1") for line in lines)


def test_plan_json_is_the_whole_plan(run_cli):
    result = run_cli(
        "plan", "--preset", "llama-7b", "--tokens", "20e9", "--deadline", "72h",
        "--provider", "aws", "--no-reserved", "--top", "3", "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    data = json.loads(result.stdout)
    assert len(data["estimates"]) == 3
    assert data["frontier"] and data["assumptions"]["efficiency"]
    assert data["workload"]["tokens"] == 20e9
    assert data["constraints"]["deadline_s"] == 72 * 3600
    for estimate in data["estimates"]:
        assert estimate["provider"] == "aws" and estimate["pricing"] != "reserved"
        assert estimate["total_s"] <= 72 * 3600
    best = data["estimates"][0]
    assert data["run_command"].startswith(
        f"cloudtrain run --offer aws/{best['region']}/{best['instance_type']} "
    )


def test_filters_take_comma_lists_like_offers(run_cli):
    result = run_cli(
        "plan", "--preset", "gpt2-124m", "--tokens", "1e9", "--provider", "aws,gcp",
        "--top", "50", "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    providers = {e["provider"] for e in json.loads(result.stdout)["estimates"]}
    assert providers == {"aws", "gcp"}


def test_plan_from_a_workload_file_with_constraints(run_cli, tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(
        '[workload]\npreset = "bert-base"\ntokens = 2e9\nprecision = "fp16"\n\n'
        '[constraints]\ncountries = ["DEU", "FRA", "NLD"]\nobjective = "carbon"\n'
    )
    result = run_cli("plan", str(path), "--json", "--top", "2")
    assert result.code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["constraints"]["objective"] == "carbon"
    assert data["workload"]["precision"] == "fp16"


def test_impossible_request_exits_2_with_what_to_relax(run_cli):
    result = run_cli("plan", "--preset", "llama-70b", "--deadline", "1h")
    assert result.code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "no plan meets the constraints" in lines[0] and "--deadline" in lines[0]


def test_nothing_fits_exits_2(run_cli):
    result = run_cli("plan", "--preset", "llama-70b", "--gpu", "T4", "--max-nodes", "1")
    assert result.code == 2 and "does not fit" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--preset", "lama-7b"), "did you mean llama-7b"),
        (("--preset", "gpt2-124m", "--gpu", "H100-SMX"), "did you mean"),
        (("--preset", "gpt2-124m", "--deadline", "soon"), "cannot read duration"),
        (("--preset", "gpt2-124m", "--currency", "EUR"), "unknown currency 'EUR'"),
        ((), "--preset"),
    ],
)
def test_user_errors_exit_2(run_cli, args, message):
    result = run_cli("plan", *args)
    assert result.code == 2, result.stdout
    assert message in result.stderr


def test_bad_workload_file_names_the_file(run_cli, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('preset = "gpt2-124m"\nlayerz = 3\n')
    result = run_cli("plan", str(path))
    assert result.code == 2
    assert "bad.toml" in result.stderr and "did you mean layers" in result.stderr


def test_plan_uses_the_latest_bench_of_that_gpu(run_cli):
    from cloudtrain.store import RunStore

    with RunStore.open() as store:
        run_id = store.create_run(kind="bench", gpu_name="A100-80GB", gpu_count=1)
        store.update_run(run_id, status="completed", summary={"matmul_fraction": {"bf16": 0.7}})
    result = run_cli("plan", "--preset", "gpt2-124m", "--gpu", "A100-80GB", "--json", "--top", "1")
    assert result.code == 0, result.stderr
    best = json.loads(result.stdout)["estimates"][0]
    assert "measured" in best["efficiency_source"]
    assert best["efficiency"] == pytest.approx(0.5 * 0.7 / 0.869, abs=1e-3)
    forced = run_cli(
        "plan", "--preset", "gpt2-124m", "--gpu", "A100-80GB", "--efficiency", "0.3", "--json"
    )
    assert json.loads(forced.stdout)["estimates"][0]["efficiency"] == 0.3


def test_plan_ends_with_the_run_command_for_its_best_offer(run_cli):
    from cloudtrain.catalog import find_offer, load_catalog

    result = run_cli("plan", "--preset", "llama-7b", "--tokens", "20e9", "--deadline", "72h")
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[-2].startswith("Run it on each of the")
    command = lines[-1].split()
    assert command[:3] == ["cloudtrain", "run", "--offer"] and command[-2:] == ["--", "train.py"]
    flags = dict(zip(command[2:-2:2], command[3:-2:2], strict=True))
    offer = find_offer(load_catalog(), flags["--offer"])
    assert flags["--pricing"] in ("on-demand", "spot", "reserved")
    assert int(flags["--nproc"]) == offer.gpu_count and int(flags["--nnodes"]) > 1
