"""RunStore: the SQLite run store (WAL, short IMMEDIATE transactions, versioned schema).

One `RunStore` wraps one connection and may be shared between threads (every call holds
the store's lock). Several processes may open the same file at once: WAL lets readers
run beside the one writer, and writers wait for each other up to `busy_timeout_s`.
Durability: a call that returned has committed. With `synchronous=NORMAL` a committed
transaction survives a crash of the process; an OS crash or power loss may undo the
last few, never corrupt the file.
"""

from __future__ import annotations

import difflib
import random
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cloudtrain import paths
from cloudtrain.errors import UserError
from cloudtrain.store import codec
from cloudtrain.store.ids import default_run_name, new_run_id
from cloudtrain.store.records import (
    FINISHED_STATUSES,
    RUN_STATUSES,
    Attempt,
    Event,
    Finding,
    Record,
    Run,
    RunOverview,
    Sample,
    StepRecord,
)
from cloudtrain.store.schema import StoreError, migrate

MEMORY = ":memory:"
LATEST = "latest"
_UPDATABLE = frozenset(codec.RUN_COLUMNS) - {"id", "created_at"}
_ATTEMPT_UPDATABLE = ("ended_at", "exit_code", "reason", "spend_usd")


class UnknownRunError(UserError):
    """No run matches the id, id prefix or name the user gave."""


def _check_status(status: str) -> None:
    if status not in RUN_STATUSES:
        raise ValueError(f"unknown run status '{status}'; valid: {', '.join(RUN_STATUSES)}")


def _enable_wal(conn: sqlite3.Connection, deadline: float) -> None:
    """Switch the file to WAL (a lasting property of the file). SQLite answers "locked"
    at once, without waiting, while another process creates or converts the same file,
    so retry until the deadline."""
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.005 + random.random() * 0.02)


def _connect(path: str, busy_timeout_s: float) -> sqlite3.Connection:
    conn = sqlite3.connect(
        path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
    )
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        if path != MEMORY:
            _enable_wal(conn, time.monotonic() + busy_timeout_s)
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        migrate(conn, path)
    except BaseException:
        conn.close()
        raise
    return conn


