"""The store's schema as a list of forward migrations, versioned by PRAGMA user_version.

Migration N (1-based) takes a store from version N-1 to N. To change the schema, append
one function to MIGRATIONS; never edit a released one. Each migration runs in its own
IMMEDIATE transaction together with the version bump, so a crash leaves the store at
the old or the new version, never in between, and two processes opening a fresh store
at once migrate it once.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path

from cloudtrain.errors import CloudtrainError, StoreVersionError

Migration = Callable[[sqlite3.Connection], None]


class StoreError(CloudtrainError):
    """The store file cannot be used (not a cloudtrain store, unreadable, bad records)."""


def _execute_all(conn: sqlite3.Connection, script: str) -> None:
    """Run `;`-separated DDL inside the caller's transaction (executescript would commit)."""
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)


def _migration_1_initial(conn: sqlite3.Connection) -> None:
    """Runs, attempts, steps, samples, events, findings."""
    _execute_all(
        conn,
        """
        CREATE TABLE runs (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            kind TEXT NOT NULL,
            status TEXT NOT NULL,
            created_at REAL NOT NULL,
            started_at REAL,
            ended_at REAL,
            config TEXT NOT NULL DEFAULT '{}',
            host TEXT NOT NULL DEFAULT '{}',
            gpu_name TEXT,
            gpu_count INTEGER NOT NULL DEFAULT 0,
            provider TEXT,
            region TEXT,
            instance_type TEXT,
            price_usd_per_hour REAL,
            pricing TEXT,
            command TEXT NOT NULL DEFAULT '[]',
            summary TEXT NOT NULL DEFAULT '{}'
        );
        CREATE INDEX runs_created ON runs (created_at);
        CREATE INDEX runs_name ON runs (name);
        CREATE INDEX runs_status ON runs (status, created_at);

        CREATE TABLE attempts (
            run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            attempt INTEGER NOT NULL,
            started_at REAL NOT NULL,
            ended_at REAL,
            exit_code INTEGER,
            reason TEXT,
            spend_usd REAL,
            PRIMARY KEY (run_id, attempt)
        );

        CREATE TABLE steps (
            run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            step INTEGER NOT NULL,
            rank INTEGER NOT NULL DEFAULT 0,
            time_unix_s REAL NOT NULL,
            step_s REAL,
            data_wait_s REAL,
            samples INTEGER,
            tokens INTEGER,
            loss REAL,
            lr REAL,
            grad_norm REAL,
            micro_batch INTEGER,
            mfu REAL,
            flops REAL,
            memory_allocated_gib REAL,
            memory_reserved_gib REAL,
            memory_peak_gib REAL,
            metrics TEXT,
            nan_fields TEXT
        );
        CREATE INDEX steps_run_step ON steps (run_id, step, rank);

        CREATE TABLE samples (
            run_id TEXT REFERENCES runs (id) ON DELETE CASCADE,
            host TEXT NOT NULL DEFAULT '',
            time_unix_s REAL NOT NULL,
            metrics TEXT NOT NULL
        );
        CREATE INDEX samples_run_time ON samples (run_id, time_unix_s);
        CREATE INDEX samples_time ON samples (time_unix_s);

        CREATE TABLE events (
            run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            time_unix_s REAL NOT NULL,
            kind TEXT NOT NULL,
            message TEXT NOT NULL,
            data TEXT NOT NULL DEFAULT '{}'
        );
        CREATE INDEX events_run_kind ON events (run_id, kind, time_unix_s);

        CREATE TABLE findings (
            run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            rule TEXT NOT NULL,
            severity TEXT NOT NULL,
            symptom TEXT NOT NULL,
            evidence TEXT NOT NULL,
            cause TEXT NOT NULL,
            fix TEXT NOT NULL,
            expected_gain TEXT NOT NULL DEFAULT '',
            data TEXT NOT NULL DEFAULT '{}'
        );
        CREATE INDEX findings_run ON findings (run_id);
        """,
    )


MIGRATIONS: tuple[Migration, ...] = (_migration_1_initial,)
"""MIGRATIONS[i] upgrades a store from version i to i + 1."""

SCHEMA_VERSION = len(MIGRATIONS)


def schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _refuse_newer(path: Path | str, version: int, known: int) -> None:
    if version > known:
        raise StoreVersionError(
            f"store at {path} has schema version {version}; this cloudtrain understands "
            f"up to {known} — upgrade cloudtrain (pip install -U cloudtrain)"
        )


def _refuse_foreign(conn: sqlite3.Connection, path: Path | str) -> None:
    tables = [
        row[0]
        for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    ]
    if tables:
        listed = ", ".join(sorted(tables)[:5])
        raise StoreError(
            f"{path} is a SQLite database but not a cloudtrain store (tables: {listed}); "
            "point CLOUDTRAIN_HOME or --store elsewhere"
        )


def migrate(
    conn: sqlite3.Connection, path: Path | str, migrations: Sequence[Migration] = MIGRATIONS
) -> int:
    """Bring the store on `conn` (autocommit mode) up to len(migrations); return the version.

    Raises StoreVersionError when the store is newer than `migrations` knows, StoreError
    when the file is some other SQLite database.
    """
    known = len(migrations)
    _refuse_newer(path, schema_version(conn), known)
    while True:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = schema_version(conn)  # re-read under the write lock
            _refuse_newer(path, version, known)
            if version == known:
                conn.execute("COMMIT")
                return version
            if version == 0:
                _refuse_foreign(conn, path)
            migrations[version](conn)
            conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
