"""CPU cost of the monitor's sampler, as a share of one core.

Runs the sampler (GPU + host + the process tree, writing to a temporary run store) at its
1 s default for ~10 s and measures the process's CPU time over that wall time; then, in the
same run, a baseline of the same length where only an idle thread wakes every interval.
overhead = (sampler CPU - baseline CPU) / wall time, in % of one core. Target: < 1%.

    .venv/bin/python benchmarks/sampler_overhead.py [--duration-s 10] [--interval-s 1]
        [--recording tests/fixtures/nvml/h100_load.json]

Without a GPU (and without --recording) the GPU part is empty; with --recording the GPU
path runs over replayed NVML readings (no driver cost, so the real cost on a GPU host is
that plus the NVML calls: measure there too). `nvml_ms_per_tick` gives each NVML
reading's CPU and wall milliseconds per tick, so a cost on a GPU host can be placed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_result
from cloudtrain.monitor import Sampler, SamplerConfig, open_nvml
from cloudtrain.store import RunStore


def _measure(run, duration_s: float) -> tuple[float, float]:
    """(process CPU seconds, wall seconds) while `run(duration_s)` runs."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    run(duration_s)
    return time.process_time() - cpu0, time.perf_counter() - wall0


def idle_baseline(interval_s: float):
    def run(duration_s: float) -> None:
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(interval_s):
                pass

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        time.sleep(duration_s)
        stop.set()
        thread.join()

    return run


def sampler_run(interval_s: float, recording: str | None, store_path: Path, stats: dict):
    def run(duration_s: float) -> None:
        store = RunStore.open(store_path)
        run_id = store.create_run("overhead", kind="watch")
        sampler = Sampler(
            config=SamplerConfig(interval_s=interval_s),
            nvml=open_nvml(recording),
            store=store,
            run_id=run_id,
            pid=os.getpid(),
        )
        tick = sampler.tick
        tick_cpu: list[float] = []

        def timed_tick():
            start = time.thread_time()
            try:
                return tick()
            finally:
                tick_cpu.append(time.thread_time() - start)

        sampler.tick = timed_tick  # type: ignore[method-assign]
        with sampler:
            time.sleep(duration_s)
        stats["ticks"] = len(tick_cpu)
        stats["tick_cpu_ms_mean"] = 1000 * sum(tick_cpu) / max(1, len(tick_cpu))
        stats["tick_cpu_ms_max"] = 1000 * max(tick_cpu, default=0.0)
        stats["samples_stored"] = len(store.samples(run_id))
        stats["gpus"] = sampler.gpus.count
        store.close()

    return run


def nvml_call_costs(recording: str | None, ticks: int = 5) -> dict:
    """CPU and wall milliseconds per tick of each NVML reading, over `ticks` ticks
    (separate from the overhead run, so the timing wrapper does not count there)."""
    nvml = open_nvml(recording)
    costs: dict[str, dict[str, float]] = {}
    query = nvml.query

    def timed(index, name, *args):
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        try:
            return query(index, name, *args)
        finally:
            cost = costs.setdefault(name, {"cpu_ms": 0.0, "wall_ms": 0.0})
            cost["cpu_ms"] += 1000 * (time.thread_time() - cpu0) / ticks
            cost["wall_ms"] += 1000 * (time.perf_counter() - wall0) / ticks

    nvml.query = timed  # type: ignore[method-assign]
    sampler = Sampler(config=SamplerConfig(), nvml=nvml, pid=os.getpid())  # no store
    sampler.tick()  # the first tick reads the static facts once
    costs.clear()
    for _ in range(ticks):
        sampler.tick()
    return dict(sorted(costs.items(), key=lambda item: -item[1]["cpu_ms"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--interval-s", type=float, default=1.0)
    parser.add_argument("--recording", default=None, help="replay NVML readings from this file")
    parser.add_argument("--out", default=None, help="JSON output (default: results/)")
    args = parser.parse_args(argv)
    stats: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        run = sampler_run(args.interval_s, args.recording, Path(tmp) / "store.db", stats)
        sampler_cpu_s, sampler_wall_s = _measure(run, args.duration_s)
        stats["nvml_ms_per_tick"] = nvml_call_costs(args.recording)
    base_cpu_s, base_wall_s = _measure(idle_baseline(args.interval_s), args.duration_s)
    sampler_pct = 100 * sampler_cpu_s / sampler_wall_s
    base_pct = 100 * base_cpu_s / base_wall_s
    overhead_pct = sampler_pct - base_pct
    payload = {
        "interval_s": args.interval_s,
        "duration_s": args.duration_s,
        "recording": args.recording,
        "sampler_cpu_s": sampler_cpu_s,
        "sampler_wall_s": sampler_wall_s,
        "baseline_cpu_s": base_cpu_s,
        "baseline_wall_s": base_wall_s,
        "sampler_pct_of_one_core": sampler_pct,
        "baseline_pct_of_one_core": base_pct,
        "overhead_pct_of_one_core": overhead_pct,
        "target_pct_of_one_core": 1.0,
        "meets_target": overhead_pct < 1.0,
        **stats,
    }
    name = "sampler_overhead" + ("_recorded" if args.recording else "")
    write_result(name, payload, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
