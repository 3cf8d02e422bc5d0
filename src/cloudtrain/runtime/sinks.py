"""Where a run's scalars go besides the run store: TensorBoard event files and an
offline Weights & Biases run. Both packages are optional (`pip install cloudtrain[sinks]`).

A sink never stops training: a missing package, or one that fails to start or to
write, costs one `cloudtrain:` line on stderr and that sink's output, nothing more.
Only rank 0 writes (`enabled=False` elsewhere). Keys follow DESIGN.md (`train/loss`,
`perf/mfu`, `throughput/samples_per_sec`, ...); values of None are not written.

The W&B sink is offline only and never touches the network: the run is written under
`<dir>/wandb/offline-run-*`, to upload later with `wandb sync <that folder>`.
"""

from __future__ import annotations

import contextlib
import json
import struct
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cloudtrain.errors import DataError

DEFAULT_WANDB_PROJECT = "cloudtrain"
WANDB_INIT_TIMEOUT_S = 30.0
"""How long `wandb.init` may take (it starts wandb's local service process)."""
WANDB_FINISH_TIMEOUT_S = 30.0
"""How long closing the W&B run may take (offline: local writes only)."""
WANDB_FLUSH_WAIT_S = 10.0
"""After `finish()`, how long to wait for the run's end to reach its `.wandb` file (wandb
0.31 can return from `finish()` a moment before its writer has flushed)."""


STEP_SCALARS = {
    "loss": "train/loss",
    "lr": "optim/lr",
    "grad_norm": "optim/grad_norm",
    "mfu": "perf/mfu",
    "flops": "perf/flops_per_step",
    "step_s": "time/step_s",
    "data_wait_s": "time/data_wait_s",
    "micro_batch": "batch/micro_batch_size",
    "memory_allocated_gib": "memory/allocated_gib",
    "memory_reserved_gib": "memory/reserved_gib",
    "memory_peak_gib": "memory/peak_gib",
}
"""Field of a step record (`cloudtrain.store.StepRecord`) -> the key the sinks write it
under; the record's `metrics` keys (`throughput/samples_per_sec`, ...) go as they are."""


def step_scalars(record: Mapping[str, Any]) -> dict[str, float | None]:
    """What the sinks get for one step record (the keyword fields of a StepRecord)."""
    values = {key: record.get(name) for name, key in STEP_SCALARS.items()}
    return {**values, **record.get("metrics", {})}


def _warn(message: str) -> None:
    sys.stderr.write(f"cloudtrain: {message}\n")
    sys.stderr.flush()