class RunStore:
    """The run store; open with `RunStore.open(path)` (default `paths.store_path()`)."""

    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self._conn_or_none: sqlite3.Connection | None = conn
        self._lock = threading.RLock()
        self.path = path
        """The database file (or ":memory:")."""

    @classmethod
    def open(cls, path: str | Path | None = None, *, busy_timeout_s: float = 30.0) -> RunStore:
        """Open (creating the file, its directory and schema if needed) and migrate.

        Raises StoreVersionError for a store written by a newer cloudtrain, StoreError
        for a file that is not a cloudtrain store or cannot be opened.
        """
        where = str(paths.store_path() if path is None else path)
        if where != MEMORY:
            where = str(Path(where).expanduser())
            try:
                Path(where).parent.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise StoreError(
                    f"cannot create the store directory for {where}: {error}"
                ) from None
        try:
            return cls(_connect(where, busy_timeout_s), where)
        except sqlite3.DatabaseError as error:
            raise StoreError(
                f"cannot open the run store {where}: {error}; move the file away or set "
                f"{paths.HOME_ENV} to another directory"
            ) from None

    def close(self) -> None:
        """Close the connection; later calls raise StoreError. Closing twice is fine."""
        with self._lock:
            if self._conn_or_none is not None:
                self._conn_or_none.close()
                self._conn_or_none = None

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RunStore({self.path!r})"

    # -- plumbing -----------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        if self._conn_or_none is None:
            raise StoreError(f"the run store {self.path} is closed")
        return self._conn_or_none

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One short write transaction, taking the write lock up front (no upgrade deadlock)."""
        with self._lock:
            conn = self._conn()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._conn().execute(sql, params).fetchall()

    # -- runs -----------------------------------------------------------------------

    def create_run(
        self,
        name: str | None = None,
        *,
        kind: str = "train",
        config: dict[str, Any] | None = None,
        host: dict[str, Any] | None = None,
        gpu_name: str | None = None,
        gpu_count: int = 0,
        provider: str | None = None,
        region: str | None = None,
        instance_type: str | None = None,
        price_usd_per_hour: float | None = None,
        pricing: str | None = None,
        command: list[str] | None = None,
        status: str = "running",
    ) -> str:
        """Record a new run and return its id. `name` None picks a readable unique name;
        `started_at` is now unless the status is "created"."""
        _check_status(status)
        now = time.time()
        run = Run(
            id="",
            name=name or "",
            kind=kind,
            status=status,
            created_at=now,
            started_at=None if status == "created" else now,
            ended_at=now if status in FINISHED_STATUSES else None,
            config=dict(config or {}),
            host=dict(host or {}),
            gpu_name=gpu_name,
            gpu_count=gpu_count,
            provider=provider,
            region=region,
            instance_type=instance_type,
            price_usd_per_hour=price_usd_per_hour,
            pricing=pricing,
            command=list(command or []),
        )
        with self._transaction() as conn:
            if not run.name:
                run.name = self._unused_name(conn, kind)
            return self._insert_run(conn, run)

    @staticmethod
    def _unused_name(conn: sqlite3.Connection, kind: str) -> str:
        name = default_run_name(kind)
        for _ in range(8):
            if conn.execute("SELECT 1 FROM runs WHERE name = ?", (name,)).fetchone() is None:
                return name
            name = default_run_name(kind)
        return f"{name}-{new_run_id()[-4:]}"

    @staticmethod
    def _insert_run(conn: sqlite3.Connection, run: Run) -> str:
        sql = codec.insert_sql("runs", codec.RUN_COLUMNS)
        for _ in range(5):
            run.id = new_run_id(run.created_at)
            values = [codec.run_value(c, getattr(run, c)) for c in codec.RUN_COLUMNS]
            try:
                conn.execute(sql, values)
                return run.id
            except sqlite3.IntegrityError:  # the same id drawn twice in one millisecond
                continue
        raise StoreError("could not draw an unused run id after 5 tries")

    def update_run(
        self,
        run_id: str,
        *,
        status: str | None = None,
        ended_at: float | None = None,
        summary: dict[str, Any] | None = None,
        **columns: Any,
    ) -> Run:
        """Change a run and return it as stored.

        `summary` keys are merged into the stored summary (several writers may each add
        theirs). Setting a finished status also sets `ended_at` to now unless given or
        already set; setting "running" sets `started_at` if it was unset. Other keyword
        arguments name run columns (gpu_name, price_usd_per_hour, config, ...).
        """
        unknown = set(columns) - _UPDATABLE
        if unknown:
            raise ValueError(f"update_run: unknown run column(s) {sorted(unknown)}")
        if status is not None:
            _check_status(status)
        with self._transaction() as conn:
            run = self._run_by_id(conn, run_id)
            changes = self._run_changes(run, status, ended_at, summary, columns)
            if changes:
                assignments = ", ".join(f"{column} = ?" for column in changes)
                values = [codec.run_value(c, v) for c, v in changes.items()]
                conn.execute(f"UPDATE runs SET {assignments} WHERE id = ?", [*values, run_id])
                for column, value in changes.items():
                    setattr(run, column, value)
            return run

    @staticmethod
    def _run_changes(
        run: Run,
        status: str | None,
        ended_at: float | None,
        summary: dict[str, Any] | None,
        columns: dict[str, Any],
    ) -> dict[str, Any]:
        changes = dict(columns)
        now = time.time()
        if status is not None:
            changes["status"] = status
            if status == "running" and run.started_at is None:
                changes.setdefault("started_at", now)
            if status in FINISHED_STATUSES and run.ended_at is None:
                changes.setdefault("ended_at", now)
        if ended_at is not None:
            changes["ended_at"] = ended_at
        if summary is not None:
            changes["summary"] = {**run.summary, **summary}
        return changes

    @staticmethod
    def _run_by_id(conn: sqlite3.Connection, run_id: str) -> Run:
        sql = codec.select_sql("runs", codec.RUN_COLUMNS) + " WHERE id = ?"
        row = conn.execute(sql, (run_id,)).fetchone()
        if row is None:
            raise UnknownRunError(f"no run with id '{run_id}'")
        return codec.row_to_run(row)

    def get_run(self, ref: str) -> Run:
        """The run whose id is `ref`, else the newest run named `ref`, else the run whose
        id starts with `ref`, else (for "latest") the newest run.

        Raises UnknownRunError (a UserError) when nothing or more than one run matches.
        """
        if not ref:
            raise UnknownRunError("no run given: name a run by id, id prefix or name")
        select = codec.select_sql("runs", codec.RUN_COLUMNS)
        newest = " ORDER BY created_at DESC, id DESC"
        for where, params in (
            (" WHERE id = ?", (ref,)),
            (" WHERE name = ?", (ref,)),
        ):
            rows = self._query(select + where + newest + " LIMIT 1", params)
            if rows:
                return codec.row_to_run(rows[0])
        rows = self._query(
            select + " WHERE substr(id, 1, ?) = ?" + newest + " LIMIT 6", (len(ref), ref)
        )
        if len(rows) == 1:
            return codec.row_to_run(rows[0])
        if rows:
            listed = ", ".join(f"{r.id} ({r.name})" for r in map(codec.row_to_run, rows[:5]))
            more = " ..." if len(rows) > 5 else ""
            raise UnknownRunError(
                f"run id prefix '{ref}' matches several runs: {listed}{more}; give more characters"
            )
        if ref == LATEST:
            latest = self.list_runs(limit=1)
            if latest:
                return latest[0]
        raise UnknownRunError(self._no_run_message(ref))

    def _no_run_message(self, ref: str) -> str:
        recent = self.list_runs(limit=200)
        if not recent:
            return f"no run '{ref}': the store {self.path} has no runs yet"
        names = list(dict.fromkeys(run.name for run in recent))
        close = [name for name in names if name.startswith(ref)][:3]
        close = close or difflib.get_close_matches(ref, names + [r.id for r in recent], n=3)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        return f"no run '{ref}'{hint} (`cloudtrain runs` lists ids and names)"

    def list_runs(self, limit: int = 50, status: str | None = None) -> list[Run]:
        """Runs, newest first; only those with `status` when given."""
        sql = codec.select_sql("runs", codec.RUN_COLUMNS)
        params: list[Any] = []
        if status is not None:
            sql += " WHERE status = ?"
            params.append(status)
        sql += " ORDER BY created_at DESC, id DESC LIMIT ?"
        params.append(limit)
        return [codec.row_to_run(row) for row in self._query(sql, params)]

    def delete_run(self, run_id: str) -> None:
        """Remove a run with all its steps, samples, events, findings and attempts."""
        with self._transaction() as conn:
            self._run_by_id(conn, run_id)
            conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))

    def overview(self, ref: str, now_unix_s: float | None = None) -> RunOverview:
        """The run `ref` (as get_run resolves it) with its last step, counts and cost."""
        return self._overview(self.get_run(ref), now_unix_s)

    def overviews(
        self, limit: int = 50, status: str | None = None, now_unix_s: float | None = None
    ) -> list[RunOverview]:
        """list_runs with each run's last step, counts and cost."""
        return [self._overview(run, now_unix_s) for run in self.list_runs(limit, status)]

    def _overview(self, run: Run, now_unix_s: float | None) -> RunOverview:
        now = time.time() if now_unix_s is None else now_unix_s
        count = self._query("SELECT COUNT(*) FROM steps WHERE run_id = ?", (run.id,))[0][0]
        attempts = self.attempts(run.id)
        spends = [a.spend_usd for a in attempts if a.spend_usd is not None]
        return RunOverview(
            run=run,
            last_step=self.last_step(run.id),
            step_records=count,
            event_counts=self.event_counts(run.id),
            finding_counts=self.finding_counts(run.id),
            attempts=attempts,
            duration_s=run.duration_s(now),
            cost_usd=sum(spends) if spends else run.cost_usd(now),
        )

    # -- attempts ---------------------------------------------------------------------

    def add_attempt(
        self,
        run_id: str,
        *,
        attempt: int | None = None,
        started_at: float | None = None,
        ended_at: float | None = None,
        exit_code: int | None = None,
        reason: str | None = None,
        spend_usd: float | None = None,
    ) -> Attempt:
        """Record an attempt of a supervised run; `attempt` None takes the next number
        (1 for the first), `started_at` None is now."""
        with self._transaction() as conn:
            self._run_by_id(conn, run_id)
            if attempt is None:
                sql = "SELECT COALESCE(MAX(attempt), 0) + 1 FROM attempts WHERE run_id = ?"
                attempt = int(conn.execute(sql, (run_id,)).fetchone()[0])
            record = Attempt(
                run_id, attempt, time.time() if started_at is None else started_at,
                ended_at, exit_code, reason, spend_usd,
            )  # fmt: skip
            values = [getattr(record, c) for c in codec.ATTEMPT_COLUMNS]
            try:
                conn.execute(codec.insert_sql("attempts", codec.ATTEMPT_COLUMNS), values)
            except sqlite3.IntegrityError:
                raise StoreError(f"run {run_id} already has attempt {attempt}") from None
            return record

    def update_attempt(self, run_id: str, attempt: int, **changes: Any) -> Attempt:
        """Set `ended_at`, `exit_code`, `reason` or `spend_usd` of an attempt; return it."""
        unknown = set(changes) - set(_ATTEMPT_UPDATABLE)
        if unknown:
            raise ValueError(f"update_attempt: can only set {', '.join(_ATTEMPT_UPDATABLE)}")
        with self._transaction() as conn:
            if changes:
                assignments = ", ".join(f"{c} = ?" for c in changes)
                sql = f"UPDATE attempts SET {assignments} WHERE run_id = ? AND attempt = ?"
                conn.execute(sql, [*changes.values(), run_id, attempt])
            sql = codec.select_sql("attempts", codec.ATTEMPT_COLUMNS)
            row = conn.execute(
                sql + " WHERE run_id = ? AND attempt = ?", (run_id, attempt)
            ).fetchone()
            if row is None:
                raise StoreError(f"run {run_id} has no attempt {attempt}")
            return codec.row_to_attempt(row)

    def attempts(self, run_id: str) -> list[Attempt]:
        sql = codec.select_sql("attempts", codec.ATTEMPT_COLUMNS)
        rows = self._query(sql + " WHERE run_id = ? ORDER BY attempt", (run_id,))
        return [codec.row_to_attempt(row) for row in rows]

    # -- telemetry: writes ------------------------------------------------------------

    def add_steps(self, records: Sequence[StepRecord]) -> None:
        self.add_records(records)

    def add_samples(self, samples: Sequence[Sample]) -> None:
        self.add_records(samples)

    def add_event(self, event: Event) -> None:
        self.add_records([event])

    def add_events(self, events: Sequence[Event]) -> None:
        self.add_records(events)

    def add_findings(self, findings: Sequence[Finding]) -> None:
        """Add findings to what is stored."""
        with self._transaction() as conn:
            self._insert(conn, list(findings))

    def replace_findings(self, run_id: str, findings: Sequence[Finding]) -> None:
        """A fresh diagnosis of `run_id` supersedes the last one, even when it finds nothing."""
        strays = sorted({f.run_id for f in findings} - {run_id})
        if strays:
            raise ValueError(f"findings of run {strays[0]} passed to replace those of {run_id}")
        with self._transaction() as conn:
            conn.execute("DELETE FROM findings WHERE run_id = ?", (run_id,))
            self._insert(conn, list(findings))

    def add_records(self, records: Sequence[Record]) -> None:
        """Insert any mix of StepRecord, Sample, Event and Finding in one transaction."""
        if not records:
            return
        with self._transaction() as conn:
            self._insert(conn, records)

    def _insert(self, conn: sqlite3.Connection, records: Sequence[Record]) -> None:
        groups: dict[type, list[tuple[Any, ...]]] = {}
        for record in records:
            encode = _ENCODERS.get(type(record))
            if encode is None:
                raise TypeError(f"the run store cannot hold a {type(record).__name__}")
            groups.setdefault(type(record), []).append(encode[1](record))
        try:
            for kind, rows in groups.items():
                conn.executemany(_ENCODERS[kind][0], rows)
        except sqlite3.IntegrityError as error:
            raise StoreError(self._integrity_message(conn, records, error)) from None

    def _integrity_message(
        self, conn: sqlite3.Connection, records: Sequence[Record], error: Exception
    ) -> str:
        run_ids = {r.run_id for r in records if r.run_id is not None}
        known = {row[0] for row in conn.execute("SELECT id FROM runs")}
        missing = sorted(run_ids - known)
        if missing:
            return (
                f"records for run(s) not in the store {self.path}: {', '.join(missing[:5])}; "
                "create the run first with RunStore.create_run"
            )
        return f"records rejected by the store {self.path}: {error}"

    # -- telemetry: reads ---------------------------------------------------------------

    def steps(
        self, run_id: str, rank: int | None = None, *, since_step: int | None = None
    ) -> list[StepRecord]:
        """Step records of a run by step, then rank, then time (a step replayed after a
        resume appears once per attempt); only `rank`'s, and only steps > `since_step`,
        when given."""
        sql = codec.select_sql("steps", codec.STEP_COLUMNS) + " WHERE run_id = ?"
        params: list[Any] = [run_id]
        if rank is not None:
            sql += " AND rank = ?"
            params.append(rank)
        if since_step is not None:
            sql += " AND step > ?"
            params.append(since_step)
        rows = self._query(sql + " ORDER BY step, rank, time_unix_s", params)
        return [codec.row_to_step(row) for row in rows]

    def last_step(self, run_id: str) -> StepRecord | None:
        """The record of the highest step (latest written among ranks); None if none."""
        sql = codec.select_sql("steps", codec.STEP_COLUMNS) + (
            " WHERE run_id = ? ORDER BY step DESC, time_unix_s DESC LIMIT 1"
        )
        rows = self._query(sql, (run_id,))
        return codec.row_to_step(rows[0]) if rows else None

    def samples(
        self,
        run_id: str | None,
        *,
        since_unix_s: float | None = None,
        until_unix_s: float | None = None,
    ) -> list[Sample]:
        """Samples of a run in time order (`run_id` None: those taken outside any run),
        optionally only those in [since_unix_s, until_unix_s]."""
        sql = codec.select_sql("samples", codec.SAMPLE_COLUMNS)
        sql += " WHERE run_id IS ?"
        params: list[Any] = [run_id]
        if since_unix_s is not None:
            sql += " AND time_unix_s >= ?"
            params.append(since_unix_s)
        if until_unix_s is not None:
            sql += " AND time_unix_s <= ?"
            params.append(until_unix_s)
        rows = self._query(sql + " ORDER BY time_unix_s", params)
        return [codec.row_to_sample(row) for row in rows]

    def events(self, run_id: str, kind: str | None = None) -> list[Event]:
        """Events of a run in time order; only those of `kind` when given."""
        sql = codec.select_sql("events", codec.EVENT_COLUMNS) + " WHERE run_id = ?"
        params: list[Any] = [run_id]
        if kind is not None:
            sql += " AND kind = ?"
            params.append(kind)
        rows = self._query(sql + " ORDER BY time_unix_s, rowid", params)
        return [codec.row_to_event(row) for row in rows]

    def event_counts(self, run_id: str) -> dict[str, int]:
        sql = "SELECT kind, COUNT(*) FROM events WHERE run_id = ? GROUP BY kind ORDER BY kind"
        return {kind: count for kind, count in self._query(sql, (run_id,))}

    def finding_counts(self, run_id: str) -> dict[str, int]:
        sql = "SELECT severity, COUNT(*) FROM findings WHERE run_id = ? GROUP BY severity"
        return {severity: count for severity, count in self._query(sql, (run_id,))}

    def findings(self, run_id: str) -> list[Finding]:
        """Findings of a run, most severe first, in the order they were added."""
        sql = codec.select_sql("findings", codec.FINDING_COLUMNS) + (
            " WHERE run_id = ? ORDER BY CASE severity WHEN 'critical' THEN 0 "
            "WHEN 'warn' THEN 1 ELSE 2 END, rowid"
        )
        return [codec.row_to_finding(row) for row in self._query(sql, (run_id,))]

    def counts(self) -> dict[str, int]:
        """Rows per table (runs, attempts, steps, samples, events, findings)."""
        tables = ("runs", "attempts", "steps", "samples", "events", "findings")
        return {t: self._query(f"SELECT COUNT(*) FROM {t}")[0][0] for t in tables}


_ENCODERS: dict[type, tuple[str, Any]] = {
    StepRecord: (codec.insert_sql("steps", codec.STEP_COLUMNS), codec.step_to_row),
    Sample: (codec.insert_sql("samples", codec.SAMPLE_COLUMNS), codec.sample_to_row),
    Event: (codec.insert_sql("events", codec.EVENT_COLUMNS), codec.event_to_row),
    Finding: (codec.insert_sql("findings", codec.FINDING_COLUMNS), codec.finding_to_row),
}
