"""BatchWriter: records put from any thread, written by a background thread in batches.

`put()` only appends to a list under a lock (microseconds), so a training loop never
waits on the disk. A background thread writes what has accumulated, in one transaction,
every `flush_interval_s` or as soon as `max_batch` records are waiting. `flush()` and
`close()` return once everything put before them is committed; `close()` also runs at
interpreter exit for writers still open, so records put before a normal exit (or an
uncaught exception) are persisted. A killed process loses at most the last interval.

A write that fails because the database stays locked past the busy timeout is retried
on the next round; any other failure (e.g. records of a run that is not in the store) is
raised from the next `put()`, `flush()` or `close()` in the caller's thread.
"""

from __future__ import annotations

import atexit
import os
import sqlite3
import sys
import threading
import weakref
from collections.abc import Iterable
from pathlib import Path

from cloudtrain.store.records import Event, Finding, Record, Sample, StepRecord
from cloudtrain.store.runstore import RunStore
from cloudtrain.store.schema import StoreError

_ACCEPTED = (StepRecord, Sample, Event, Finding)
_OPEN_WRITERS: weakref.WeakSet[BatchWriter] = weakref.WeakSet()


class BatchWriter:
    """Batched, thread-safe writes to a run store; a context manager.

    `target` is a RunStore (shared, left open on close) or a path (None: the default
    store), which the writer opens and closes itself.
    """

    def __init__(
        self,
        target: RunStore | str | Path | None = None,
        max_batch: int = 500,
        flush_interval_s: float = 1.0,
    ) -> None:
        if max_batch < 1 or flush_interval_s <= 0:
            raise ValueError("BatchWriter needs max_batch >= 1 and flush_interval_s > 0")
        self._owns_store = not isinstance(target, RunStore)
        self.store = target if isinstance(target, RunStore) else RunStore.open(target)
        self.max_batch = max_batch
        self.flush_interval_s = flush_interval_s
        self.records_written = 0
        """Records committed so far."""
        self._pending: list[Record] = []
        self._cond = threading.Condition()  # guards _pending, _closed, _error
        self._write_lock = threading.Lock()  # held while a batch is taken and written
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="cloudtrain-store-writer")
        self._thread.daemon = True
        self._thread.start()
        self._pid = os.getpid()
        _OPEN_WRITERS.add(self)

    def put(self, record: Record) -> None:
        """Queue one StepRecord, Sample, Event or Finding for writing."""
        if not isinstance(record, _ACCEPTED):
            raise TypeError(f"BatchWriter cannot write a {type(record).__name__}")
        with self._cond:
            self._check_usable()
            self._pending.append(record)
            if len(self._pending) >= self.max_batch:
                self._cond.notify()

    def put_many(self, records: Iterable[Record]) -> None:
        for record in records:
            self.put(record)

    def flush(self) -> None:
        """Write everything put so far; return when it is committed."""
        with self._cond:
            self._raise_error()
        self._write_pending()

    def close(self) -> None:
        """Flush, stop the thread, close an owned store. Closing again does nothing."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify()
        self._thread.join()
        _OPEN_WRITERS.discard(self)
        try:
            self._write_pending()  # a batch the thread had to put back, if any
            with self._cond:
                self._raise_error()
        finally:
            if self._owns_store:
                self.store.close()

    def __enter__(self) -> BatchWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def pending(self) -> int:
        """Records put but not yet written."""
        with self._cond:
            return len(self._pending)

    def _check_usable(self) -> None:
        self._raise_error()
        if self._closed:
            raise StoreError("BatchWriter.put after close()")

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _write_pending(self) -> None:
        with self._write_lock:
            with self._cond:
                batch, self._pending = self._pending, []
            if not batch:
                return
            try:
                self.store.add_records(batch)
            except sqlite3.OperationalError:
                with self._cond:  # locked past the busy timeout: keep the batch, in order
                    self._pending[:0] = batch
                raise
            self.records_written += len(batch)

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._closed and len(self._pending) < self.max_batch:
                    self._cond.wait(timeout=self.flush_interval_s)
                closing = self._closed
            try:
                self._write_pending()
            except sqlite3.OperationalError:
                pass  # retried next round, or by close()
            except BaseException as error:
                with self._cond:
                    self._error = self._error or error
            if closing:
                return


@atexit.register
def _close_open_writers() -> None:
    for writer in list(_OPEN_WRITERS):
        if writer._pid != os.getpid():
            continue  # inherited through fork: its thread and connection belong to the parent
        try:
            writer.close()
        except Exception as error:
            print(f"cloudtrain: records not written at exit: {error}", file=sys.stderr)
