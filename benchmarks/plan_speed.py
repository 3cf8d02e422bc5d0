"""How long `plan()` takes over the bundled catalog, against loading that catalog in the
same run (the baseline every `cloudtrain plan` pays anyway). Writes JSON.

    .venv/bin/python benchmarks/plan_speed.py [--repeat 5] [--out PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_result
from cloudtrain.catalog import load_catalog
from cloudtrain.plan import Constraints, plan, preset


def _best_of(repeat: int, fn) -> tuple[float, object]:
    times, value = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - start)
    return min(times), value


def _traced_gpt2():
    """GPT-2 124M traced once (not timed: profiling has its own benchmark)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from cloudtrain.plan import traced_workload
    from cloudtrain.profiling import profile_model
    from plan_models import gpt2

    model, batch, loss_fn = gpt2()
    profile = profile_model(model, batch, loss_fn, precision="bf16")
    return traced_workload(profile, global_batch=512, tokens=10e9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    start = time.perf_counter()
    load_catalog(include_user=False)
    cold_load_s = time.perf_counter() - start
    load_s, catalog = _best_of(args.repeat, lambda: load_catalog(include_user=False))
    cases = {
        "llama-7b 20e9 tokens, 1..8 nodes": (
            preset("llama-7b").replace(tokens=20e9),
            Constraints(),
        ),
        "llama-7b, 1..32 nodes": (
            preset("llama-7b").replace(tokens=20e9),
            Constraints(max_nodes=32),
        ),
        "gpt2-124m, 1..8 nodes": (preset("gpt2-124m"), Constraints()),
        "traced GPT-2 124M (examples/plan_models.py:gpt2), 1..8 nodes": (
            _traced_gpt2(),
            Constraints(),
        ),
    }
    results = {}
    for name, (workload, constraints) in cases.items():
        seconds, result = _best_of(
            args.repeat, lambda w=workload, c=constraints: plan(w, c, catalog)
        )
        results[name] = {
            "plan_s": round(seconds, 4),
            "candidates": result.candidates,
            "estimates": len(result.estimates),
            "candidates_per_s": round(result.candidates / seconds),
            "ratio_to_catalog_load": round(seconds / load_s, 2),
        }
    payload = {
        "offers": len(catalog.offers),
        "catalog_load_s": round(load_s, 4),
        "catalog_first_load_s": round(cold_load_s, 4),
        "cases": results,
        "statistics": {"median_plan_s": statistics.median(r["plan_s"] for r in results.values())},
        "target": "plan() well under 1 s over the bundled catalog, a traced model too",
    }
    write_result("plan_speed", payload, args.out)


if __name__ == "__main__":
    main()
