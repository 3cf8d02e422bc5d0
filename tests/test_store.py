"""The run store: schema and migrations, round trips of every record, run lookup."""

from __future__ import annotations

import math
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import pytest

from cloudtrain import paths
from cloudtrain.errors import StoreVersionError, UserError
from cloudtrain.store import (
    SCHEMA_VERSION,
    Event,
    Finding,
    Run,
    RunStore,
    Sample,
    StepRecord,
    StoreError,
    UnknownRunError,
    new_run_id,
)
from cloudtrain.store.schema import MIGRATIONS, migrate

TABLES = {"runs", "attempts", "steps", "samples", "events", "findings"}


@pytest.fixture
def store(tmp_path: Path):
    with RunStore.open(tmp_path / "store.db") as opened:
        yield opened


def _raw(path: Path | str) -> closing[sqlite3.Connection]:
    """A plain connection (autocommit) that the `with` block closes."""
    return closing(sqlite3.connect(str(path), isolation_level=None))


def _tables(path: Path | str) -> set[str]:
    with _raw(path) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {row[0] for row in rows}


# -- schema and migrations -------------------------------------------------------------


def test_default_store_lives_under_cloudtrain_home(cloudtrain_home: Path):
    with RunStore.open() as store:
        store.create_run("x")
    assert paths.store_path() == cloudtrain_home / "store.db"
    assert (cloudtrain_home / "store.db").exists()


