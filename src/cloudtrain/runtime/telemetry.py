"""What a run reports: FLOPs per sample (measured once), MFU against the catalog's
dense peak, memory, and the run record and per-step rows in the store (the optional
TensorBoard and W&B outputs are in `cloudtrain.runtime.sinks`). Only rank 0 writes."""

from __future__ import annotations

import os
import platform
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from cloudtrain.catalog import resolve_gpu

GIB = 1024**3
RUN_ID_ENV = "CLOUDTRAIN_RUN_ID"
"""Set by a launcher that already created the run in the store: steps go to that run."""


def measure_flops(run_pass: Callable[[], None]) -> float:
    """Training FLOPs (forward + backward) of one pass, counted by torch's flop counter
    (matmuls, convolutions, attention; elementwise work is not counted, as in MFU)."""
    counter = FlopCounterMode(display=False)
    with counter:
        run_pass()
    return float(counter.get_total_flops())


@dataclass(frozen=True)
class DevicePeak:
    """The catalog's dense peak of the device running this rank."""

    gpu_name: str | None
    """Catalog name of the GPU; None on CPU or when the catalog does not know it."""
    peak_flops: float | None
    """Dense peak FLOP/s for the run's dtype; None: MFU is not reported."""


def device_peak(device: torch.device, peak_dtype: str) -> DevicePeak:
    if device.type != "cuda":
        return DevicePeak(None, None)
    spec = resolve_gpu(torch.cuda.get_device_name(device))
    if spec is None:
        return DevicePeak(None, None)
    tflops = spec.peak_tflops(peak_dtype)
    return DevicePeak(spec.name, tflops * 1e12 if tflops else None)


def device_name(device: torch.device) -> str:
    """What the hardware calls itself: the CUDA device name, else the CPU model (or
    the machine type when the OS does not say)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def memory_gib(device: torch.device) -> tuple[float | None, float | None, float | None]:
    """(allocated, reserved, peak allocated) in GiB; Nones on CPU."""
    if device.type != "cuda":
        return None, None, None
    return (
        torch.cuda.memory_allocated(device) / GIB,
        torch.cuda.memory_reserved(device) / GIB,
        torch.cuda.max_memory_allocated(device) / GIB,
    )


def host_info(device: torch.device, world_size: int) -> dict[str, Any]:
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "world_size": world_size,
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


class RunRecorder:
    """The run in the store: created at start, steps and events in batches, a summary at
    the end. Every method is a no-op when recording is off (not rank 0, store=False)."""

    def __init__(self, target: bool | str | Path, enabled: bool) -> None:
        self.enabled = enabled and target is not False
        self.target = None if target is True else target
        self.run_id: str | None = None
        self._store = None
        self._writer = None

    def start(
        self,
        *,
        name,
        config,
        host,
        gpu_name,
        gpu_count,
        price_usd_per_hour,
        continue_run: str | None = None,
    ) -> None:
        """Create the run, or mark `continue_run` running again (a resumed run stays one
        run). `CLOUDTRAIN_RUN_ID`, set by a launcher that created the run, wins."""
        if not self.enabled:
            return
        from cloudtrain.store import BatchWriter, RunStore, UnknownRunError

        self._store = RunStore.open(self.target)
        for run_id in (os.environ.get(RUN_ID_ENV), continue_run):
            if not run_id:
                continue
            try:
                run = self._store.get_run(run_id)
            except UnknownRunError:
                continue
            extra = {"gpu_name": gpu_name} if gpu_name and not run.gpu_name else {}
            merged = {**run.config, **config}  # a launcher's keys stay; this fit's win
            self._store.update_run(run.id, status="running", config=merged, **extra)
            self.run_id = run.id
            break
        if self.run_id is None:
            self.run_id = self._store.create_run(
                name,
                kind="train",
                config=config,
                host=host,
                gpu_name=gpu_name,
                gpu_count=gpu_count,
                price_usd_per_hour=price_usd_per_hour,
                command=list(sys.argv),
            )
        self._writer = BatchWriter(self._store, flush_interval_s=1.0)

    @property
    def store_path(self) -> Path | None:
        """File of the open store; None when recording is off or finished."""
        return Path(self._store.path) if self._store is not None else None

    def step(self, **fields: Any) -> None:
        if self._writer is None:
            return
        from cloudtrain.store import StepRecord

        self._writer.put(StepRecord(run_id=self.run_id, time_unix_s=time.time(), **fields))

    def event(self, kind: str, message: str, **data: Any) -> None:
        if self._writer is None:
            return
        from cloudtrain.store import Event

        self._writer.put(Event(self.run_id, kind, message, data=data))

    def finish(self, status: str, summary: dict[str, Any]) -> None:
        if self._store is None:
            return
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._store.update_run(self.run_id, status=status, summary=summary)
        self._store.close()
        self._store = None


def start_monitor(recorder: RunRecorder, interval_s: float) -> Any:
    """A started `cloudtrain.monitor.Sampler` writing GPU and host samples to the
    recorder's store under its run; None when recording is off, or when the run is one
    that `cloudtrain watch` samples (two samplers would double-count energy). Its own
    store connection, so sampling never waits on the training thread."""
    path = recorder.store_path
    if path is None or recorder.run_id is None:
        return None
    from cloudtrain.monitor import STACK_DUMP_ENV, Sampler, SamplerConfig

    if os.environ.get(STACK_DUMP_ENV) and os.environ.get(RUN_ID_ENV) == recorder.run_id:
        return None  # `cloudtrain watch -- ...` created this run and samples it already

    config = SamplerConfig(interval_s=interval_s, flush_interval_s=max(1.0, interval_s))
    return Sampler(config=config, store=path, run_id=recorder.run_id, pid=os.getpid()).start()
