"""Diagnosis rules: each fires on recorded data that shows its problem and stays quiet on
data that does not; findings are stored; energy and carbon are accounted."""

from __future__ import annotations

import dataclasses

import pytest

from cloudtrain.catalog import load_catalog, lookup
from cloudtrain.diagnose import RULES, RunData, account_energy, diagnose, diagnose_run
from cloudtrain.diagnose import rules as R
from cloudtrain.diagnose import rules_system as RS
from cloudtrain.diagnose.energy import cumulative_total, integrate_power_j
from cloudtrain.store import Run, RunStore, Sample, StepRecord
from fixtures.runs.loader import load_run


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


@pytest.fixture(scope="module")
def recorded(catalog, tmp_path_factory):
    """The three recorded runs, loaded into a real store once."""
    store = RunStore.open(tmp_path_factory.mktemp("store") / "store.db")
    data = {}
    for name in ("healthy_h100", "slow_a10g", "troubled_ddp"):
        run_id = load_run(store, name)
        run = store.get_run(run_id)
        spec = lookup.resolve_gpu(catalog, run.gpu_name)
        data[name] = RunData(
            run, store.steps(run_id), store.samples(run_id), store.events(run_id), spec
        )
    yield store, data
    store.close()


def rules_fired(data: RunData) -> set[str]:
    return {f.rule for f in diagnose(data)}


def test_every_rule_is_named_as_in_the_issue():
    assert set(RULES) == {
        "input_bound",
        "host_bound",
        "small_micro_batch",
        "fp32_precision",
        "tf32_off",
        "low_mfu",
        "memory_headroom",
        "oom_adjustments",
        "throttling",
        "stall",
        "communication_bound",
        "stragglers",
    }


def test_healthy_run_has_no_findings(recorded):
    _, data = recorded
    assert diagnose(data["healthy_h100"]) == []


def test_slow_single_gpu_run(recorded):
    _, data = recorded
    assert rules_fired(data["slow_a10g"]) == {
        "input_bound",
        "host_bound",
        "small_micro_batch",
        "fp32_precision",
        "tf32_off",
        "low_mfu",
    }


def test_troubled_ddp_run(recorded):
    _, data = recorded
    assert rules_fired(data["troubled_ddp"]) == {
        "oom_adjustments",
        "throttling",
        "stall",
        "communication_bound",
        "stragglers",
        "low_mfu",
    }


def test_input_bound_evidence_has_numbers(recorded):
    _, data = recorded
    finding = R.input_bound(data["slow_a10g"])
    assert finding.severity == "critical"  # 210 ms of 460 ms: 46% waiting
    assert finding.data["data_wait_share"] == pytest.approx(0.456, abs=0.02)
    assert "num_workers=2" in finding.evidence and "ms" in finding.evidence
    assert "1.8" in finding.expected_gain or "1.9" in finding.expected_gain
    assert R.input_bound(data["healthy_h100"]) is None


def test_host_bound(recorded):
    _, data = recorded
    finding = R.host_bound(data["slow_a10g"])
    assert "CPU" in finding.evidence and finding.data["gpu_util_pct"] < 50
    assert R.host_bound(data["healthy_h100"]) is None
    assert R.host_bound(data["troubled_ddp"]) is None


def test_single_thread_host_bound(recorded):
    _, data = recorded
    slow = data["slow_a10g"]
    samples = [
        dataclasses.replace(s, metrics={**s.metrics, "host/cpu_pct": 30.0}) for s in slow.samples
    ]
    finding = R.host_bound(dataclasses.replace(slow, samples=samples))
    assert "one Python thread" in finding.cause


def test_small_micro_batch_suggests_a_size(recorded):
    _, data = recorded
    finding = R.small_micro_batch(data["slow_a10g"])
    # 7.4 of 22 GiB used: a micro-batch about 0.85 / 0.336 x 32 fits
    assert finding.data["suggested_micro_batch"] == 80
    assert R.small_micro_batch(data["healthy_h100"]) is None


def test_precision_rules_use_catalog_peaks(recorded):
    _, data = recorded
    slow = data["slow_a10g"]
    fp32 = R.fp32_precision(slow)
    assert fp32.data["base"] == "fp32" and fp32.data["peak_ratio"] == pytest.approx(70 / 31.2)
    tf32 = R.tf32_off(slow)
    assert tf32.data["peak_ratio"] == pytest.approx(35 / 31.2)
    with_tf32 = dataclasses.replace(
        slow, run=dataclasses.replace(slow.run, config={**slow.run.config, "tf32": True})
    )
    assert R.tf32_off(with_tf32) is None
    assert R.fp32_precision(with_tf32).data["base"] == "tf32"
    assert R.fp32_precision(data["healthy_h100"]) is None
    unknown = dataclasses.replace(
        slow, run=dataclasses.replace(slow.run, config={"precision": "auto"})
    )
    assert R.fp32_precision(unknown) is None and R.tf32_off(unknown) is None


def test_low_mfu(recorded):
    _, data = recorded
    finding = R.low_mfu(data["slow_a10g"])
    assert finding.data["mfu"] == pytest.approx(0.06, abs=0.005)
    assert "6.7x" in finding.expected_gain or "6.6x" in finding.expected_gain
    assert R.low_mfu(data["healthy_h100"]) is None


def _run(**changes) -> Run:
    return Run(id="r1", name="r", **{"gpu_count": 1, **changes})


