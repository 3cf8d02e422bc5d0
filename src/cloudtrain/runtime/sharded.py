"""Sharded checkpoints through torch.distributed.checkpoint (DCP): under FSDP every rank
writes its own shards of the model and optimizer; nothing is gathered on one rank.

Layout inside a checkpoint's step directory (see checkpoint.py):

    sharded/.metadata         DCP's index of every tensor chunk (written by rank 0)
    sharded/__R_0.distcp      rank R's shards

Loading keeps the "never run foreign code" promise of checkpoint.py. In torch 2.13,
DCP's `FileSystemReader.read_data` reads tensors with `torch.load(weights_only=True)`,
but `read_metadata` unpickles `.metadata` with plain `pickle.load`, and
`DefaultLoadPlanner.load_bytes` reads non-tensor values with `weights_only=False`. Here
`.metadata` is read by an unpickler that only builds DCP's metadata classes and torch's
Size/dtype/layout/memory_format, and non-tensor values with `weights_only=True`.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import (
    DefaultLoadPlanner,
    FileSystemReader,
    FileSystemWriter,
)
from torch.distributed.checkpoint import load as dcp_load
from torch.distributed.checkpoint import save as dcp_save

from cloudtrain.runtime.checkpoint import CheckpointError

_TORCH_VALUE_TYPES = (torch.dtype, torch.layout, torch.memory_format)


class UnsafeMetadataError(CheckpointError):
    """A DCP `.metadata` file names a class that metadata never contains."""


_ALLOWED_GLOBALS = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),  # a layout by name, e.g. "torch.strided"
    ("torch", "Size"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}
"""Everything a DCP .metadata written by torch 2.13 refers to, besides the classes of
torch.distributed.checkpoint.metadata and torch's dtypes and memory formats."""


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only DCP's metadata dataclasses and torch's plain value types."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if module == "torch.distributed.checkpoint.metadata":
            found = super().find_class(module, name)
            if isinstance(found, type):
                return found
        if module == "torch" and isinstance(getattr(torch, name, None), _TORCH_VALUE_TYPES):
            return getattr(torch, name)
        raise UnsafeMetadataError(f"DCP metadata refers to {module}.{name}; refused")


class SafeReader(FileSystemReader):
    """FileSystemReader whose `.metadata` is read by the restricted unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any):
        from torch.distributed.checkpoint.metadata import StorageMeta

        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = _MetadataUnpickler(stream).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner that reads non-tensor values with weights_only=True."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._traverse import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


@contextlib.contextmanager
def _single_process_is_intended():
    """Silence DCP's "assuming the intent is to ... in a single process": it is."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*intent is to .* in a single process")
        yield


def save_sharded(state_dict: dict[str, Any], directory: Path) -> None:
    """Every rank writes its shards of `state_dict` (DTensors: the local shard) into
    `directory`; a collective. Single-threaded writes, fsynced by DCP."""
    import torch.distributed as dist

    writer = FileSystemWriter(str(directory), single_file_per_rank=True, thread_count=1)
    with _single_process_is_intended():
        dcp_save(state_dict, storage_writer=writer, no_dist=not dist.is_initialized())


def load_sharded(state_dict: dict[str, Any], directory: Path) -> None:
    """Fill `state_dict` in place (each rank reads what its shards need); a collective
    when a process group is up, a plain read otherwise."""
    import torch.distributed as dist

    with _single_process_is_intended():
        dcp_load(
            state_dict,
            storage_reader=SafeReader(str(directory)),
            planner=SafeLoadPlanner(),
            no_dist=not dist.is_initialized(),
        )


def check_metadata(directory: Path) -> None:
    """Read `.metadata` with the restricted unpickler; UnsafeMetadataError (a
    CheckpointError) when it refers to anything but metadata."""
    try:
        SafeReader(str(directory)).read_metadata()
    except UnsafeMetadataError:
        raise
    except Exception as error:
        raise CheckpointError(f"{directory}: unreadable DCP metadata ({error})") from error


def read_tensor_shapes(directory: Path) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """Global shape and dtype of every tensor in a sharded checkpoint, by flattened key
    (e.g. 'model.body.0.weight')."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = SafeReader(str(directory)).read_metadata()
    return {
        key: (meta.size, meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
        if isinstance(meta, TensorStorageMetadata)
    }


def load_full_model(directory: Path) -> dict[str, torch.Tensor]:
    """The whole model state_dict from a sharded checkpoint, in this one process (no
    process group needed), e.g. for export."""
    shapes = read_tensor_shapes(directory)
    model = {
        key.removeprefix("model."): torch.empty(size, dtype=dtype)
        for key, (size, dtype) in shapes.items()
        if key.startswith("model.")
    }
    state = {"model": model}
    with _single_process_is_intended():
        dcp_load(
            state,
            storage_reader=SafeReader(str(directory)),
            planner=SafeLoadPlanner(),
            no_dist=True,
        )
    return state["model"]
