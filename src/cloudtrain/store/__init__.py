"""The run store: runs, their attempts, per-step telemetry, GPU/host samples, events and
findings in one SQLite file (WAL) under CLOUDTRAIN_HOME (`paths.store_path()`).

    from cloudtrain.store import RunStore, BatchWriter, StepRecord

    with RunStore.open() as store:
        run_id = store.create_run("gpt-small", gpu_name="H100-SXM", gpu_count=8)
        with BatchWriter(store) as writer:          # background thread, batched commits
            writer.put(StepRecord(run_id, step=0, time_unix_s=time.time(), loss=3.2))
        store.update_run(run_id, status="completed", summary={"tokens_per_s": 1.2e6})

This is the only package that speaks SQL; the schema is versioned (PRAGMA user_version)
and migrated forward on open; a store from a newer cloudtrain is refused.
"""

from cloudtrain.errors import StoreVersionError
from cloudtrain.store.ids import new_run_id
from cloudtrain.store.records import (
    EVENT_KINDS,
    FINISHED_STATUSES,
    RUN_STATUSES,
    SEVERITIES,
    SYNC_WAIT_KEY,
    Attempt,
    Event,
    Finding,
    Record,
    Run,
    RunOverview,
    Sample,
    StepRecord,
)
from cloudtrain.store.runstore import RunStore, UnknownRunError
from cloudtrain.store.schema import SCHEMA_VERSION, StoreError
from cloudtrain.store.writer import BatchWriter

__all__ = [
    "EVENT_KINDS",
    "FINISHED_STATUSES",
    "RUN_STATUSES",
    "SCHEMA_VERSION",
    "SEVERITIES",
    "SYNC_WAIT_KEY",
    "Attempt",
    "BatchWriter",
    "Event",
    "Finding",
    "Record",
    "Run",
    "RunOverview",
    "RunStore",
    "Sample",
    "StepRecord",
    "StoreError",
    "StoreVersionError",
    "UnknownRunError",
    "new_run_id",
]
