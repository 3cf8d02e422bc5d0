"""Savings of the spot policies vs on-demand over many synthetic spot traces.

For each interruption rate, draws `--traces` seeded traces and runs every policy on
the same job; the baseline is on-demand alone on the same trace in the same run.
Reports, per policy and rate: the savings distribution (mean, p10, p50, p90, min),
the share of deadlines met, and mean preemptions.

    python benchmarks/spot_savings.py --traces 200
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_result
from cloudtrain.launch import POLICIES, SpotJob, make_policy, simulate, synthetic_trace


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _summary(results: list) -> dict:
    finished = [r.savings_fraction for r in results if r.savings_fraction is not None]
    return {
        "deadline_met_share": sum(r.deadline_met for r in results) / len(results),
        "finished_share": len(finished) / len(results),
        "savings_mean": statistics.fmean(finished) if finished else None,
        "savings_p10": _quantile(finished, 0.1) if finished else None,
        "savings_p50": _quantile(finished, 0.5) if finished else None,
        "savings_p90": _quantile(finished, 0.9) if finished else None,
        "savings_min": min(finished) if finished else None,
        "preemptions_mean": statistics.fmean(r.preemptions for r in results),
        "on_demand_hours_mean": statistics.fmean(r.on_demand_hours for r in results),
    }


def run(traces: int, rates: list[float], job: SpotJob, outage_hours: float) -> dict:
    by_rate = {}
    for rate in rates:
        results: dict[str, list] = {name: [] for name in POLICIES}
        for seed in range(traces):
            trace = synthetic_trace(
                rate, hours=job.deadline_hours + job.job_hours, seed=seed,
                mean_outage_hours=outage_hours,
                on_demand_price_usd_per_hour=job.on_demand_price_usd_per_hour,
            )  # fmt: skip
            for name in POLICIES:
                results[name].append(simulate(make_policy(name), trace, job))
        by_rate[f"{rate:g}"] = {name: _summary(found) for name, found in results.items()}
    return by_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=200)
    parser.add_argument("--rates", default="0.02,0.05,0.1,0.2,0.5", help="preemptions per hour")
    parser.add_argument("--job-hours", type=float, default=24.0)
    parser.add_argument("--deadline-hours", type=float, default=36.0)
    parser.add_argument("--restart-minutes", type=float, default=6.0)
    parser.add_argument("--outage-hours", type=float, default=1.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    job = SpotJob(args.job_hours, args.deadline_hours, args.restart_minutes, 1.0)
    rates = [float(r) for r in args.rates.split(",")]
    started = time.perf_counter()
    by_rate = run(args.traces, rates, job, args.outage_hours)
    payload = {
        "what": "spot policy savings vs on-demand alone (same job, same traces)",
        "baseline": "on-demand policy on the same trace: cost (job_hours + restart) x price",
        "job": {
            "job_hours": job.job_hours,
            "deadline_hours": job.deadline_hours,
            "restart_minutes": job.restart_minutes,
        },
        "traces_per_rate": args.traces,
        "synthetic": {"spot_discount": 0.7, "price_jitter": 0.1, "outage_hours": args.outage_hours},
        "by_rate": by_rate,
        "wall_s": time.perf_counter() - started,
    }
    write_result("spot_savings", payload, args.out)


if __name__ == "__main__":
    main()
