"""Export a trained model to ONNX and check it in onnxruntime against PyTorch.

A checkpoint holds weights, not code, so the model is rebuilt by a factory the user
names (`path/to/file.py:build_model` or `package.module:build_model`, called with no
arguments), then loaded with the checkpoint's weights. CHECKPOINT is a Trainer
checkpoint directory (its newest valid checkpoint), one `step_*` directory in it, or a
`.pt` file holding a state dict (or a dict with a "model" state dict). Everything is
loaded with `weights_only=True`.

Needs the optional packages onnx and onnxruntime (`pip install "cloudtrain[onnx]"`
or `pip install onnx onnxruntime`). With onnxscript installed the torch.export-based
exporter is used, otherwise the TorchScript-based one.
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cloudtrain.errors import CloudtrainError, UserError
from cloudtrain.runtime.checkpoint import MANIFEST, CheckpointManager, load_checkpoint

INPUT_DTYPES = {"float32": torch.float32, "int64": torch.int64}


@dataclass(frozen=True)
class OnnxExport:
    """Result of an export and its check."""

    path: str
    checkpoint: str
    step: int | None
    """Training step of the checkpoint; None for a plain state-dict file."""
    input_shape: tuple[int, ...]
    exporter: str
    """'torch.export' (dynamo) or 'torchscript'."""
    opset: int
    max_abs_diff: float
    """Largest |onnxruntime - PyTorch| over the check input."""
    atol: float
    rtol: float


def _require(module: str) -> Any:
    if importlib.util.find_spec(module) is None:
        raise UserError(
            f"{module} is not installed; `pip install onnx onnxruntime` (or cloudtrain[onnx])"
        )
    return importlib.import_module(module)


def load_factory(spec: str) -> Any:
    """The callable named by 'file.py:name' or 'package.module:name'."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise UserError(f"--model '{spec}' must look like path/to/model.py:build_model")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise UserError(f"--model: file {path} not found")
        module_spec = importlib.util.spec_from_file_location(f"_ct_model_{path.stem}", path)
        if module_spec is None or module_spec.loader is None:
            raise UserError(f"--model: cannot import {path}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as error:
            raise UserError(f"--model: cannot import module '{target}': {error}") from error
    factory = getattr(module, name, None)
    if not callable(factory):
        raise UserError(f"--model: '{name}' is not a callable in {target}")
    return factory


def load_model_state(checkpoint: str | Path) -> tuple[dict[str, torch.Tensor], int | None]:
    """(model state dict, step or None) from a checkpoint dir, step dir or .pt file."""
    path = Path(checkpoint)
    if path.is_file():
        state = torch.load(path, map_location="cpu", weights_only=True)
        step = None
    elif (path / MANIFEST).is_file():
        loaded = load_checkpoint(path)
        state, step = loaded.model_state(), loaded.step
    elif path.is_dir():
        loaded = CheckpointManager(path).load_latest()
        if loaded is None:
            raise UserError(f"no checkpoint in {path}")
        state, step = loaded.model_state(), loaded.step
    else:
        raise UserError(f"checkpoint {path} not found")
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    return _strip_prefixes(state), step


def _strip_prefixes(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Drop the wrappers' key prefixes: torch.compile's `_orig_mod.`, DDP's `module.`."""
    out = {}
    for key, value in state.items():
        for prefix in ("_orig_mod.", "module."):
            while key.startswith(prefix):
                key = key[len(prefix) :]
        out[key] = value
    return out


def _example(shape: tuple[int, ...], dtype: str, high: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    if dtype == "int64":
        return torch.randint(0, high, shape, generator=generator)
    return torch.randn(shape, generator=generator)


def _export(model: torch.nn.Module, example: torch.Tensor, out: Path, opset: int) -> str:
    dynamic = {"input": {0: "batch"}}
    if importlib.util.find_spec("onnxscript") is not None:
        torch.onnx.export(
            model, (example,), str(out), dynamo=True, opset_version=opset,
            input_names=["input"], output_names=["output"],
            dynamic_shapes=({0: torch.export.Dim("batch")},),
        )  # fmt: skip
        return "torch.export"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model, (example,), str(out), dynamo=False, opset_version=opset,
            input_names=["input"], output_names=["output"], dynamic_axes=dynamic,
        )  # fmt: skip
    return "torchscript"


def export_onnx(
    checkpoint: str | Path,
    model_factory: str,
    input_shape: tuple[int, ...],
    out: str | Path,
    *,
    input_dtype: str = "float32",
    input_high: int = 1000,
    opset: int = 17,
    atol: float = 1e-4,
    rtol: float = 1e-3,
) -> OnnxExport:
    """Export the checkpoint's model to `out` and check it against PyTorch on a fresh input.

    `input_high` bounds integer inputs (e.g. the vocabulary size) when `input_dtype` is
    int64. Raises CloudtrainError when onnxruntime's output differs beyond atol/rtol.
    """
    onnx = _require("onnx")
    ort = _require("onnxruntime")
    if input_dtype not in INPUT_DTYPES:
        raise UserError(f"--input-dtype must be one of {', '.join(INPUT_DTYPES)}")
    state, step = load_model_state(checkpoint)
    model = load_factory(model_factory)()
    if not isinstance(model, torch.nn.Module):
        raise UserError(f"--model {model_factory} returned {type(model).__name__}, not a Module")
    model.load_state_dict(state)
    model.eval()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    exporter = _export(model, _example(input_shape, input_dtype, input_high, 0), out, opset)
    onnx.checker.check_model(str(out))
    check_shape = (input_shape[0] + 1, *input_shape[1:])  # a batch size not traced with
    check = _example(check_shape, input_dtype, input_high, 1)
    with torch.no_grad():
        expected = model(check).numpy()
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: check.numpy()})[0]
    diff = float(abs(got - expected).max()) if expected.size else 0.0
    if (
        got.shape != expected.shape
        or not (abs(got - expected) <= atol + rtol * abs(expected)).all()
    ):
        raise CloudtrainError(
            f"ONNX output differs from PyTorch (max |diff| {diff:.3g} > atol {atol:g}); "
            "the model may use an op the exporter does not translate faithfully"
        )
    return OnnxExport(
        str(out), str(checkpoint), step, tuple(input_shape), exporter, opset, diff, atol, rtol
    )