def test_memory_headroom_and_activation_checkpointing():
    samples = [
        Sample(
            float(t),
            {"gpu/0/util_pct": 95.0, "gpu/0/memory_used_gib": 20.0, "gpu/0/memory_total_gib": 80.0},
        )
        for t in range(10)
    ]
    data = RunData(_run(config={"activation_checkpointing": True}), [], samples, [])
    finding = R.memory_headroom(data)
    assert finding.severity == "info" and "checkpointing off" in finding.fix
    full = [
        dataclasses.replace(s, metrics={**s.metrics, "gpu/0/memory_used_gib": 70.0})
        for s in samples
    ]
    assert R.memory_headroom(dataclasses.replace(data, samples=full)) is None


def test_oom_adjustments(recorded):
    _, data = recorded
    finding = RS.oom_adjustments(data["troubled_ddp"])
    assert finding.data["changes"] == ["16->8"]
    assert "expandable_segments" in finding.fix and "checkpointing" in finding.fix
    assert RS.oom_adjustments(data["healthy_h100"]) is None


def test_throttling(recorded):
    _, data = recorded
    finding = RS.throttling(data["troubled_ddp"])
    assert finding.data["reasons"] == ["power cap", "software thermal"]
    assert finding.data["clock_ratio"] == pytest.approx(1155 / 1410)
    assert "hot" in finding.cause
    assert RS.throttling(data["healthy_h100"]) is None


def test_stall_reads_the_stack_dump(recorded):
    _, data = recorded
    finding = RS.stall(data["troubled_ddp"])
    assert finding.severity == "critical"
    assert "NCCL" in finding.cause and "after step 30" in finding.evidence
    assert "stack dump recorded" in finding.evidence
    assert RS.stall(data["healthy_h100"]) is None


def test_stall_from_gaps_alone():
    steps = [StepRecord("r1", i, float(i if i < 10 else i + 300), step_s=1.0) for i in range(20)]
    finding = RS.stall(RunData(_run(), steps, [], []))
    assert finding is not None and "after step 9" in finding.evidence
    assert "CUDA kernel hang" in finding.cause


def test_communication_bound(recorded):
    _, data = recorded
    finding = RS.communication_bound(data["troubled_ddp"])
    assert finding.data["comm_share"] == pytest.approx(0.62 / 1.30, abs=0.02)
    assert "NCCL_SOCKET_IFNAME" in finding.fix
    assert RS.communication_bound(data["healthy_h100"]) is None


def test_stragglers_by_rank_and_by_gpu(recorded):
    _, data = recorded
    finding = RS.stragglers(data["troubled_ddp"])
    assert finding.data["who"] == "rank 2"
    assert RS.stragglers(data["healthy_h100"]) is None
    samples = [Sample(float(t), {"gpu/0/util_pct": 95.0, "gpu/1/util_pct": 55.0}) for t in range(5)]
    by_gpu = RS.stragglers(RunData(_run(gpu_count=2), [], samples, []))
    assert by_gpu.data["who"] == "GPU 0"


def test_diagnose_run_stores_findings_and_energy(recorded, catalog):
    store, _ = recorded
    diagnosis = diagnose_run(store, "bert-large-ddp", catalog=catalog)
    stored = store.findings(diagnosis.run.id)
    assert {f.rule for f in stored} == {f.rule for f in diagnosis.findings}
    assert stored[0].severity == "critical"
    assert diagnosis.run.summary["energy"]["gpu_kwh"] == pytest.approx(diagnosis.energy.gpu_kwh)
    again = diagnose_run(store, "bert-large-ddp", catalog=catalog)  # replaces, not duplicates
    assert len(store.findings(again.run.id)) == len(stored)


# -- energy ------------------------------------------------------------------------------


def test_cumulative_series_with_restart_and_power_integration():
    assert cumulative_total([0.0, 10.0, 30.0, 5.0, 15.0]) == 45.0
    assert cumulative_total([None, None]) is None
    assert integrate_power_j([(0.0, 100.0), (10.0, 200.0), (500.0, 200.0)]) == 1500.0


def test_energy_account_of_a_recorded_run(recorded, catalog):
    _, data = recorded
    healthy = data["healthy_h100"]
    account = account_energy(healthy.run, healthy.samples, catalog)
    gpu_j = sum(
        healthy.samples[-1].metrics[f"gpu/{i}/energy_j"]
        - healthy.samples[0].metrics[f"gpu/{i}/energy_j"]
        for i in (0, 1)
    )
    assert account.gpu_kwh == pytest.approx(gpu_j / 3.6e6)
    assert account.cpu_estimated
    assert account.pue == lookup.pue_for(catalog, "aws")
    intensity = lookup.carbon_intensity(catalog, "aws", "us-east-1")
    assert account.gco2e_per_kwh == intensity
    assert account.kg_co2e == pytest.approx(account.facility_kwh * intensity / 1000)
    assert account.facility_kwh == pytest.approx((account.gpu_kwh + account.cpu_kwh) * 1.15)
    assert account.cost_usd == pytest.approx(12.29 * account.duration_s / 3600)


def test_energy_without_region_uses_the_world_average(catalog):
    run = Run(id="x", name="x", started_at=0.0, ended_at=3600.0)
    samples = [Sample(float(t), {"gpu/0/power_w": 300.0}) for t in range(0, 3601, 10)]
    account = account_energy(run, samples, catalog)
    assert account.gpu_kwh == pytest.approx(0.3)
    assert account.carbon_source.startswith("world")
    assert account.cost_usd is None and account.cpu_kwh is None
