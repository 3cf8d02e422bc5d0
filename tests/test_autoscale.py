"""The autoscaling policy and the pool simulator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cloudtrain.errors import DataError, UserError
from cloudtrain.launch.autoscale import (
    AutoscaleConfig,
    AutoscalePolicy,
    FixedPool,
    JobSpec,
    PoolObservation,
    ThresholdPolicy,
    load_jobs,
    synthetic_jobs,
)
from cloudtrain.launch.autoscale_sim import simulate_pool

FIXTURES = Path(__file__).parent / "fixtures" / "launch"


def _obs(minute: float, pool: int, busy: int, queued_jobs: int = 0, queued_gpus: int = 0):
    return PoolObservation(minute / 60.0, pool, busy, queued_jobs, queued_gpus)


def test_load_counts_busy_and_queued_gpus():
    assert _obs(0, 8, 4, 1, 4).load == 1.0
    assert _obs(0, 0, 0, 1, 2).load == float("inf")
    assert _obs(0, 0, 0).load == 0.0


def test_growth_needs_a_queue_and_a_sustained_signal():
    policy = AutoscalePolicy(AutoscaleConfig(up_checks=2, cooldown_up_minutes=5))
    assert policy.decide(_obs(0, 8, 8)) == 0  # fully busy, nothing waits: no growth
    assert policy.decide(_obs(1, 8, 8, 1, 4)) == 0  # first check above the threshold
    assert policy.decide(_obs(2, 8, 8, 1, 4)) == 4  # second: add what the queue needs
    assert policy.decide(_obs(3, 12, 8, 1, 4)) == 0  # cooldown
    assert policy.decide(_obs(4, 12, 8, 1, 4)) == 0


def test_shrinking_waits_for_a_quiet_spell_and_keeps_busy_gpus():
    config = AutoscaleConfig(min_gpus=2, down_checks=3, cooldown_down_minutes=0)
    policy = AutoscalePolicy(config)
    assert policy.decide(_obs(0, 16, 2)) == 0
    assert policy.decide(_obs(1, 16, 2)) == 0
    change = policy.decide(_obs(2, 16, 2))
    assert change == -(16 - 4)  # keep ceil(2 / 0.6) = 4 GPUs
    assert AutoscalePolicy(config).decide(_obs(0, 1, 0)) == 1  # below min: grow to it


def test_threshold_rule_is_the_plain_rule():
    policy = ThresholdPolicy(AutoscaleConfig(max_gpus=10))
    assert policy.decide(_obs(0, 4, 4)) == 2
    assert policy.decide(_obs(1, 10, 10, 1, 1)) == 0  # at max
    assert policy.decide(_obs(2, 10, 1)) == -1


def test_config_validation():
    with pytest.raises(UserError):
        AutoscaleConfig(scale_up_load=0.3, scale_down_load=0.8)
    with pytest.raises(UserError):
        AutoscaleConfig(min_gpus=5, max_gpus=4)


def test_pool_simulation_by_hand():
    jobs = [JobSpec("a", 0.0, 2, 1.0), JobSpec("b", 0.0, 2, 1.0)]
    result = simulate_pool(FixedPool(), jobs, initial_gpus=2, max_gpus=2, check_minutes=6)
    assert result.mean_wait_hours == pytest.approx(0.5)  # b waits for a: 1 h / 2 jobs
    assert result.makespan_hours == pytest.approx(2.0)
    assert result.gpu_hours == pytest.approx(4.0, abs=0.25)
    assert result.utilization == pytest.approx(1.0, abs=0.07)


def test_autoscaler_beats_a_fixed_pool_on_cost_and_the_plain_rule_on_churn():
    jobs = load_jobs(FIXTURES / "jobs_example.csv")
    config = AutoscaleConfig(max_gpus=32)
    fixed = simulate_pool(FixedPool(), jobs, initial_gpus=32, max_gpus=32)
    plain = simulate_pool(ThresholdPolicy(config), jobs, initial_gpus=0, max_gpus=32)
    robust = simulate_pool(AutoscalePolicy(config), jobs, initial_gpus=0, max_gpus=32)
    assert robust.gpu_hours < 0.8 * fixed.gpu_hours
    assert robust.scaling_actions < 0.5 * plain.scaling_actions
    assert robust.peak_gpus <= 32
    assert robust.mean_wait_hours < fixed.mean_wait_hours + 0.25  # a few minutes of provisioning


def test_jobs_too_big_for_the_pool_are_refused():
    with pytest.raises(UserError, match="max-gpus"):
        simulate_pool(FixedPool(), [JobSpec("x", 0, 16, 1)], initial_gpus=8, max_gpus=8)


def test_job_trace_errors_name_the_line(tmp_path: Path):
    path = tmp_path / "jobs.csv"
    path.write_text("submit_hours,gpus,duration_hours\n0,1,1\n0.5,zero,1\n")
    with pytest.raises(DataError) as info:
        load_jobs(path)
    assert info.value.line == 3


def test_synthetic_jobs_are_seeded():
    assert synthetic_jobs(seed=4) == synthetic_jobs(seed=4)


def test_cli_compares_the_three(run_cli):
    done = run_cli("autoscale", "simulate", "--jobs", str(FIXTURES / "jobs_example.csv"), "--json")
    assert done.code == 0, done.stderr
    results = {r["policy"]: r for r in json.loads(done.stdout)["results"]}
    assert set(results) == {"fixed", "threshold", "autoscale"}
    assert results["autoscale"]["gpu_hours"] < results["fixed"]["gpu_hours"]
    table = run_cli("autoscale", "simulate", "--synthetic", "20", "--max-gpus", "16")
    assert table.code == 0 and "autoscale" in table.stdout
