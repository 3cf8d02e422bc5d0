"""The sampler: reads GPUs and host every `interval_s` on a background thread, keeps the
latest `Snapshot`, hands each to listeners (the watchdog, a dashboard) and writes it to the
run store as a `Sample`, in batches through the store's `BatchWriter`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cloudtrain.monitor.gpu import GPUReader
from cloudtrain.monitor.host import HostReader
from cloudtrain.monitor.keys import snapshot_metrics
from cloudtrain.monitor.nvml import Nvml
from cloudtrain.monitor.snapshots import Snapshot
from cloudtrain.store import BatchWriter, RunStore, Sample

log = logging.getLogger(__name__)

Listener = Callable[[Snapshot], None]


@dataclass(frozen=True)
class SamplerConfig:
    """How often and what to sample."""

    interval_s: float = 1.0
    """Seconds between readings; must be > 0."""
    gpm: bool = True
    """Read GPM SM/tensor activity where supported (Hopper and newer)."""
    max_batch: int = 500
    """Samples buffered before a write to the store."""
    flush_interval_s: float = 5.0
    """Longest a sample waits before it is written."""

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"interval_s must be > 0 seconds, not {self.interval_s}")


class Sampler:
    """Samples the machine. Use `read()` for one snapshot now, or `start()`/`stop()` (or
    `with Sampler(...)`) to sample in the background.

    `store`: a RunStore or a store path; None keeps samples in memory only (`latest`).
    `run_id`: the run the samples belong to (None: unattributed). `pid`: a training
    process whose tree to follow. `nvml`: defaults to the real NVML.
    """

    def __init__(
        self,
        *,
        config: SamplerConfig | None = None,
        nvml: Nvml | None = None,
        store: RunStore | str | Path | None = None,
        run_id: str | None = None,
        pid: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config or SamplerConfig()
        self.nvml = nvml if nvml is not None else Nvml()
        self.gpus = GPUReader(self.nvml, gpm=self.config.gpm)
        self.host = HostReader(pid=pid)
        self.run_id = run_id
        self.clock = clock
        self.latest: Snapshot | None = None
        self.sample_count = 0
        self._listeners: list[Listener] = []
        self._writer: Any = None
        if store is not None:
            self._writer = BatchWriter(
                store,
                max_batch=self.config.max_batch,
                flush_interval_s=self.config.flush_interval_s,
            )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add_listener(self, listener: Listener) -> None:
        """Call `listener(snapshot)` after every background reading."""
        self._listeners.append(listener)

    def read(self) -> Snapshot:
        """Read everything now (does not store or notify)."""
        now = self.clock()
        snapshot = Snapshot(
            time_unix_s=now,
            gpus=self.gpus.read(now),
            host=self.host.read(now),
            nvml_available=self.nvml.available,
            nvml_unavailable_reason=self.nvml.unavailable_reason,
        )
        self.latest = snapshot
        self.nvml.refresh()  # a replayed source moves to its next frame
        return snapshot

    def tick(self) -> Snapshot:
        """Read, store and notify listeners once (what the background thread does)."""
        snapshot = self.read()
        self.sample_count += 1
        if self._writer is not None:
            self._writer.put(
                Sample(
                    time_unix_s=snapshot.time_unix_s,
                    metrics=snapshot_metrics(snapshot),
                    run_id=self.run_id,
                    host=snapshot.host.hostname,
                )
            )
        for listener in list(self._listeners):
            try:
                listener(snapshot)
            except Exception:  # a broken listener must not stop sampling
                log.exception("sampler listener failed")
        return snapshot

    def _loop(self) -> None:
        next_s = time.monotonic()
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:
                log.exception("sampling failed; retrying next interval")
            next_s += self.config.interval_s
            delay = next_s - time.monotonic()
            if delay < 0:  # fell behind (suspended, overloaded): skip, don't burst
                next_s, delay = time.monotonic(), 0.0
            self._stop.wait(delay)

    def start(self) -> Sampler:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._loop, name="cloudtrain-sampler", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and write what is buffered."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 2 * self.config.interval_s))
            self._thread = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