def test_fresh_store_has_schema_wal_and_version(tmp_path: Path):
    path = tmp_path / "deep" / "dir" / "store.db"
    RunStore.open(path).close()
    assert _tables(path) >= TABLES
    with _raw(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 1
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert {"steps_run_step", "samples_run_time", "events_run_kind"} <= indexes


def test_reopening_keeps_data_and_does_not_migrate_again(tmp_path: Path):
    path = tmp_path / "store.db"
    with RunStore.open(path) as store:
        run_id = store.create_run("keep")
    with RunStore.open(path) as store:
        assert store.get_run(run_id).name == "keep"


def test_version_0_database_is_migrated(tmp_path: Path):
    path = tmp_path / "old.db"
    with _raw(path) as conn:  # an empty SQLite file, as an older cloudtrain left it
        conn.execute("PRAGMA user_version = 0")
        conn.execute("VACUUM")
    assert path.exists()
    with RunStore.open(path) as store:
        assert store.list_runs() == []
    assert _tables(path) >= TABLES


def test_newer_store_is_refused_with_a_clear_message(tmp_path: Path):
    path = tmp_path / "new.db"
    RunStore.open(path).close()
    with _raw(path) as conn:
        conn.execute("PRAGMA user_version = 7")
    with pytest.raises(StoreVersionError) as caught:
        RunStore.open(path)
    message = str(caught.value)
    assert str(path) in message
    assert "schema version 7" in message
    assert f"up to {SCHEMA_VERSION}" in message
    assert "upgrade cloudtrain" in message


def _migration_2_add_tags(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE runs ADD COLUMN tags TEXT NOT NULL DEFAULT '[]'")


def test_a_second_migration_is_one_function(tmp_path: Path):
    path = tmp_path / "store.db"
    with RunStore.open(path) as store:
        run_id = store.create_run("before-v2")
    with _raw(path) as conn:
        assert migrate(conn, path, [*MIGRATIONS, _migration_2_add_tags]) == 2
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
        row = conn.execute("SELECT name, tags FROM runs WHERE id = ?", (run_id,)).fetchone()
        assert row == ("before-v2", "[]")
        # a second pass is a no-op
        assert migrate(conn, path, [*MIGRATIONS, _migration_2_add_tags]) == 2
    # this cloudtrain only knows version 1: the upgraded store is refused
    with pytest.raises(StoreVersionError, match="schema version 2"):
        RunStore.open(path)


def test_a_failing_migration_leaves_the_store_at_the_old_version(tmp_path: Path):
    path = tmp_path / "store.db"
    RunStore.open(path).close()

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE half_done (x)")
        raise RuntimeError("migration bug")

    with _raw(path) as conn, pytest.raises(RuntimeError):
        migrate(conn, path, [*MIGRATIONS, broken])
    assert "half_done" not in _tables(path)
    with _raw(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1


def test_foreign_sqlite_database_is_refused(tmp_path: Path):
    path = tmp_path / "other.db"
    with _raw(path) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER)")
    with pytest.raises(StoreError, match="not a cloudtrain store"):
        RunStore.open(path)


def test_garbage_file_is_refused(tmp_path: Path):
    path = tmp_path / "store.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match=str(path)):
        RunStore.open(path)


def test_closed_store_says_so(tmp_path: Path):
    store = RunStore.open(tmp_path / "s.db")
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.list_runs()


# -- runs ----------------------------------------------------------------------------


def test_run_round_trip_of_every_column(store: RunStore):
    run_id = store.create_run(
        "gpt-small",
        kind="train",
        config={"lr": 3e-4, "layers": 12, "nested": {"a": [1, 2]}},
        host={"hostname": "node-1", "cpus": 16},
        gpu_name="H100-SXM",
        gpu_count=8,
        provider="aws",
        region="us-east-1",
        instance_type="p5.48xlarge",
        price_usd_per_hour=98.32,
        pricing="spot",
        command=["torchrun", "train.py", "--lr", "3e-4"],
    )
    run = store.get_run(run_id)
    assert isinstance(run, Run)
    assert (run.id, run.name, run.kind, run.status) == (run_id, "gpt-small", "train", "running")
    assert run.config == {"lr": 3e-4, "layers": 12, "nested": {"a": [1, 2]}}
    assert run.host == {"hostname": "node-1", "cpus": 16}
    assert (run.gpu_name, run.gpu_count, run.provider, run.region) == (
        "H100-SXM", 8, "aws", "us-east-1",
    )  # fmt: skip
    assert (run.instance_type, run.price_usd_per_hour, run.pricing) == (
        "p5.48xlarge",
        98.32,
        "spot",
    )
    assert run.command == ["torchrun", "train.py", "--lr", "3e-4"]
    assert run.summary == {}
    assert run.started_at == run.created_at and run.ended_at is None


def test_run_ids_are_short_unique_and_sortable():
    made = [new_run_id() for _ in range(5000)]  # many within one millisecond
    assert made == sorted(made)
    ids = set(made)
    assert len(ids) == 5000
    assert all(len(i) == 12 and i.isalnum() and i.islower() for i in ids)
    # the first 8 characters are the creation time in milliseconds, base 36
    assert int(new_run_id()[:8], 36) / 1000 == pytest.approx(time.time(), abs=5)


def test_default_names_are_readable_and_unique(store: RunStore):
    names = [store.get_run(store.create_run(kind="watch")).name for _ in range(30)]
    assert len(set(names)) == 30
    assert all(name.startswith("watch-") and name.count("-") >= 2 for name in names)


def test_update_run_merges_summary_and_sets_end_time(store: RunStore):
    run_id = store.create_run("r", price_usd_per_hour=3.6)
    store.update_run(run_id, summary={"tokens_per_s": 1000.0})
    run = store.update_run(run_id, status="completed", summary={"mfu": 0.4}, gpu_name="A100-80GB")
    assert run.summary == {"tokens_per_s": 1000.0, "mfu": 0.4}
    assert run.ended_at is not None and run.ended_at >= run.started_at
    assert store.get_run(run_id) == run
    duration_s = run.duration_s()
    assert duration_s is not None and duration_s >= 0
    assert run.cost_usd() == pytest.approx(3.6 * duration_s / 3600)
    store.update_run(run_id, ended_at=run.started_at + 3600)
    assert store.get_run(run_id).cost_usd() == pytest.approx(3.6)


def test_created_run_has_no_start_until_running(store: RunStore):
    run_id = store.create_run("queued", status="created")
    run = store.get_run(run_id)
    assert run.started_at is None and run.duration_s() is None and run.cost_usd() is None
    assert store.update_run(run_id, status="running").started_at is not None


def test_bad_status_column_and_kind_are_refused(store: RunStore):
    with pytest.raises(ValueError, match="valid"):
        store.create_run(status="finished")
    run_id = store.create_run()
    with pytest.raises(ValueError, match="valid"):
        store.update_run(run_id, status="done")
    with pytest.raises(ValueError, match="unknown run column"):
        store.update_run(run_id, colour="red")
    with pytest.raises(ValueError, match="event kind"):
        Event(run_id, "explosion", "boom")
    with pytest.raises(ValueError, match="severity"):
        Finding(run_id, "r", "fatal", "s", "e", "c", "f")
    with pytest.raises(UnknownRunError):
        store.update_run("nosuchrun", status="failed")


def test_list_runs_newest_first_with_filter_and_limit(store: RunStore):
    ids = []
    for i in range(4):
        ids.append(store.create_run(f"r{i}"))
        time.sleep(0.002)
    store.update_run(ids[1], status="failed")
    assert [r.id for r in store.list_runs()] == ids[::-1]
    assert [r.id for r in store.list_runs(limit=2)] == ids[:1:-1]
    assert [r.id for r in store.list_runs(status="failed")] == [ids[1]]


def test_get_run_by_id_prefix_name_and_latest(store: RunStore):
    first = store.create_run("twin")
    time.sleep(0.002)
    second = store.create_run("twin")
    other = store.create_run("other")
    assert store.get_run(first).id == first
    assert store.get_run("twin").id == second  # a shared name means the newest
    assert store.get_run("latest").id == other
    # the shortest prefix that tells `first` apart from the rest
    for length in range(1, 13):
        prefix = first[:length]
        if sum(r.id.startswith(prefix) for r in store.list_runs()) == 1:
            break
    assert store.get_run(prefix).id == first


def test_get_run_errors_name_the_problem(store: RunStore):
    with pytest.raises(UserError, match="no runs yet"):
        store.get_run("anything")
    for name in ("alpha-run", "beta-run"):
        store.create_run(name)
    with pytest.raises(UnknownRunError, match="did you mean alpha-run"):
        store.get_run("alpah-run")
    common = store.list_runs()[0].id[:3]  # created in the same second: same time prefix
    with pytest.raises(UnknownRunError, match="matches several runs"):
        store.get_run(common)
    with pytest.raises(UnknownRunError, match="no run given"):
        store.get_run("")


def test_delete_run_removes_its_records(store: RunStore):
    run_id = store.create_run("gone")
    keep = store.create_run("kept")
    for rid in (run_id, keep):
        store.add_steps([StepRecord(rid, 0, 1.0)])
        store.add_event(Event(rid, "note", "hi"))
    store.add_attempt(run_id)
    store.delete_run(run_id)
    counts = store.counts()
    assert (counts["runs"], counts["steps"], counts["events"], counts["attempts"]) == (1, 1, 1, 0)


# -- telemetry records -----------------------------------------------------------------


def test_step_records_round_trip_with_every_field(store: RunStore):
    run_id = store.create_run()
    full = StepRecord(
        run_id, step=7, time_unix_s=1000.5, rank=1, step_s=0.25, data_wait_s=0.01,
        samples=256, tokens=262_144, loss=2.5, lr=3e-4, grad_norm=0.9, micro_batch=32,
        mfu=0.41, flops=1.2e15, memory_allocated_gib=40.5, memory_reserved_gib=60.0,
        memory_peak_gib=70.25, metrics={"throughput/device/tokens_per_sec": 1.0e6},
    )  # fmt: skip
    sparse = StepRecord(run_id, step=8, time_unix_s=1001.0)
    store.add_steps([sparse, full])
    assert store.steps(run_id) == [full, sparse]
    assert store.steps(run_id, rank=1) == [full]
    assert store.steps(run_id, since_step=7) == [sparse]
    assert store.last_step(run_id) == sparse


def test_nan_and_inf_survive_the_round_trip(store: RunStore):
    run_id = store.create_run()
    store.add_steps(
        [
            StepRecord(run_id, 0, 1.0, loss=math.nan, grad_norm=math.inf, metrics={"m": math.nan}),
            StepRecord(run_id, 1, 2.0, loss=1.0),
        ]
    )
    bad, good = store.steps(run_id)
    assert math.isnan(bad.loss) and bad.grad_norm == math.inf and math.isnan(bad.metrics["m"])
    assert good.loss == 1.0 and good.grad_norm is None


def test_replayed_steps_are_kept_in_step_order(store: RunStore):
    run_id = store.create_run()
    store.add_steps([StepRecord(run_id, s, 10.0 + s, loss=1.0) for s in range(3)])
    store.add_steps([StepRecord(run_id, s, 20.0 + s, loss=2.0) for s in range(1, 4)])  # resumed
    assert [(r.step, r.loss) for r in store.steps(run_id)] == [
        (0, 1.0), (1, 1.0), (1, 2.0), (2, 1.0), (2, 2.0), (3, 2.0),
    ]  # fmt: skip
    assert store.last_step(run_id).step == 3


def test_samples_round_trip_with_missing_readings(store: RunStore):
    run_id = store.create_run()
    with_run = [
        Sample(
            time_unix_s=100.0 + i,
            metrics={"gpu/0/util_pct": 97.0, "gpu/0/power_w": 650.5, "gpu/0/ecc_errors": None},
            run_id=run_id,
            host="node-1",
        )
        for i in range(3)
    ]
    free = Sample(time_unix_s=50.0, metrics={"host/cpu_pct": 12.5})
    store.add_samples([with_run[2], free, with_run[0], with_run[1]])
    assert store.samples(run_id) == with_run
    assert store.samples(None) == [free]
    assert store.samples(run_id, since_unix_s=101.0, until_unix_s=101.5) == [with_run[1]]


def test_events_round_trip_and_filter(store: RunStore):
    run_id = store.create_run()
    checkpoint = Event(run_id, "checkpoint", "saved step 100", 10.0, {"step": 100, "path": "c"})
    oom = Event(run_id, "oom_adjustment", "micro-batch 32 -> 16", 11.0, {"old": 32, "new": 16})
    store.add_event(checkpoint)
    store.add_events([oom, Event(run_id, "checkpoint", "saved step 200", 12.0)])
    assert store.events(run_id)[:2] == [checkpoint, oom]
    assert [e.message for e in store.events(run_id, kind="checkpoint")] == [
        "saved step 100", "saved step 200",
    ]  # fmt: skip
    assert store.event_counts(run_id) == {"checkpoint": 2, "oom_adjustment": 1}
    assert Event(run_id, "note", "now").time_unix_s == pytest.approx(time.time(), abs=5)


def test_findings_round_trip_most_severe_first_and_replace(store: RunStore):
    run_id = store.create_run()
    info = Finding(run_id, "tf32_off", "info", "TF32 off", "fp32 matmuls", "flag", "enable",
                   "~1.1x", {"share": 0.2})  # fmt: skip
    critical = Finding(run_id, "input_bound", "critical", "GPU waits for data",
                       "data wait 45% of step time", "2 workers", "num_workers=8", "~1.8x",
                       {"data_wait_share": 0.45})  # fmt: skip
    store.add_findings([info, critical])
    assert store.findings(run_id) == [critical, info]
    store.replace_findings(run_id, [info])
    assert store.findings(run_id) == [info]
    store.replace_findings(run_id, [])  # a clean diagnosis clears the stale findings
    assert store.findings(run_id) == []
    with pytest.raises(ValueError, match="findings of run"):
        store.replace_findings(store.create_run(), [info])


def test_attempts_number_themselves_and_sum_spend(store: RunStore):
    run_id = store.create_run("supervised", price_usd_per_hour=10.0)
    first = store.add_attempt(run_id, started_at=100.0)
    assert first.attempt == 1 and first.ended_at is None
    store.update_attempt(
        run_id, 1, ended_at=200.0, exit_code=143, reason="preempted", spend_usd=0.5
    )
    second = store.add_attempt(run_id, started_at=300.0)
    assert second.attempt == 2
    store.update_attempt(run_id, 2, ended_at=400.0, exit_code=0, reason="completed", spend_usd=0.25)
    attempts = store.attempts(run_id)
    assert [(a.attempt, a.exit_code, a.reason) for a in attempts] == [
        (1, 143, "preempted"), (2, 0, "completed"),
    ]  # fmt: skip
    assert attempts[0].duration_s() == 100.0
    assert store.overview(run_id).cost_usd == pytest.approx(0.75)
    with pytest.raises(StoreError, match="already has attempt 2"):
        store.add_attempt(run_id, attempt=2)
    with pytest.raises(StoreError, match="no attempt 9"):
        store.update_attempt(run_id, 9, exit_code=1)


def test_records_for_an_unknown_run_are_refused_with_the_fix(store: RunStore):
    with pytest.raises(StoreError, match="create the run first"):
        store.add_steps([StepRecord("nosuchrun000", 0, 1.0)])
    with pytest.raises(TypeError):
        store.add_records(["not a record"])  # type: ignore[list-item]


def test_overview_counts_and_last_step(store: RunStore):
    run_id = store.create_run("o", gpu_name="L4", gpu_count=1)
    store.add_steps([StepRecord(run_id, s, float(s), rank=r) for s in range(5) for r in (0, 1)])
    store.add_events([Event(run_id, "checkpoint", "c"), Event(run_id, "alert", "a")])
    store.add_findings([Finding(run_id, "x", "warn", "s", "e", "c", "f")])
    overview = store.overview("o")
    assert overview.step_records == 10
    assert overview.last_step is not None and overview.last_step.step == 4
    assert overview.event_counts == {"alert": 1, "checkpoint": 1}
    assert overview.finding_counts == {"warn": 1}
    assert overview.attempts == [] and overview.cost_usd is None
    assert [o.run.id for o in store.overviews()] == [run_id]


def test_store_works_in_memory():
    with RunStore.open(":memory:") as store:
        run_id = store.create_run("mem")
        store.add_steps([StepRecord(run_id, 0, 1.0)])
        assert len(store.steps(run_id)) == 1