def _why(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class MetricSink(Protocol):
    """One destination for scalars."""

    name: str
    """What the user calls it, for messages ("TensorBoard")."""

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Write `values` (metric key -> number) at optimizer step `step`."""

    def close(self, status: str = "completed") -> None:
        """Flush and release; `status` is the run's ("completed", "failed", ...)."""


class TensorBoardSink:
    """Scalars as TensorBoard event files in `log_dir` (needs the tensorboard package);
    inert when `log_dir` is None, when not `enabled`, or when it could not start."""

    name = "TensorBoard"

    def __init__(self, log_dir: str | Path | None, enabled: bool = True) -> None:
        self.writer: Any = None
        if log_dir is None or not enabled:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            _warn("tensorboard is not installed (pip install tensorboard); no TensorBoard output")
            return
        try:
            self.writer = SummaryWriter(str(log_dir))
        except Exception as exc:
            _warn(f"TensorBoard could not start in {log_dir} ({_why(exc)}); no TensorBoard output")

    @property
    def active(self) -> bool:
        return self.writer is not None

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        if self.writer is None:
            return
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def close(self, status: str = "completed") -> None:
        writer, self.writer = self.writer, None
        if writer is not None:
            writer.close()


class WandbSink:
    """Scalars to a Weights & Biases run in offline mode (needs the wandb package).

    The run goes under `<dir>/wandb/offline-run-<time>-<id>/` (`run_dir`), named `name`
    (wandb generates one when None), in `project`, with `config` as its config. Nothing
    is sent anywhere: upload later with `wandb sync <run_dir>`. Inert when not `enabled`
    or when wandb is missing or fails to start (one stderr line says which).
    """

    name = "W&B"

    def __init__(
        self,
        dir: str | Path,
        *,
        project: str = DEFAULT_WANDB_PROJECT,
        name: str | None = None,
        config: Mapping[str, Any] | None = None,
        enabled: bool = True,
    ) -> None:
        self.run: Any = None
        self.run_dir: Path | None = None
        """The offline run's folder (what `wandb sync` takes); None when inert."""
        if not enabled:
            return
        try:
            import wandb
        except ImportError:
            _warn("wandb is not installed (pip install wandb); no W&B output")
            return
        try:
            self.run = _start_offline_run(wandb, dir, project, name, config)
            self.run_dir = Path(self.run.settings.sync_dir)
        except Exception as exc:
            _warn(f"W&B could not start in {dir} ({_why(exc)}); no W&B output")

    @property
    def active(self) -> bool:
        return self.run is not None

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        if self.run is not None:
            self.run.log(dict(values), step=step)

    def close(self, status: str = "completed") -> None:
        run, self.run = self.run, None
        if run is None:
            return
        import wandb

        try:
            run.finish(exit_code=1 if status == "failed" else 0)
        finally:
            _OFFLINE.release(wandb)
        if self.run_dir is not None and not _wait_until_written(self.run_dir, WANDB_FLUSH_WAIT_S):
            _warn(f"the W&B run in {self.run_dir} was not complete on disk after closing")


_WANDB_SETTINGS: dict[str, Any] = {
    "mode": "offline",
    "silent": True,
    "quiet": True,
    "console": "off",  # leave the user's stdout/stderr alone
    "x_disable_stats": True,  # cloudtrain's monitor samples the machine already
    "x_disable_meta": True,
    "x_disable_machine_info": True,
    "disable_git": True,
    "disable_code": True,
    "save_code": False,
    "init_timeout": WANDB_INIT_TIMEOUT_S,
    "finish_timeout": WANDB_FINISH_TIMEOUT_S,
}
"""Settings of every W&B run; names this wandb version does not know are left out."""


def _known_settings(wandb: Any, wanted: Mapping[str, Any]) -> dict[str, Any]:
    fields = getattr(wandb.Settings, "model_fields", None)
    return dict(wanted) if fields is None else {k: v for k, v in wanted.items() if k in fields}


def _start_offline_run(
    wandb: Any,
    dir: str | Path,
    project: str,
    name: str | None,
    config: Mapping[str, Any] | None,
) -> Any:
    root = Path(dir).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    _OFFLINE.acquire(wandb)
    try:
        return wandb.init(
            project=project,
            name=name,
            dir=str(root),
            config=dict(config or {}),
            mode="offline",
            reinit="create_new",
            settings=wandb.Settings(**_known_settings(wandb, _WANDB_SETTINGS)),
        )
    except BaseException:
        _OFFLINE.release(wandb)
        raise


class _ProcessOffline:
    """Keeps wandb's process-wide mode offline while any WandbSink is open.

    wandb (0.31) sends client analytics by its process-wide settings, not the run's, so
    an offline run alone still contacts the W&B server. The first open sink switches the
    process-wide mode to offline (through `wandb.setup`, not the environment); the last
    to close puts back what was there, so the user's own wandb use is left as it was.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._previous: str | None = None

    def acquire(self, wandb: Any) -> None:
        with self._lock:
            if self._holders == 0:
                previous = wandb.setup().settings.mode
                if previous != "offline":
                    wandb.setup(settings=wandb.Settings(mode="offline"))
                self._previous = previous
            self._holders += 1

    def release(self, wandb: Any) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0 and self._previous not in (None, "offline"):
                wandb.setup(settings=wandb.Settings(mode=self._previous))
                self._previous = None


_OFFLINE = _ProcessOffline()


@dataclass(frozen=True)
class OfflineWandbRun:
    """What an offline W&B run folder holds, read from its `run-<id>.wandb` file without
    wandb's service or the network. Keys are as logged (`train/loss`); wandb adds its
    own (`_step`, `_runtime`, `_timestamp`)."""

    run_id: str
    name: str
    project: str
    config: dict[str, Any]
    history: dict[int, dict[str, Any]]
    """Step -> key -> value, one row per logged step."""
    summary: dict[str, Any]
    """The last value of every key (what W&B shows as the run's summary)."""
    exit_code: int | None
    """0: finished, non-zero: failed; None: the end is not (yet) on disk."""


_LOG_BLOCK_BYTES = 32 * 1024
_LOG_HEADER_BYTES = 7  # the file's ":W&B" header, and each chunk's crc32/length/type
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _log_payloads(data: bytes) -> Iterable[bytes]:
    """The records of a `.wandb` file: a leveldb-style log of 32 KiB blocks after a
    7-byte header; a record is one FULL chunk or FIRST, MIDDLE..., LAST."""
    pos, pending = _LOG_HEADER_BYTES, b""
    while pos + _LOG_HEADER_BYTES <= len(data):
        room = _LOG_BLOCK_BYTES - pos % _LOG_BLOCK_BYTES
        if room < _LOG_HEADER_BYTES:  # too short for a chunk header: padding
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _LOG_HEADER_BYTES])
        start = pos + _LOG_HEADER_BYTES
        chunk, pos = data[start : start + length], start + length
        pending = chunk if kind in (_FULL, _FIRST) else pending + chunk
        if kind in (_FULL, _LAST) and pos <= len(data):
            yield pending


