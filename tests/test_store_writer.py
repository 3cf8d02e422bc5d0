"""BatchWriter and concurrency: nothing put is lost, across threads and processes."""

from __future__ import annotations

import multiprocessing
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import closing
from pathlib import Path

import pytest

from cloudtrain.store import BatchWriter, Event, Finding, RunStore, Sample, StepRecord, StoreError


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


def _count(path: Path, table: str, run_id: str | None = None) -> int:
    """Rows counted through a separate connection: what another process would see."""
    with RunStore.open(path) as store:
        if run_id is None:
            return store.counts()[table]
        return len(getattr(store, table)(run_id))


def _wait_until(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


def test_every_record_kind_goes_through_the_writer(db: Path):
    with RunStore.open(db) as store:
        run_id = store.create_run("w")
        with BatchWriter(store, flush_interval_s=60) as writer:
            writer.put(StepRecord(run_id, 0, 1.0, loss=2.0))
            writer.put(Sample(1.0, {"gpu/0/util_pct": 50.0}, run_id=run_id))
            writer.put(Event(run_id, "checkpoint", "saved"))
            writer.put_many([Finding(run_id, "r", "info", "s", "e", "c", "f")])
            assert writer.pending == 4
        assert writer.records_written == 4
        counts = store.counts()
    assert [counts[t] for t in ("steps", "samples", "events", "findings")] == [1, 1, 1, 1]


def test_records_put_before_close_are_all_persisted(db: Path):
    with RunStore.open(db) as store:
        run_id = store.create_run()
    # a long interval and a huge batch: only close() can have written these
    writer = BatchWriter(db, max_batch=1_000_000, flush_interval_s=600)
    for step in range(3000):
        writer.put(StepRecord(run_id, step, float(step)))
    writer.close()
    writer.close()  # idempotent
    assert _count(db, "steps", run_id) == 3000
    with pytest.raises(StoreError, match="after close"):
        writer.put(StepRecord(run_id, 0, 0.0))


def test_flush_commits_everything_put_so_far(db: Path):
    with RunStore.open(db) as store:
        run_id = store.create_run()
    with BatchWriter(db, max_batch=1_000_000, flush_interval_s=600) as writer:
        writer.put_many(StepRecord(run_id, s, float(s)) for s in range(250))
        writer.flush()
        assert writer.pending == 0
        assert _count(db, "steps", run_id) == 250


def test_a_full_batch_is_written_without_waiting_for_the_interval(db: Path):
    with RunStore.open(db) as store:
        run_id = store.create_run()
    with BatchWriter(db, max_batch=100, flush_interval_s=600) as writer:
        writer.put_many(StepRecord(run_id, s, float(s)) for s in range(100))
        assert _wait_until(lambda: writer.records_written == 100)


def test_the_interval_flushes_a_small_batch(db: Path):
    with RunStore.open(db) as store:
        run_id = store.create_run()
    with BatchWriter(db, max_batch=1000, flush_interval_s=0.05) as writer:
        writer.put(StepRecord(run_id, 0, 0.0))
        assert _wait_until(lambda: _count(db, "steps", run_id) == 1)


def test_writer_shared_by_threads_loses_nothing(db: Path):
    with RunStore.open(db) as store:
        run_id = store.create_run()
        with BatchWriter(store, max_batch=64, flush_interval_s=0.01) as writer:

            def produce(rank: int) -> None:
                for step in range(1000):
                    writer.put(StepRecord(run_id, step, time.time(), rank=rank))
                    if step % 100 == 0:
                        writer.put(Sample(time.time(), {"host/cpu_pct": 1.0}, run_id=run_id))

            threads = [threading.Thread(target=produce, args=(rank,)) for rank in range(4)]
            for thread in threads:
                thread.start()
            # the store stays usable from this thread while the writer works
            while any(t.is_alive() for t in threads):
                store.overviews()
            for thread in threads:
                thread.join()
        assert len(store.steps(run_id)) == 4000
        assert [len(store.steps(run_id, rank=r)) for r in range(4)] == [1000] * 4
        assert len(store.samples(run_id)) == 40


def test_a_failed_write_is_raised_in_the_callers_thread(db: Path):
    with RunStore.open(db) as store:
        run_id = store.create_run()
        writer = BatchWriter(store, flush_interval_s=0.01)
        writer.put(StepRecord("nosuchrun000", 0, 0.0))
        # whether the background thread met the error first or flush() does: it surfaces here
        with pytest.raises(StoreError, match="create the run first"):
            writer.flush()
        writer.put(StepRecord(run_id, 1, 1.0))  # reported once; the writer goes on
        writer.close()
        assert [r.step for r in store.steps(run_id)] == [1]
    with BatchWriter(db) as other, pytest.raises(TypeError):
        other.put("a string")  # type: ignore[arg-type]


def test_a_locked_database_is_retried_not_dropped(db: Path):
    with RunStore.open(db) as store:
        run_id = store.create_run()
    impatient = RunStore.open(db, busy_timeout_s=0.05)
    writer = BatchWriter(impatient, flush_interval_s=0.02)
    with closing(sqlite3.connect(db, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        writer.put_many(StepRecord(run_id, s, float(s)) for s in range(10))
        time.sleep(0.3)  # several rounds fail with "database is locked"
        assert writer.records_written == 0
        other.execute("COMMIT")
    writer.close()
    impatient.close()
    assert _count(db, "steps", run_id) == 10


_EXIT_SCRIPT = textwrap.dedent(
    """
    import sys
    from cloudtrain.store import BatchWriter, RunStore, StepRecord
    path, how = sys.argv[1], sys.argv[2]
    with RunStore.open(path) as store:
        run_id = store.create_run("exit-" + how)
    writer = BatchWriter(path, max_batch=10**9, flush_interval_s=600)
    for step in range(500):
        writer.put(StepRecord(run_id, step, float(step)))
    if how == "raise":
        raise RuntimeError("training crashed")
    sys.exit(3)
    """
)


@pytest.mark.parametrize("how", ["exit", "raise"])
def test_records_survive_an_exit_without_close(db: Path, how: str):
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_SCRIPT, str(db), how], capture_output=True, text=True
    )
    assert done.returncode != 0
    with RunStore.open(db) as store:
        run = store.get_run("exit-" + how)
        assert len(store.steps(run.id)) == 500


def _writer_process(path: str, shared_run: str, worker: int, start: object) -> None:
    """One of two processes hammering the same store; see the test below."""
    start.wait()  # type: ignore[attr-defined]
    with RunStore.open(path) as store:
        own_run = store.create_run(f"worker-{worker}")
        with BatchWriter(path, max_batch=100, flush_interval_s=0.01) as writer:
            for step in range(2000):
                writer.put(StepRecord(shared_run, step, time.time(), rank=worker))
                writer.put(StepRecord(own_run, step, time.time()))
                if step % 10 == 0:  # direct calls interleaved with the writer's batches
                    store.add_steps([StepRecord(shared_run, step, time.time(), rank=10 + worker)])
                    store.add_event(Event(shared_run, "note", f"worker {worker} at {step}"))
                    store.update_run(shared_run, summary={f"worker_{worker}_step": step})
                if step % 20 == 0:
                    writer.put(Sample(time.time(), {"gpu/0/util_pct": 90.0}, run_id=shared_run))
                    time.sleep(0.002)  # a training step: lets the other process in


def test_two_processes_writing_one_store_lose_nothing(db: Path):
    with RunStore.open(db) as store:
        shared = store.create_run("shared")
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(2, timeout=60)  # both begin writing once both are ready
    workers = [
        context.Process(target=_writer_process, args=(str(db), shared, w, start)) for w in (0, 1)
    ]
    for process in workers:
        process.start()
    for process in workers:
        process.join(timeout=120)
    assert [p.exitcode for p in workers] == [0, 0]
    with RunStore.open(db) as store:
        assert store.counts() == {
            "runs": 3,
            "attempts": 0,
            "steps": 2 * (2000 + 2000 + 200),
            "samples": 2 * 100,
            "events": 2 * 200,
            "findings": 0,
        }
        for worker in (0, 1):
            own = store.get_run(f"worker-{worker}")
            assert [r.step for r in store.steps(own.id)] == list(range(2000))
            assert len(store.steps(shared, rank=worker)) == 2000
        # the two really wrote at the same time: their time ranges overlap
        spans = [[r.time_unix_s for r in store.steps(shared, rank=w)] for w in (0, 1)]
        assert min(spans[0]) < max(spans[1]) and min(spans[1]) < max(spans[0])
        # read-modify-write of the summary is atomic: both writers' last values are there
        assert store.get_run(shared).summary == {"worker_0_step": 1990, "worker_1_step": 1990}


def _fresh_store_process(path: str, worker: int, start: object) -> None:
    start.wait()  # type: ignore[attr-defined]
    with RunStore.open(path) as store:
        run_id = store.create_run(f"fresh-{worker}")
        store.add_steps([StepRecord(run_id, s, float(s)) for s in range(100)])


def test_two_processes_creating_one_store_at_once(db: Path):
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(3, timeout=60)
    workers = [
        context.Process(target=_fresh_store_process, args=(str(db), w, start)) for w in range(3)
    ]
    for process in workers:
        process.start()
    for process in workers:
        process.join(timeout=120)
    assert [p.exitcode for p in workers] == [0, 0, 0]
    with RunStore.open(db) as store:
        assert store.counts()["runs"] == 3 and store.counts()["steps"] == 300
