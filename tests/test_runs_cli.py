"""`cloudtrain runs` and `cloudtrain runs show`, run as the user runs them (subprocess)."""

from __future__ import annotations

import json

import pytest

from cloudtrain.store import Event, RunStore, StepRecord


@pytest.fixture
def two_runs() -> dict[str, str]:
    """A finished priced 8-GPU run with steps and events, and a running unpriced one."""
    with RunStore.open() as store:
        done = store.create_run(
            "gpt-small-sweep-lr-3e-4-warmup-2000",
            gpu_name="H100-SXM",
            gpu_count=8,
            provider="aws",
            region="us-east-1",
            instance_type="p5.48xlarge",
            price_usd_per_hour=98.32,
            command=["torchrun", "train.py"],
        )
        store.add_steps([StepRecord(done, s, 1000.0 + s, loss=3.0 - s / 100) for s in range(120)])
        store.add_events([Event(done, "checkpoint", "saved"), Event(done, "checkpoint", "saved")])
        run = store.get_run(done)
        assert run.started_at is not None
        store.update_run(done, status="completed", ended_at=run.started_at + 2 * 3600)
        running = store.create_run("resnet", gpu_name="L4", gpu_count=1)
    return {"done": done, "running": running}


def test_empty_store_says_no_runs_yet(run_cli):
    done = run_cli("runs")
    assert done.code == 0
    assert "no runs yet" in done.stdout
    assert json.loads(run_cli("runs", "--json").stdout) == []


def test_runs_table_fits_100_columns(run_cli, two_runs):
    done = run_cli("runs")
    assert done.code == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 100
    header = lines[0].split()
    assert header == ["id", "name", "status", "started", "duration", "GPU", "cost", "step"]
    body = "\n".join(lines[1:])
    assert body.index(two_runs["running"]) < body.index(two_runs["done"])  # newest first
    done_line = next(line for line in lines if two_runs["done"] in line)
    # 2 h at $98.32/h, 8 GPUs, last step 119
    for cell in ("completed", "2h00m", "8x H100-SXM", "$196.64", "119"):
        assert cell in done_line


def test_runs_json_and_filters(run_cli, two_runs):
    listed = json.loads(run_cli("runs", "--json").stdout)
    assert [item["run"]["id"] for item in listed] == [two_runs["running"], two_runs["done"]]
    done = listed[1]
    assert done["cost_usd"] == pytest.approx(196.64)
    assert done["last_step"]["step"] == 119 and done["step_records"] == 120
    assert done["event_counts"] == {"checkpoint": 2}
    only = json.loads(run_cli("runs", "--status", "completed", "--limit", "5", "--json").stdout)
    assert [item["run"]["id"] for item in only] == [two_runs["done"]]
    bad = run_cli("runs", "--status", "finishd")
    assert bad.code == 2
    assert "valid choices: completed" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_runs_show_by_prefix_and_name(run_cli, two_runs):
    done_id, other_id = two_runs["done"], two_runs["running"]
    unique = next(n for n in range(1, 13) if done_id[:n] != other_id[:n])
    shown = run_cli("runs", "show", done_id[:unique])
    assert shown.code == 0, shown.stderr
    text = shown.stdout
    for expected in (
        two_runs["done"],
        "gpt-small-sweep-lr-3e-4-warmup-2000",
        "aws / us-east-1 / p5.48xlarge",
        "$98.32/h",
        "step 119",
        "checkpoint=2",
        "torchrun train.py",
    ):
        assert expected in text, expected
    as_json = json.loads(run_cli("runs", "show", "resnet", "--json").stdout)
    assert as_json["run"]["id"] == two_runs["running"]
    assert as_json["last_step"] is None and as_json["cost_usd"] is None


def test_runs_show_unknown_run_is_a_one_line_user_error(run_cli, two_runs):
    done = run_cli("runs", "show", "resnt")
    assert done.code == 2
    assert done.stderr.strip().splitlines() == [
        "error: no run 'resnt'; did you mean resnet? (`cloudtrain runs` lists ids and names)"
    ]
