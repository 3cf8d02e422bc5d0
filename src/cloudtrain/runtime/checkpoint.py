"""Checkpoints that lose nothing and never run foreign code.

Layout of `checkpoint_dir`:

    step_000000120/state.pt      model, optimizer, scheduler, scaler, trainer state (rank 0)
    step_000000120/rank_0.pt     this rank's RNG states and data position (one per rank)
    step_000000120/manifest.json sha256 of every file, step, world size
    step_000000120/sharded/      FSDP only: each rank's model/optimizer shards through
                                 torch.distributed.checkpoint (see sharded.py); state.pt
                                 then holds the rest (trainer state, scheduler, scaler)
    latest                       name of the newest complete checkpoint, written last

The manifest checksums every file, the sharded ones included: rank 0 hashes each
rank's `.distcp` file and DCP's `.metadata` after every rank has written (they share
the directory), so a corrupt or missing shard makes the checkpoint fall back like any
other damage.

A checkpoint is written into `.tmp-step_...`, each file fsynced, the directory
fsynced, renamed to its final name, the parent fsynced, and only then `latest`
is replaced (same dance). Loading verifies the checksums and reads with
`torch.load(weights_only=True)`: tensors and plain containers only, so a pickle
that smuggles in code is refused before anything runs. A partial or corrupt
newest checkpoint is skipped with a warning in favour of the one before.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cloudtrain.errors import CloudtrainError

FORMAT_VERSION = 1
STATE_FILE = "state.pt"
MANIFEST = "manifest.json"
LATEST = "latest"
SHARDED_DIR = "sharded"


class CheckpointError(CloudtrainError):
    """No checkpoint in the directory could be loaded safely."""


def young_interval_s(save_s: float, mtbf_s: float) -> float:
    """Young (1974): the checkpoint interval that minimises expected lost work,
    T = sqrt(2 * C * MTBF), C the time one save takes."""
    return math.sqrt(2.0 * max(save_s, 1e-3) * mtbf_s)


# --- RNG --------------------------------------------------------------------------


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and every CUDA device; in a DataLoader worker
    forked from a CUDA process torch leaves CUDA alone)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def numpy_rng_state(rng: Any = np.random) -> dict[str, Any]:
    """A NumPy MT19937 state (the global one, or a RandomState's) as a tensor and plain
    numbers, so it loads with weights_only=True."""
    state = rng.get_state(legacy=False)
    return {
        "key": torch.from_numpy(state["state"]["key"].astype(np.int64)),
        "pos": int(state["state"]["pos"]),
        "has_gauss": int(state["has_gauss"]),
        "gauss": float(state["gauss"]),
    }


def set_numpy_rng_state(saved: dict[str, Any], rng: Any = np.random) -> None:
    """Put back what `numpy_rng_state` returned."""
    rng.set_state(
        {
            "bit_generator": "MT19937",
            "state": {"key": saved["key"].numpy().astype(np.uint32), "pos": saved["pos"]},
            "has_gauss": saved["has_gauss"],
            "gauss": saved["gauss"],
        }
    )


def capture_rng(device: torch.device) -> dict[str, Any]:
    """Python, NumPy, torch CPU and (this rank's) CUDA generator states, as tensors
    and plain values so they load with weights_only=True."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": numpy_rng_state(),
        "torch": torch.get_rng_state(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    set_numpy_rng_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


# --- files ------------------------------------------------------------------------


class _HashingWriter:
    def __init__(self, f) -> None:
        self.f, self.sha = f, hashlib.sha256()

    def write(self, data) -> int:
        self.sha.update(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def _save_file(obj: Any, path: Path) -> str:
    """torch.save + fsync; returns the sha256 of the bytes written."""
    with open(path, "wb") as f:
        writer = _HashingWriter(f)
        torch.save(obj, writer)
        f.flush()
        os.fsync(f.fileno())
    return writer.sha.hexdigest()


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def step_dir_name(step: int) -> str:
    return f"step_{step:09d}"


def snapshot_to_cpu(obj: Any) -> Any:
    """A deep copy with every tensor cloned to CPU, safe to write while training goes on."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: snapshot_to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(snapshot_to_cpu(v) for v in obj)
    return obj


@dataclass
class LoadedCheckpoint:
    step: int
    path: Path
    state: dict[str, Any]
    """What rank 0 saved (model, optimizer, ... trainer state)."""
    rank_state: dict[str, Any] | None
    """This rank's RNG and data position; None when the checkpoint had fewer ranks."""
    world_size: int
    sharded_path: Path | None = None
    """Directory of the model/optimizer shards (FSDP checkpoints, see sharded.py); None:
    they are in `state`."""

    def model_state(self) -> dict[str, torch.Tensor]:
        """The whole model state_dict on CPU (read from the shards, in this one process,
        for a sharded checkpoint)."""
        if self.sharded_path is not None:
            from cloudtrain.runtime.sharded import load_full_model

            return load_full_model(self.sharded_path)
        return self.state["model"]


class CheckpointManager:
    """Saves and finds checkpoints in one directory, for one rank of `world` ranks."""

    def __init__(
        self,
        directory: str | Path,
        *,
        rank: int = 0,
        world: int = 1,
        keep: int = 3,
        barrier: Callable[[], None] = lambda: None,
    ) -> None:
        self.dir = Path(directory)
        self.rank, self.world, self.keep, self.barrier = rank, world, keep, barrier
        self.last_save_s: float | None = None
        """Seconds the newest save blocked training (async: the snapshot only)."""
        self.last_write_s: float | None = None
        """Seconds the newest save took to reach disk, background part included."""
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    # ---- save ----
    def save(
        self,
        step: int,
        state: Callable[[], dict[str, Any]],
        rank_state: dict[str, Any],
        *,
        async_write: bool = False,
        sharded: Callable[[Path], None] | None = None,
    ) -> Path:
        """Write checkpoint `step`. `state` is called on every rank (gathering a sharded
        model is a collective); rank 0 writes what it returns. `sharded(directory)`, when
        given, is called on every rank to write its shards there (a collective). Returns
        the final directory."""
        t0 = time.perf_counter()
        self.wait()
        final = self.dir / step_dir_name(step)
        tmp = self.dir / f".tmp-{final.name}"
        if self.rank == 0:
            self.dir.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        self.barrier()
        _save_file(rank_state, tmp / f"rank_{self.rank}.pt")
        if sharded is not None:
            sharded(tmp / SHARDED_DIR)
        full = state()  # every rank: gathering a sharded state is collective
        self.barrier()  # every rank file is on disk
        if self.rank == 0:
            if async_write:
                full = snapshot_to_cpu(full)
                self._thread = threading.Thread(
                    target=self._finish_guarded, args=(step, full, tmp, final, t0), daemon=True
                )
                self._thread.start()
            else:
                self._finish(step, full, tmp, final, t0)
        self.last_save_s = time.perf_counter() - t0
        if not async_write:
            self.barrier()  # nobody moves on (or exits) before the checkpoint is final
        return final

    def _finish_guarded(self, *args) -> None:
        try:
            self._finish(*args)
        except BaseException as error:  # surfaced by wait()
            self._error = error

    def _finish(self, step: int, full: dict, tmp: Path, final: Path, t0: float) -> None:
        files = {STATE_FILE: _save_file(full, tmp / STATE_FILE)}
        for r in range(self.world):
            files[f"rank_{r}.pt"] = sha256_file(tmp / f"rank_{r}.pt")
        shards = tmp / SHARDED_DIR
        for file in sorted(shards.rglob("*")) if shards.is_dir() else ():
            if file.is_file():
                files[file.relative_to(tmp).as_posix()] = sha256_file(file)
        manifest = {
            "format": FORMAT_VERSION,
            "step": step,
            "world_size": self.world,
            "files": files,
            "time_unix_s": time.time(),
            "sharded": SHARDED_DIR if shards.is_dir() else None,
        }
        _write_text_atomic(tmp / MANIFEST, json.dumps(manifest, indent=1))
        _fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(self.dir)
        _write_text_atomic(self.dir / LATEST, final.name + "\n")
        self._prune()
        self.last_write_s = time.perf_counter() - t0

    def wait(self) -> None:
        """Block until a background write is on disk; re-raise its error if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(f"background checkpoint write failed: {error}") from error

    def _prune(self) -> None:
        for old in self.complete_dirs()[self.keep :]:
            shutil.rmtree(old, ignore_errors=True)

    # ---- find and load ----
    def complete_dirs(self) -> list[Path]:
        """Step directories, newest first (complete or not: verification comes later)."""
        if not self.dir.is_dir():
            return []
        found = [p for p in self.dir.glob("step_*") if p.is_dir()]
        return sorted(found, key=lambda p: p.name, reverse=True)

    def candidates(self) -> list[Path]:
        """Where to look, in order: the `latest` pointer, then every step dir newest first."""
        order: list[Path] = []
        pointer = self.dir / LATEST
        if pointer.is_file():
            name = pointer.read_text().strip()
            if name.startswith("step_") and "/" not in name:
                order.append(self.dir / name)
        for path in self.complete_dirs():
            if path not in order:
                order.append(path)
        return order

    def verify(self, path: Path) -> dict[str, Any]:
        """The manifest of a complete checkpoint whose files match their checksums."""
        manifest_path = path / MANIFEST
        if not manifest_path.is_file():
            raise CheckpointError(f"{path}: no {MANIFEST} (the save did not finish)")
        manifest = json.loads(manifest_path.read_text())
        for name, digest in manifest["files"].items():
            if name.startswith("/") or ".." in name.split("/"):
                raise CheckpointError(f"{path}: manifest names a file outside it ({name})")
            file = path / name
            if not file.is_file() or sha256_file(file) != digest:
                raise CheckpointError(f"{file}: checksum mismatch (corrupt or partial)")
        return manifest

    def load_path(self, path: str | Path) -> LoadedCheckpoint:
        """One checkpoint directory (`step_*`), verified against its manifest and loaded
        with weights_only. Raises CheckpointError when it is partial, corrupt or unsafe."""
        path = Path(path)
        try:
            return self._load_one(path, self.verify(path))
        except (OSError, ValueError, KeyError) as error:
            raise CheckpointError(f"{path}: cannot load ({error})") from error

    def _load_one(self, path: Path, manifest: dict[str, Any]) -> LoadedCheckpoint:
        state = _safe_load(path / STATE_FILE)
        rank_file = path / f"rank_{self.rank}.pt"
        rank_state = _safe_load(rank_file) if rank_file.is_file() else None
        sharded = manifest.get("sharded")
        if sharded:
            from cloudtrain.runtime.sharded import check_metadata

            check_metadata(path / SHARDED_DIR)  # refuse a foreign pickle before any use
        return LoadedCheckpoint(
            int(manifest["step"]),
            path,
            state,
            rank_state,
            int(manifest["world_size"]),
            sharded_path=path / SHARDED_DIR if sharded else None,
        )

    def load_latest(self, agree: Callable[[int], int] = lambda i: i) -> LoadedCheckpoint | None:
        """The newest checkpoint that verifies and loads; None when the directory has none.
        Rank 0 chooses; `agree(i)` hands its choice (a candidate index) to every rank."""
        candidates = self.candidates()
        problems: list[str] = []
        index, loaded = -1, None
        if self.rank == 0:
            for i, path in enumerate(candidates):
                try:
                    loaded = self._load_one(path, self.verify(path))
                    index = i
                    break
                except (CheckpointError, OSError, ValueError, KeyError) as error:
                    problems.append(str(error))
                    warnings.warn(f"skipping checkpoint {path.name}: {error}", stacklevel=2)
        index = agree(index)
        if index < 0:
            if candidates:
                raise CheckpointError(
                    f"no loadable checkpoint in {self.dir} ({'; '.join(problems)}); "
                    "move the directory away to start fresh"
                )
            return None
        if loaded is None:
            path = candidates[index]
            loaded = self._load_one(path, json.loads((path / MANIFEST).read_text()))
        return loaded


def _safe_load(path: Path) -> Any:
    """torch.load restricted to tensors and plain containers (no arbitrary objects)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"{path}: refused to load ({first})") from error


def load_checkpoint(path: str | Path) -> LoadedCheckpoint:
    """One checkpoint directory (`.../step_000000120`), verified and loaded on CPU as
    rank 0 sees it (model, optimizer, trainer state; rank 0's RNG and data position)."""
    path = Path(path)
    return CheckpointManager(path.parent).load_path(path)
