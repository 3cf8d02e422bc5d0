"""`plan --model FILE.py:FUNC`: import the user's file, build the model, trace it.

`FUNC()` returns `(model, batch)` or `(model, batch, loss_fn)`; `loss_fn(model, batch)`
returns a scalar. The batch may have any number of samples. Every failure is one line
naming the file and the problem (a UserError: exit 2).
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cloudtrain.errors import UserError, first_line


@dataclass(frozen=True)
class ModelSpec:
    path: Path
    function: str

    @property
    def label(self) -> str:
        return f"{self.path}:{self.function}"


def parse_model_spec(text: str) -> ModelSpec:
    """'models.py:build' -> ModelSpec; a missing ':FUNC' or file is a UserError."""
    path_text, sep, function = text.rpartition(":")
    if not sep or not path_text or not function.isidentifier():
        raise UserError(f"--model {text!r}: give FILE.py:FUNCTION, e.g. models.py:build")
    path = Path(path_text)
    if not path.is_file():
        raise UserError(f"--model {text!r}: {path} is not a file")
    return ModelSpec(path, function)


def _import(spec: ModelSpec) -> Any:
    name = f"cloudtrain_user_model_{abs(hash(str(spec.path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(name, spec.path)
    if module_spec is None or module_spec.loader is None:
        raise UserError(f"{spec.path}: cannot be imported as a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, str(spec.path.resolve().parent))
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:  # the user's code: any error is theirs to see
        raise UserError(f"{spec.path}: import failed: {first_line(error)}") from None
    finally:
        sys.path.pop(0)
    return module


def build_model(spec: ModelSpec) -> tuple[Any, Any, Any]:
    """(model, batch, loss_fn or None) from the user's function."""
    module = _import(spec)
    function = getattr(module, spec.function, None)
    if not callable(function):
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        hint = f" (callables there: {', '.join(found[:8])})" if found else ""
        raise UserError(f"{spec.path}: no function '{spec.function}'{hint}")
    try:
        built = function()
    except Exception as error:
        raise UserError(f"{spec.label}() failed: {first_line(error)}") from None
    if not isinstance(built, tuple) or len(built) not in (2, 3):
        raise UserError(
            f"{spec.label}() must return (model, batch) or (model, batch, loss_fn), "
            f"not {type(built).__name__}"
        )
    model, batch, *rest = built
    loss_fn = rest[0] if rest else None
    if not hasattr(model, "parameters") or not callable(model):
        raise UserError(f"{spec.label}(): the first value is not a torch.nn.Module")
    if loss_fn is not None and not callable(loss_fn):
        raise UserError(f"{spec.label}(): loss_fn is not callable")
    return model, batch, loss_fn


def profile_from_file(
    spec: ModelSpec, *, precision: str, channels_last: bool
) -> tuple[Any, int | None]:
    """(ModelProfile, samples in the example batch) of the user's model (traced, or from
    the profile cache)."""
    from cloudtrain.profiling import profile_model

    model, batch, loss_fn = build_model(spec)
    try:
        profile = profile_model(
            model, batch, loss_fn, precision=precision, channels_last=channels_last,
            name=spec.function if spec.function not in ("build", "main") else None,
        )  # fmt: skip
        return profile, batch_size(batch)
    except UserError as error:
        raise UserError(f"{spec.label}: {error}") from None
    except Exception as error:
        raise UserError(
            f"{spec.label}: the model could not be traced: {first_line(error)}"
        ) from None


def batch_size(batch: Any) -> int | None:
    """Samples in a batch: the leading dimension of its first tensor."""
    if hasattr(batch, "shape") and len(batch.shape) > 0:
        return int(batch.shape[0])
    values = list(batch.values()) if isinstance(batch, dict) else batch
    if isinstance(values, (list, tuple)):
        for value in values:
            size = batch_size(value)
            if size is not None:
                return size
    return None
