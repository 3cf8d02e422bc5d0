"""Run-store write speed: BatchWriter vs. one commit per step record, in the same run.

Writes N fully populated StepRecords three ways into fresh stores in a temporary
directory and reports records per second and ratios:

- `batch_writer`: `BatchWriter.put()` per record from the calling thread, background
  commits, timed until `close()` returns (everything committed). `put_us` is what the
  training loop pays per record.
- `row_commits` (the baseline): `RunStore.add_steps([record])`, one transaction each.
- `one_transaction` (the ceiling): `RunStore.add_steps(all_records)`.

    python benchmarks/store_write.py [--records 100000] [--out results/store_write.json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_result
from cloudtrain.store import BatchWriter, RunStore, StepRecord


def _records(run_id: str, count: int) -> list[StepRecord]:
    start = time.time()
    return [
        StepRecord(
            run_id,
            step,
            start + step * 0.3,
            rank=0,
            step_s=0.3,
            data_wait_s=0.01,
            samples=256,
            tokens=262_144,
            loss=3.0 - step * 1e-5,
            lr=3e-4,
            grad_norm=1.0,
            micro_batch=32,
            mfu=0.42,
            flops=2.5e15,
            memory_allocated_gib=40.0,
            memory_reserved_gib=60.0,
            memory_peak_gib=70.0,
            metrics={"throughput/device/tokens_per_sec": 873_813.0},
        )
        for step in range(count)
    ]


def _batch_writer(path: Path, count: int) -> dict[str, Any]:
    with RunStore.open(path) as store:
        records = _records(store.create_run("bench-writer"), count)
        began = time.perf_counter()
        writer = BatchWriter(store, max_batch=500, flush_interval_s=1.0)
        for record in records:
            writer.put(record)
        put_s = time.perf_counter() - began
        writer.close()
        total_s = time.perf_counter() - began
        assert store.counts()["steps"] == count
    return {"seconds": total_s, "records_per_s": count / total_s, "put_us": put_s / count * 1e6}


def _row_commits(path: Path, count: int) -> dict[str, Any]:
    with RunStore.open(path) as store:
        records = _records(store.create_run("bench-rows"), count)
        began = time.perf_counter()
        for record in records:
            store.add_steps([record])
        total_s = time.perf_counter() - began
        assert store.counts()["steps"] == count
    return {"seconds": total_s, "records_per_s": count / total_s}


def _one_transaction(path: Path, count: int) -> dict[str, Any]:
    with RunStore.open(path) as store:
        records = _records(store.create_run("bench-one"), count)
        began = time.perf_counter()
        store.add_steps(records)
        total_s = time.perf_counter() - began
    return {"seconds": total_s, "records_per_s": count / total_s}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--out", default=None, help="JSON path (default results/store_write.json)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        results = {
            "batch_writer": _batch_writer(Path(tmp) / "writer.db", args.records),
            "row_commits": _row_commits(Path(tmp) / "rows.db", args.records),
            "one_transaction": _one_transaction(Path(tmp) / "one.db", args.records),
        }
    writer, rows = results["batch_writer"], results["row_commits"]
    write_result(
        "store_write",
        {
            "records": args.records,
            "store_settings": "WAL, synchronous=NORMAL, temporary directory",
            **results,
            "writer_vs_row_commits": writer["records_per_s"] / rows["records_per_s"],
            "writer_vs_one_transaction": (
                writer["records_per_s"] / results["one_transaction"]["records_per_s"]
            ),
        },
        args.out,
    )


if __name__ == "__main__":
    main()
