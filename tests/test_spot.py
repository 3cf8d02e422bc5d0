"""Spot traces, deadline-aware policies and the simulator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudtrain.errors import DataError, UnknownNameError, UserError
from cloudtrain.launch.spot_policy import (
    ClusterType,
    GreedyPolicy,
    JobState,
    OnDemandPolicy,
    SpotOnlyPolicy,
    UniformProgressPolicy,
    make_policy,
)
from cloudtrain.launch.spot_sim import SpotJob, simulate
from cloudtrain.launch.spot_trace import SpotTrace, load_trace, save_trace, synthetic_trace

FIXTURES = Path(__file__).parent / "fixtures" / "launch"
STEP_H = 1.0 / 6.0


def _trace(pattern: str, price: float = 0.3, step_hours: float = STEP_H) -> SpotTrace:
    """'1' available, '0' not, one character per interval."""
    up = tuple(c == "1" for c in pattern)
    return SpotTrace(step_hours, up, tuple(price if u else None for u in up), f"test:{pattern}")


# ---------------------------------------------------------------- trace format


def test_trace_round_trips_through_csv(tmp_path: Path):
    trace = synthetic_trace(0.2, hours=12, seed=3)
    loaded = load_trace(save_trace(trace, tmp_path / "t.csv"))
    assert loaded.available == trace.available
    assert loaded.step_hours == pytest.approx(trace.step_hours)
    for a, b in zip(loaded.price_usd_per_hour, trace.price_usd_per_hour, strict=True):
        assert (a is None and b is None) or a == pytest.approx(b, rel=1e-5)


def test_example_trace_loads():
    trace = load_trace(FIXTURES / "spot_trace_example.csv")
    assert trace.step_hours == pytest.approx(STEP_H)
    assert trace.duration_hours == pytest.approx(48)


def test_trace_accepts_seconds_and_words(tmp_path: Path):
    path = tmp_path / "t.csv"
    path.write_text("timestamp,available,price\n0,yes,0.5\n600,false,\n1200,TRUE,0.6\n")
    trace = load_trace(path)
    assert trace.available == (True, False, True)
    assert trace.price_usd_per_hour == (0.5, None, 0.6)


@pytest.mark.parametrize(
    ("body", "line", "words"),
    [
        ("0,1,0.5\n600,1,0.5\n1500,1,0.5\n", 4, "evenly spaced"),
        ("0,1,0.5\n600,maybe,0.5\n", 3, "1/0"),
        ("0,1,0.5\n600,1,\n", 3, "price is empty"),
        ("0,1,-2\n600,1,0.5\n", 2, ">= 0"),
        ("yesterday,1,0.5\n600,1,0.5\n", 2, "ISO 8601"),
    ],
)
def test_bad_trace_rows_name_file_and_line(tmp_path: Path, body: str, line: int, words: str):
    path = tmp_path / "bad.csv"
    path.write_text("timestamp,available,price\n" + body)
    with pytest.raises(DataError) as info:
        load_trace(path)
    assert info.value.line == line
    assert words in str(info.value)
    assert str(path) in str(info.value)


def test_synthetic_trace_is_seeded_and_has_the_asked_rate():
    assert synthetic_trace(0.1, hours=50, seed=1) == synthetic_trace(0.1, hours=50, seed=1)
    assert synthetic_trace(0.1, hours=50, seed=1) != synthetic_trace(0.1, hours=50, seed=2)
    rate = 0.2
    trace = synthetic_trace(rate, hours=20_000, seed=0, mean_outage_hours=0.5)
    pairs = zip(trace.available, trace.available[1:], strict=False)
    losses = sum(1 for a, b in pairs if a and not b)
    spot_hours = sum(trace.available) * trace.step_hours
    assert losses / spot_hours == pytest.approx(rate, rel=0.1)


def test_synthetic_trace_rejects_impossible_rates():
    with pytest.raises(UserError):
        synthetic_trace(-1, hours=5)
    with pytest.raises(UserError):
        synthetic_trace(7, hours=5)  # more than one loss per 10-minute interval


# ---------------------------------------------------------------- simulator, by hand


def test_all_spot_trace_costs_spot_price_for_work_plus_one_restart():
    job = SpotJob(job_hours=2, deadline_hours=4, restart_minutes=6, on_demand_price_usd_per_hour=1)
    result = simulate(SpotOnlyPolicy(), _trace("1" * 30), job)
    assert result.finish_hours == pytest.approx(2.1)
    assert result.cost_usd == pytest.approx(2.1 * 0.3)
    assert result.savings_fraction == pytest.approx(0.7)
    assert (result.preemptions, result.launches) == (0, 1)


def test_on_demand_cost_is_the_baseline():
    job = SpotJob(job_hours=2, deadline_hours=4, restart_minutes=6, on_demand_price_usd_per_hour=3)
    result = simulate(OnDemandPolicy(), _trace("0" * 30), job)
    assert result.cost_usd == pytest.approx(job.on_demand_cost_usd) == pytest.approx(6.3)
    assert result.deadline_met and result.savings_fraction == pytest.approx(0)


def test_a_preemption_costs_a_restart():
    # 1 h of spot, 1 h outage, then spot again: spot-only waits out the outage.
    job = SpotJob(job_hours=2, deadline_hours=5, restart_minutes=6)
    result = simulate(SpotOnlyPolicy(), _trace("1" * 6 + "0" * 6 + "1" * 30), job)
    assert result.preemptions == 1 and result.launches == 2
    # 1 h (0.1 h overhead + 0.9 h work), 1 h waiting, 0.1 h overhead + 1.1 h work.
    assert result.finish_hours == pytest.approx(3.2)
    assert result.spot_hours == pytest.approx(2.2)


def test_spot_only_misses_a_deadline_that_greedy_meets():
    job = SpotJob(job_hours=2, deadline_hours=3, restart_minutes=6)
    trace = _trace("0" * 40)
    assert not simulate(SpotOnlyPolicy(), trace, job).finished
    greedy = simulate(GreedyPolicy(), trace, job)
    assert greedy.deadline_met
    # Greedy waits while the slack allows and then runs on demand to the end.
    assert greedy.on_demand_hours == pytest.approx(2.1)
    assert greedy.finish_hours == pytest.approx(3.0, abs=STEP_H)


def test_uniform_progress_goes_on_demand_when_behind_the_line():
    policy = UniformProgressPolicy()
    behind = JobState(4, 1, 10, 20, 0.1, ClusterType.NONE, 0, False, STEP_H)  # line at 2 h
    ahead = JobState(4, 3, 10, 20, 0.1, ClusterType.NONE, 0, False, STEP_H)
    assert policy.decide(behind) is ClusterType.ON_DEMAND
    assert policy.decide(ahead) is ClusterType.NONE
    # Hysteresis: on demand and only just ahead of the line -> keep on-demand.
    just_ahead = JobState(4, 2.05, 10, 20, 0.1, ClusterType.ON_DEMAND, 0, True, STEP_H)
    assert policy.decide(just_ahead) is ClusterType.ON_DEMAND
    well_ahead = JobState(4, 2.5, 10, 20, 0.1, ClusterType.ON_DEMAND, 0, True, STEP_H)
    assert policy.decide(well_ahead) is ClusterType.SPOT


def test_greedy_commits_to_on_demand_for_good():
    policy = GreedyPolicy()
    thin = JobState(8.85, 0, 1, 10, 0.1, ClusterType.NONE, 0, True, STEP_H)  # slack 0.15 h
    assert policy.decide(thin) is ClusterType.ON_DEMAND
    later = JobState(9.0, 0.1, 1, 10, 0.1, ClusterType.ON_DEMAND, 0, True, STEP_H)
    assert policy.decide(later) is ClusterType.ON_DEMAND


def test_unknown_policy_suggests_the_name():
    with pytest.raises(UnknownNameError, match="uniform-progress"):
        make_policy("uniform-progres")


def test_job_validation():
    with pytest.raises(UserError, match="job-hours"):
        SpotJob(job_hours=0, deadline_hours=1)


# ---------------------------------------------------------------- properties

_patterns = st.lists(st.booleans(), min_size=1, max_size=120).map(
    lambda bits: "".join("1" if b else "0" for b in bits)
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pattern=_patterns,
    job_hours=st.floats(0.2, 12.0),
    extra_slack_hours=st.floats(0.0, 12.0),
    restart_minutes=st.floats(0.0, 45.0),
    step_minutes=st.sampled_from([5.0, 10.0, 30.0, 60.0]),
    policy_name=st.sampled_from(["greedy", "uniform-progress"]),
)
def test_safe_policies_meet_every_deadline_on_demand_meets(
    pattern, job_hours, extra_slack_hours, restart_minutes, step_minutes, policy_name
):
    # Deadline such that on-demand alone (one restart) just meets it, plus extra slack.
    deadline = job_hours + restart_minutes / 60.0 + extra_slack_hours
    job = SpotJob(job_hours, deadline, restart_minutes)
    assert job.on_demand_feasible
    trace = _trace(pattern, step_hours=step_minutes / 60.0)
    result = simulate(make_policy(policy_name), trace, job)
    assert result.deadline_met, result
    assert result.spot_hours + result.on_demand_hours >= job_hours - 1e-9
    on_demand = simulate(OnDemandPolicy(), trace, job)
    assert on_demand.deadline_met
    assert on_demand.cost_usd == pytest.approx(job.on_demand_cost_usd)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), rate=st.floats(0.0, 1.0), slack=st.floats(0.0, 2.0))
def test_safe_policies_meet_deadlines_on_synthetic_traces(seed, rate, slack):
    job = SpotJob(job_hours=8, deadline_hours=8 + 0.1 + slack * 8, restart_minutes=6)
    trace = synthetic_trace(rate, hours=job.deadline_hours, seed=seed)
    for name in ("greedy", "uniform-progress"):
        assert simulate(make_policy(name), trace, job).deadline_met


def test_spot_saves_money_over_many_synthetic_traces():
    job = SpotJob(job_hours=10, deadline_hours=15, restart_minutes=6)
    savings = {"greedy": [], "uniform-progress": []}
    for seed in range(40):
        trace = synthetic_trace(0.1, hours=25, seed=seed)
        for name, found in savings.items():
            result = simulate(make_policy(name), trace, job)
            assert result.deadline_met
            found.append(result.savings_fraction)
    for found in savings.values():
        mean = sum(found) / len(found)
        assert 0.3 < mean < 0.7  # spot is 70% cheaper; outages and restarts eat some of it


# ---------------------------------------------------------------- CLI


def test_cli_simulates_a_trace_file_as_json(run_cli):
    done = run_cli(
        "spot", "simulate", "--trace", str(FIXTURES / "spot_trace_example.csv"),
        "--job-hours", "20", "--deadline", "30", "--on-demand-price", "4.1", "--json",
    )  # fmt: skip
    assert done.code == 0, done.stderr
    payload = json.loads(done.stdout)
    by_policy = {r["policy"]: r for r in payload["results"]}
    assert set(by_policy) == {"greedy", "uniform-progress", "on-demand", "spot-only"}
    assert by_policy["on-demand"]["cost_usd"] == pytest.approx((20 + 0.1) * 4.1)
    assert by_policy["greedy"]["deadline_met"] and by_policy["uniform-progress"]["deadline_met"]
    assert by_policy["greedy"]["cost_usd"] < by_policy["on-demand"]["cost_usd"]
    # This trace has long outages: spot alone is late, uniform progress beats greedy.
    assert not by_policy["spot-only"]["deadline_met"]
    assert by_policy["uniform-progress"]["cost_usd"] < by_policy["greedy"]["cost_usd"]


def test_cli_table_and_errors(run_cli):
    done = run_cli(
        "spot", "simulate", "--synthetic", "0.1", "--job-hours", "5", "--deadline", "8",
        "--policy", "greedy,on-demand",
    )  # fmt: skip
    assert done.code == 0, done.stderr
    assert "greedy" in done.stdout and "on-demand" in done.stdout and "spot-only" not in done.stdout
    both = run_cli("spot", "simulate", "--job-hours", "5", "--deadline", "8")
    assert both.code == 2 and "exactly one of --trace" in both.stderr
    bad = run_cli("spot", "simulate", "--synthetic", "0.1", "--job-hours", "5", "--deadline", "8",
                  "--policy", "gredy")  # fmt: skip
    assert bad.code == 2 and "did you mean greedy" in bad.stderr
