"""The one place cloudtrain talks to NVML.

Every NVML call goes through `Nvml.query`, which turns "not supported", "no permission",
a missing library, no driver, or a function this driver lacks into `None`. Readers
above it (`monitor.gpu`, the doctor) never see an NVML exception.

Where readings come from is a seam: an `NvmlSource`. `PynvmlSource` calls the real
library (nvidia-ml-py); `RecordedSource` replays readings recorded to JSON
(tests/fixtures/nvml/*.json), so every GPU code path runs on a machine without a GPU.

Recorded file format::

    {"description": "...", "driver_version": "550.54.15", "cuda_driver_version": 12040,
     "init_error": null,                       # or "LibraryNotFound", "DriverNotLoaded"
     "devices": [{"nvmlDeviceGetName": "NVIDIA H100 80GB HBM3", ...}],   # static readings
     "frames": [{"t_s": 0.0, "devices": [{"nvmlDeviceGetPowerUsage": 650000, ...}]}]}

A reading is stored under the pynvml function name; a call with extra arguments is
stored as "name:arg1:arg2" (e.g. "nvmlDeviceGetClockInfo:1"). The string "NotSupported"
(or a missing key) replays as NVMLError_NotSupported; dict values replay as objects
with attributes, like pynvml's ctypes structures.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

import pynvml

from cloudtrain.errors import DataError

GPM_ACTIVITY = "cloudtrain:gpm_activity"
"""Derived reading: (sm_active_pct, tensor_active_pct) from GPM between two calls."""

# Errors that will not change if asked again: remember them and stop asking.
_PERMANENT = (
    pynvml.NVMLError_NotSupported,
    pynvml.NVMLError_FunctionNotFound,
    pynvml.NVMLError_NoPermission,
)


class NvmlSource(Protocol):
    """Where NVML readings come from. Methods may raise `pynvml.NVMLError` or `OSError`."""

    def init(self) -> None: ...
    def device_count(self) -> int: ...
    def system_call(self, name: str, *args: Any) -> Any: ...
    def device_call(self, index: int, name: str, *args: Any) -> Any: ...
    def pair_call(self, index_a: int, index_b: int, name: str) -> Any: ...
    def refresh(self) -> None: ...


class Nvml:
    """NVML behind one chokepoint. `available` is False (with `unavailable_reason`) when
    the library, the driver or every GPU is missing; every query then returns None."""

    def __init__(self, source: NvmlSource | None = None) -> None:
        self.source: NvmlSource = source if source is not None else PynvmlSource()
        self.available = False
        self.unavailable_reason: str | None = None
        self._unsupported: set[tuple[int | None, str]] = set()
        self._lock = threading.Lock()
        try:
            self.source.init()
            self.available = True
        except (pynvml.NVMLError, OSError) as error:
            self.unavailable_reason = _describe(error)

    def _guard(self, key: tuple[int | None, str], call: Any) -> Any:
        if not self.available or key in self._unsupported:
            return None
        try:
            with self._lock:
                return call()
        except _PERMANENT:
            self._unsupported.add(key)
            return None
        except (pynvml.NVMLError, OSError, AttributeError, TypeError, ValueError):
            # GPU lost, timeout, an older pynvml without this function, odd driver data:
            # a missing value this time; try again next time.
            return None

    def query(self, index: int | None, name: str, *args: Any) -> Any:
        """One NVML reading for device `index` (None: a system-wide call); None if the
        reading is unsupported or NVML is unavailable."""
        key = (index, ":".join([name, *map(str, args)]))
        if index is None:
            return self._guard(key, lambda: self.source.system_call(name, *args))
        return self._guard(key, lambda: self.source.device_call(index, name, *args))

    def query_pair(self, index_a: int, index_b: int, name: str) -> Any:
        """A reading about two devices (e.g. their topology); None if unsupported."""
        return self._guard(
            (index_a, f"{name}:{index_b}"), lambda: self.source.pair_call(index_a, index_b, name)
        )

    def device_count(self) -> int:
        """Number of GPUs NVML sees; 0 when NVML is unavailable."""
        count = self._guard((None, "nvmlDeviceGetCount"), self.source.device_count)
        return int(count or 0)

    def refresh(self) -> None:
        """Called once per sampling tick (replayed sources move to their next frame)."""
        if self.available:
            self.source.refresh()


def _describe(error: BaseException) -> str:
    if isinstance(error, pynvml.NVMLError_LibraryNotFound):
        return "NVML library not found (no NVIDIA driver installed)"
    if isinstance(error, pynvml.NVMLError_DriverNotLoaded):
        return "NVIDIA driver not loaded"
    if isinstance(error, pynvml.NVMLError_NoPermission):
        return "no permission to use NVML"
    return f"NVML unavailable: {error}"


def _decode(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


class PynvmlSource:
    """The real NVML, through nvidia-ml-py."""

    def __init__(self) -> None:
        self._handles: dict[int, Any] = {}
        self._gpm_previous: dict[int, Any] = {}

    def init(self) -> None:
        pynvml.nvmlInit()

    def device_count(self) -> int:
        return int(pynvml.nvmlDeviceGetCount())

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = pynvml.nvmlDeviceGetHandleByIndex(index)
        return self._handles[index]

    def system_call(self, name: str, *args: Any) -> Any:
        return _decode(getattr(pynvml, name)(*args))

    def device_call(self, index: int, name: str, *args: Any) -> Any:
        if name == GPM_ACTIVITY:
            return self._gpm_activity(index)
        return _decode(getattr(pynvml, name)(self._handle(index), *args))

    def pair_call(self, index_a: int, index_b: int, name: str) -> Any:
        return getattr(pynvml, name)(self._handle(index_a), self._handle(index_b))

    def refresh(self) -> None:
        return None

    def _gpm_activity(self, index: int) -> tuple[float, float] | None:
        """SM and tensor activity (%) between this call and the previous one (Hopper+)."""
        handle = self._handle(index)
        if not pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        sample = pynvml.nvmlGpmSampleGet(handle, pynvml.nvmlGpmSampleAlloc())
        previous = self._gpm_previous.get(index)
        self._gpm_previous[index] = sample
        if previous is None:
            return None
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 2
        request.sample1 = previous
        request.sample2 = sample
        request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
        request.metrics[1].metricId = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
        pynvml.nvmlGpmMetricsGet(request)
        pynvml.nvmlGpmSampleFree(previous)
        return (float(request.metrics[0].value), float(request.metrics[1].value))


def _namespace(value: Any) -> Any:
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _namespace(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_namespace(v) for v in value]
    return value


_INIT_ERRORS = {
    "LibraryNotFound": pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
    "DriverNotLoaded": pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    "NoPermission": pynvml.NVML_ERROR_NO_PERMISSION,
}


class RecordedSource:
    """Replays NVML readings recorded to JSON; each `refresh()` moves to the next frame
    (staying on the last one at the end)."""

    def __init__(self, recording: dict[str, Any], *, origin: str = "<recording>") -> None:
        self.origin = origin
        self.recording = recording
        self.static: list[dict[str, Any]] = recording.get("devices", [])
        self.frames: list[dict[str, Any]] = recording.get("frames", [{}])
        self.frame_index = 0

    @classmethod
    def load(cls, path: str | Path) -> RecordedSource:
        path = Path(path)
        try:
            recording = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise DataError(path, f"not a readable NVML recording ({error})") from error
        if not isinstance(recording, dict) or not isinstance(recording.get("devices"), list):
            raise DataError(path, "an NVML recording needs a 'devices' list")
        return cls(recording, origin=str(path))

    def init(self) -> None:
        error = self.recording.get("init_error")
        if error:
            raise pynvml.NVMLError(_INIT_ERRORS.get(error, pynvml.NVML_ERROR_UNKNOWN))

    def device_count(self) -> int:
        return len(self.static)

    def _lookup(self, tables: Iterable[dict[str, Any]], key: str) -> Any:
        for table in tables:
            if key in table:
                value = table[key]
                if value == "NotSupported":
                    break
                return _namespace(value)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _frame(self) -> dict[str, Any]:
        return self.frames[min(self.frame_index, len(self.frames) - 1)] if self.frames else {}

    def system_call(self, name: str, *args: Any) -> Any:
        key = ":".join([name, *map(str, args)])
        return self._lookup([self._frame().get("system", {}), self.recording], _snake(key))

    def device_call(self, index: int, name: str, *args: Any) -> Any:
        if index >= len(self.static):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        key = ":".join([name, *map(str, args)])
        dynamic = self._frame().get("devices", [])
        tables = [dynamic[index] if index < len(dynamic) else {}, self.static[index]]
        return self._lookup(tables, key)

    def pair_call(self, index_a: int, index_b: int, name: str) -> Any:
        return self.device_call(index_a, f"{name}:{index_b}")

    def refresh(self) -> None:
        if self.frame_index < len(self.frames) - 1:
            self.frame_index += 1

    @property
    def frame_time_s(self) -> float | None:
        """Recorded time of the current frame (seconds from the recording's start)."""
        value = self._frame().get("t_s")
        return None if value is None else float(value)


_SYSTEM_KEYS = {
    "nvmlSystemGetDriverVersion": "driver_version",
    "nvmlSystemGetCudaDriverVersion": "cuda_driver_version",
    "nvmlSystemGetCudaDriverVersion_v2": "cuda_driver_version",
}


def _snake(key: str) -> str:
    return _SYSTEM_KEYS.get(key, key)


RECORDING_ENV = "CLOUDTRAIN_NVML_RECORDING"
"""Set to a recording file to make every cloudtrain command replay it instead of NVML
(demos, tests of the CLI on machines without a GPU)."""


def open_nvml(recording: str | Path | None = None) -> Nvml:
    """NVML from the real library, or replayed from `recording` (default:
    $CLOUDTRAIN_NVML_RECORDING when set)."""
    recording = recording or os.environ.get(RECORDING_ENV) or None
    return Nvml(RecordedSource.load(recording) if recording else None)
