"""`cloudtrain watch` and `cloudtrain diagnose` from the command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cloudtrain.store import RunStore
from fixtures.runs.loader import load_run

NVML = Path(__file__).parent / "fixtures" / "nvml"


def test_watch_once_json_with_recorded_gpus(run_cli):
    done = run_cli(
        "watch", "--once", "--json", env={"CLOUDTRAIN_NVML_RECORDING": str(NVML / "h100_load.json")}
    )
    assert done.code == 0, done.stderr
    payload = json.loads(done.stdout)
    gpus = payload["snapshot"]["gpus"]
    assert [g["name"] for g in gpus] == ["NVIDIA H100 80GB HBM3"] * 2
    assert gpus[0]["power_limit_w"] == 700.0 and payload["run"] is None
    assert payload["snapshot"]["host"]["cpu_pct"] is not None


def test_watch_once_text_without_gpu(run_cli):
    done = run_cli(
        "watch", "--once", env={"CLOUDTRAIN_NVML_RECORDING": str(NVML / "no_driver.json")}
    )
    assert done.code == 0, done.stderr
    assert "No GPU: NVML library not found" in done.stdout and "RAM" in done.stdout


def test_watch_json_needs_once(run_cli):
    done = run_cli("watch", "--json")
    assert done.code == 2 and "--once" in done.stderr


def test_watch_runs_and_records_a_command(run_cli, cloudtrain_home: Path):
    script = "import time, sys; time.sleep(1.2); sys.exit(3)"
    done = run_cli(
        "watch",
        "--interval",
        "0.2",
        "--name",
        "scripted",
        "--price",
        "3.6",
        "--",
        sys.executable,
        "-c",
        script,
        env={"CLOUDTRAIN_NVML_RECORDING": str(NVML / "h100_load.json")},
    )
    assert done.code == 3, done.stderr
    assert "scripted" in done.stdout and "exit code 3" in done.stdout
    with RunStore.open(cloudtrain_home / "store.db") as store:
        run = store.get_run("scripted")
        assert run.kind == "watch" and run.status == "failed"
        assert run.command[-1] == script and run.gpu_name == "H100-SXM" and run.gpu_count == 2
        samples = store.samples(run.id)
        assert len(samples) >= 3
        assert any(s.metrics.get("proc/num_procs") for s in samples)
        assert run.summary["exit_code"] == 3
        assert run.summary["energy"]["gpu_kwh"] > 0 and run.summary["energy"]["cost_usd"] > 0


def test_watch_idle_guard_stops_the_command(run_cli, cloudtrain_home: Path):
    done = run_cli(
        "watch",
        "--interval",
        "0.2",
        "--name",
        "idler",
        "--idle-minutes",
        "0",
        "--idle-stop",
        "--",
        sys.executable,
        "-c",
        "import time; time.sleep(60)",
        env={"CLOUDTRAIN_NVML_RECORDING": str(NVML / "t4_idle.json")},
    )
    assert "gpu_idle" in done.stderr and "stopping the job" in done.stderr
    with RunStore.open(cloudtrain_home / "store.db") as store:
        run = store.get_run("idler")
        assert run.status == "stopped" and run.summary["stopped_by"] == "gpu_idle"
        assert run.duration_s() < 30
        (event,) = store.events(run.id, kind="alert")
        assert event.data["rule"] == "gpu_idle"


def test_diagnose_cli_text_and_json(run_cli, cloudtrain_home: Path):
    with RunStore.open(cloudtrain_home / "store.db") as store:
        run_id = load_run(store, "slow_a10g")
    text = run_cli("diagnose", "resnet50-a10g")
    assert text.code == 0, text.stderr
    assert "input_bound" in text.stdout and "evidence:" in text.stdout
    assert "kg CO2e" in text.stdout
    payload = json.loads(run_cli("diagnose", run_id[:8], "--json").stdout)
    rules = {f["rule"] for f in payload["findings"]}
    assert {"input_bound", "fp32_precision", "host_bound"} <= rules
    assert payload["energy"]["carbon_source"] == "country DEU"
    with RunStore.open(cloudtrain_home / "store.db") as store:
        assert {f.rule for f in store.findings(run_id)} == rules
    assert run_cli("diagnose", "nope").code == 2