def _items(items) -> dict[str, Any]:
    return {i.key or ".".join(i.nested_key): json.loads(i.value_json) for i in items}


def read_offline_wandb_run(run_dir: str | Path) -> OfflineWandbRun:
    """Read an offline run folder (`<dir>/wandb/offline-run-*`, `WandbSink.run_dir`)."""
    from wandb.proto import wandb_internal_pb2

    paths = sorted(Path(run_dir).glob("run-*.wandb"))
    data = paths[0].read_bytes() if len(paths) == 1 else b""
    if not data.startswith(b":W&B"):
        raise DataError(run_dir, "not an offline W&B run folder (no run-*.wandb file)")
    run, history, summary, exit_code = None, {}, {}, None
    for payload in _log_payloads(data):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
        elif kind == "history":
            history[record.history.step.num] = _items(record.history.item)
        elif kind == "summary":
            summary.update(_items(record.summary.update))
        elif kind == "exit":
            exit_code = record.exit.exit_code
    return OfflineWandbRun(
        run_id=run.run_id if run else "",
        name=run.display_name if run else "",
        project=run.project if run else "",
        config=_items(run.config.update) if run else {},
        history=history,
        summary=summary,
        exit_code=exit_code,
    )


def _wait_until_written(run_dir: Path, timeout_s: float) -> bool:
    """True once the run's end is in its `.wandb` file, or when there is no such file or
    it cannot be read (a layout this reader does not know must not hold up the end of
    training); False when `timeout_s` passed first."""
    if not any(run_dir.glob("run-*.wandb")):
        return True
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if read_offline_wandb_run(run_dir).exit_code is not None:
                return True
        except DataError:
            pass  # the file's header is not written yet
        except Exception:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


class MetricSinks:
    """Fan-out: one object the trainer calls; each sink gets every scalar that is not
    None. A sink that raises is reported once on stderr and dropped; the others go on."""

    def __init__(self, sinks: Iterable[MetricSink] = ()) -> None:
        self.sinks: list[MetricSink] = [s for s in sinks if getattr(s, "active", True)]

    def __len__(self) -> int:
        return len(self.sinks)

    def scalars(self, step: int, values: Mapping[str, float | None]) -> None:
        if not self.sinks:
            return
        clean = {k: float(v) for k, v in values.items() if v is not None}
        for sink in list(self.sinks):
            try:
                sink.scalars(step, clean)
            except Exception as exc:
                self.sinks.remove(sink)
                _warn(
                    f"{sink.name} failed at step {step} ({_why(exc)}); no more {sink.name} output"
                )
                _close_quietly(sink, "failed")

    def close(self, status: str = "completed") -> None:
        """Close every sink (safe to call twice)."""
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            try:
                sink.close(status)
            except Exception as exc:
                _warn(f"{sink.name} failed to close ({_why(exc)}); its last values may be missing")


def _close_quietly(sink: MetricSink, status: str) -> None:
    with contextlib.suppress(Exception):  # already reported: the sink failed to write
        sink.close(status)


def open_sinks(
    *,
    tensorboard_dir: str | Path | None,
    wandb_dir: str | Path | None,
    wandb_project: str = DEFAULT_WANDB_PROJECT,
    run_name: str | None = None,
    run_config: Mapping[str, Any] | None = None,
    enabled: bool = True,
) -> MetricSinks:
    """The sinks a run asked for: TensorBoard when `tensorboard_dir` is set, W&B (offline)
    when `wandb_dir` is set; an empty fan-out when `enabled` is False (not rank 0)."""
    sinks: list[MetricSink] = []
    if enabled and tensorboard_dir is not None:
        sinks.append(TensorBoardSink(tensorboard_dir))
    if enabled and wandb_dir is not None:
        sinks.append(WandbSink(wandb_dir, project=wandb_project, name=run_name, config=run_config))
    return MetricSinks(sinks)
