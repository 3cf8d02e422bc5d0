"""How long `cloudtrain.profiling.profile_model` takes to trace one training step of
GPT-2 124M (T=1024) and ResNet-50 (224 x 224) in bf16, built on the CPU and on the meta
device — against the same-run baseline of one real training step (forward, backward)
of the same model at batch 2 on this CPU. Reports the first profile of the process
(lazy imports included), the best of `--repeat` more and a cache hit. Target: under
10 s per profile. Writes JSON.

    .venv/bin/python benchmarks/profile_speed.py [--repeat 3] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_result
from cloudtrain.profiling import profile_model
from zoo import MODELS, example_batch, loss_fn

TARGET_S = 10.0
CASES = {"GPT-2 124M": "gpt2", "ResNet-50": "resnet50"}


def _timed(fn) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def _real_step_s(zoo_model, batch) -> float:
    """One eager forward + backward on the CPU (fp32: what this CPU runs natively)."""
    torch.manual_seed(0)
    model = zoo_model.build()
    seconds, _ = _timed(lambda: loss_fn(zoo_model)(model, batch).backward())
    return seconds


def _case(zoo_model, repeat: int) -> dict[str, Any]:
    batch = example_batch(zoo_model, 2)
    loss = loss_fn(zoo_model)
    result: dict[str, Any] = {"real_cpu_step_s": round(_real_step_s(zoo_model, batch), 3)}
    for built_on in ("cpu", "meta"):
        with torch.device(built_on):
            model = zoo_model.build()

        def profile(cache: bool, model=model):
            return profile_model(model, batch, loss, precision="bf16", cache=cache)

        first, traced = _timed(lambda: profile(False))
        warm = min(_timed(lambda: profile(False))[0] for _ in range(repeat))
        profile(True)  # fills the cache
        hit_s, hit = _timed(lambda: profile(True))
        assert hit.extra["traced"] is False
        result[f"built on {built_on}"] = {
            "first_s": round(first, 3),
            "profile_s": round(warm, 3),
            "cache_hit_s": round(hit_s, 4),
            "profile_over_real_step": round(warm / result["real_cpu_step_s"], 2),
            "traced_on": traced.traced_on,
            "ops_per_step": sum(op.count for op in traced.ops),
            "step_gflops_per_sample": round(traced.flops_per_sample() / 1e9, 3),
            "under_target": max(first, warm) < TARGET_S,
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    os.environ["CLOUDTRAIN_HOME"] = tempfile.mkdtemp(prefix="profile_speed_")  # a cold cache
    cases = {label: _case(MODELS[name], args.repeat) for label, name in CASES.items()}
    payload = {
        "precision": "bf16",
        "cases": cases,
        "target": f"under {TARGET_S:g} s per profile (GPT-2 124M, ResNet-50)",
    }
    write_result("profile_speed", payload, args.out)


if __name__ == "__main__":
    main()
