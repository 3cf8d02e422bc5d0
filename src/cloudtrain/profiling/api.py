"""`profile_model`: trace one training step of a model into a `ModelProfile`.

The step (forward, loss, backward) is traced at micro-batch 1 and 2, cut from the
user's batch (repeated when it holds fewer samples); the two op sequences are paired
and each quantity becomes the line through both points (`Affine.through`), so weights
(fixed) and activations (per sample) are told apart. PyTorch skips some copies when a
dimension has size 1, so where batch 1 runs other ops than batch 2, batch 3 is traced
and batches 2 and 3 are paired (`traced_batches` says which). Where those differ too
(a data-dependent model), the batch-3 trace is scaled proportionally (`Affine(0, v/3)`)
and a note says so.

Where it runs, first that works (or `device=`):
1. 'fake-cuda': `FakeTensorMode` with fake CUDA tensors. It needs a CUDA build of torch
   (a CPU-only build aborts the process on the first CUDA backward, so it is skipped
   there; on a CUDA build without a GPU a subprocess checks it once per process).
2. 'meta': the model copied with its parameters and buffers on the meta device (no
   data, no compute; a model built on meta is used the same way).
3. 'cpu': a real step on copies, at batch 1 and 2 (models up to CPU_LIMIT_BYTES of
   parameters; a meta model gets random weights).
The caller's model is never touched: every path traces a copy.

Autocast ('bf16', 'fp16') and CUDA's fused attention are emulated on every path, with
CUDA's rules (see `cloudtrain.profiling.emulate`); 'fp32' and 'tf32' trace PyTorch's
defaults (the planner applies TF32 from the profile's precision).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from cloudtrain import paths
from cloudtrain.errors import UserError, first_line
from cloudtrain.plan.profile import PROFILE_VERSION, Affine, ModelProfile, OpRecord, merge_ops
from cloudtrain.profiling.emulate import CudaEmulation
from cloudtrain.profiling.tracer import RawOp, Recorder

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
DEVICES = ("auto", "fake-cuda", "meta", "cpu")
TRACER_VERSION = 1
"""Bumped when the tracer's output changes (part of the cache key)."""
CPU_LIMIT_BYTES = 4 << 30
"""Largest model (parameter bytes) the CPU fallback runs."""

TRACE_COUNT = 0
"""Steps traced by this process (profiles served from the cache trace none)."""

_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class _StepError(UserError):
    """A problem of the user's step that no other device would fix."""


# -- public -------------------------------------------------------------------------


def fingerprint_model(
    model: nn.Module,
    sample_shape: tuple[int, ...] = (),
    *,
    precision: str = "bf16",
    channels_last: bool = False,
) -> str:
    """16 hex digits of sha256 over the module types (in order), the parameters'
    names, shapes, dtypes and requires_grad, the buffers' names, shapes and dtypes, the
    sample shape, the precision and channels_last. Equal models give equal
    fingerprints in any process."""
    parts = {
        "modules": [f"{type(m).__module__}.{type(m).__qualname__}" for m in model.modules()],
        "parameters": [
            [name, list(p.shape), str(p.dtype), bool(p.requires_grad)]
            for name, p in model.named_parameters()
        ],
        "buffers": [[name, list(b.shape), str(b.dtype)] for name, b in model.named_buffers()],
        "sample_shape": [int(s) for s in sample_shape],
        "precision": precision,
        "channels_last": bool(channels_last),
    }
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def profile_model(
    model: nn.Module,
    batch: Any,
    loss_fn: Callable[[nn.Module, Any], Any] | None = None,
    *,
    precision: str = "bf16",
    channels_last: bool = False,
    name: str | None = None,
    device: str = "auto",
    cache: bool = True,
) -> ModelProfile:
    """Trace one training step of `model` on (a slice of) `batch` into a ModelProfile.

    `batch`: a tensor, or a tuple/list/dict of tensors (other values passed through)
    sharing a leading batch dimension. `loss_fn(model, batch)` returns the loss; without
    one the model is called as model(batch) / model(*batch) / model(**batch) and the loss
    is taken from its output (`.loss`, ['loss'], a tensor's mean, a tuple's first item).
    The optimizer step is not traced: the planner prices it from the parameters and
    the workload's optimizer.
    """
    model = getattr(model, "_orig_mod", model)  # a torch.compile wrapper: trace the module
    if not isinstance(model, nn.Module):
        raise UserError(f"profile_model needs a torch.nn.Module, not {type(model).__name__}")
    if precision not in PRECISIONS:
        raise UserError(f"precision must be one of {', '.join(PRECISIONS)}, not '{precision}'")
    if device not in DEVICES:
        raise UserError(f"device must be one of {', '.join(DEVICES)}, not '{device}'")
    batch = _plain_batch(batch)
    first = _check_batch(batch)
    sample_shape = tuple(int(s) for s in first.shape[1:])
    integer = not (first.is_floating_point() or first.is_complex() or first.dtype == torch.bool)
    tokens = int(first.shape[1]) if first.dim() == 2 and integer else None
    trainable, tensors, frozen = _parameter_counts(model)
    if tensors == 0:
        raise UserError(f"{type(model).__name__} has no trainable parameters to profile")
    fingerprint = fingerprint_model(
        model, sample_shape, precision=precision, channels_last=channels_last
    )
    display = name or type(model).__name__
    key = _cache_key(fingerprint, batch, loss_fn, device)
    if cache:
        cached = _load_cached(key)
        if cached is not None:
            return replace(cached, name=display, extra={**cached.extra, "traced": False})

    global TRACE_COUNT
    start = time.perf_counter()
    order = ("fake-cuda", "meta", "cpu") if device == "auto" else (device,)
    traced_on, result, attempts = _trace_first_working(
        order, display, model, batch, loss_fn, precision, channels_last
    )
    TRACE_COUNT += 1
    records, activation, batches, recorders, notes = result
    unknown = {op: n for rec in recorders for op, n in rec.unknown.items()}
    if unknown:
        notes.append(f"{len(unknown)} ops without a rule: {', '.join(sorted(unknown))}")
    errors = {op: why for rec in recorders for op, why in rec.formula_errors.items()}
    if errors:
        listed = "; ".join(f"{op} ({why})" for op, why in sorted(errors.items()))
        notes.append(f"{len(errors)} ops counted per element, their formula failed: {listed}")
    extra = {
        "traced": True,
        "trace_seconds": round(time.perf_counter() - start, 3),
        "attempts": attempts,
        "autocast": (
            "emulated with CUDA autocast's op lists" if precision in _AUTOCAST_DTYPES else "off"
        ),
        "dropped_view_ops": recorders[-1].dropped,
        "torch": torch.__version__,
        "tracer_version": TRACER_VERSION,
    }
    profile = ModelProfile(
        name=display,
        fingerprint=fingerprint,
        precision=precision,
        channels_last=bool(channels_last),
        parameters=trainable,
        parameter_tensors=tensors,
        frozen_parameters=frozen,
        ops=merge_ops(records),
        activation_bytes=activation,
        tokens_per_sample=tokens,
        sample_shape=sample_shape,
        traced_on=traced_on,
        traced_batches=batches,
        notes=tuple(notes),
        version=PROFILE_VERSION,
        extra=extra,
    )
    if cache:
        _store_cached(key, profile)
    return profile


def _trace_first_working(
    order: tuple[str, ...],
    display: str,
    model: nn.Module,
    batch: Any,
    loss_fn: Any,
    precision: str,
    channels_last: bool,
) -> tuple[str, tuple, dict[str, str]]:
    """(where, trace, what each place said) of the first place in `order` that traces
    the step; UserError when none does."""
    attempts: dict[str, str] = {}
    last_error: Exception | None = None
    for where in order:
        reason = _skip_reason(where, model)
        if reason is not None:
            attempts[where] = f"skipped: {reason}"
            continue
        try:
            result = _trace_paired(where, model, batch, loss_fn, precision, channels_last)
        except _StepError:
            raise
        except Exception as exc:
            attempts[where] = f"failed: {first_line(exc)}"
            last_error = exc
            continue
        attempts[where] = "ok"
        return where, result, attempts
    if last_error is None:
        raise UserError(f"{display}: no tracer could run ({_attempts_text(attempts)})")
    raise UserError(
        f"{display}: the training step failed on the batch "
        f"({_describe_batch(batch)}): {first_line(last_error)}"
    )


# -- batches ------------------------------------------------------------------------


def _plain_batch(batch: Any) -> Any:
    if isinstance(batch, Mapping) and not isinstance(batch, dict):
        return dict(batch)  # e.g. a Hugging Face BatchEncoding
    return batch


def _batch_tensors(batch: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(batch)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def _check_batch(batch: Any) -> torch.Tensor:
    tensors = [t for t in _batch_tensors(batch) if t.dim() > 0]
    if not tensors:
        raise UserError("the batch holds no tensor with a batch dimension")
    sizes = sorted({int(t.shape[0]) for t in tensors})
    if len(sizes) > 1:
        raise UserError(
            f"the batch's tensors must share their leading (batch) dimension, got {sizes}"
        )
    if sizes[0] == 0:
        raise UserError("the batch is empty (leading dimension 0)")
    return tensors[0]


def _resize(batch: Any, size: int) -> Any:
    def cut(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 0:
            return t
        if t.shape[0] >= size:
            return t[:size]
        times = -(-size // t.shape[0])
        return t.repeat(times, *([1] * (t.dim() - 1)))[:size]

    return tree_map(lambda v: cut(v) if isinstance(v, torch.Tensor) else v, batch)


def _describe_batch(batch: Any) -> str:
    shapes = ["x".join(str(s) for s in t.shape) or "scalar" for t in _batch_tensors(batch)]
    return ", ".join(shapes[:4]) + (", ..." if len(shapes) > 4 else "")


# -- devices ------------------------------------------------------------------------


_FAKE_CUDA_PROBE = """
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
with FakeTensorMode():
    w = torch.empty(8, 8, device="cuda", requires_grad=True)
    x = torch.empty(4, 8, device="cuda")
    (x @ w).sum().backward()
"""
_fake_cuda_state: str | None = None


def _fake_cuda_reason() -> str | None:
    """Why fake CUDA tensors cannot be traced here (None: they can)."""
    global _fake_cuda_state
    if _fake_cuda_state is None:
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            _fake_cuda_state = "this torch build has no CUDA support"
        elif torch.cuda.is_available():
            _fake_cuda_state = ""
        else:
            try:
                done = subprocess.run(
                    [sys.executable, "-c", _FAKE_CUDA_PROBE],
                    capture_output=True,
                    timeout=120,
                    check=False,
                )
                ok = done.returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
            _fake_cuda_state = "" if ok else "fake CUDA tensors do not work in this torch"
    return _fake_cuda_state or None


def _parameter_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _skip_reason(where: str, model: nn.Module) -> str | None:
    if where == "fake-cuda":
        return _fake_cuda_reason()
    if where == "cpu" and _parameter_bytes(model) > CPU_LIMIT_BYTES:
        return f"the parameters exceed {CPU_LIMIT_BYTES >> 30} GiB"
    return None


class _Place:
    """How tensors are made on one tracing path."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.fake_mode = None
        if where.startswith("fake-"):  # 'fake-cpu' only serves the tests of this path
            from torch._subclasses.fake_tensor import FakeTensorMode

            self.fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
            self.fake_device = where.removeprefix("fake-")

    def context(self) -> contextlib.AbstractContextManager:
        return self.fake_mode if self.fake_mode is not None else contextlib.nullcontext()

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        """A copy of `t` here: shape, strides and dtype; the values too on the CPU (random
        ones for a meta tensor)."""
        shape, stride = tuple(t.shape), t.stride()
        if self.where == "meta":
            return torch.empty_strided(shape, stride, dtype=t.dtype, device="meta")
        if self.fake_mode is not None:
            return torch.empty_strided(shape, stride, dtype=t.dtype, device=self.fake_device)
        if t.device.type != "meta":
            return t.detach().to("cpu").clone()
        made = torch.empty_strided(shape, stride, dtype=t.dtype, device="cpu")
        if made.is_floating_point():
            return made.normal_(0.0, 0.02)
        return made.zero_()


def _copy_model(model: nn.Module, place: _Place, channels_last: bool) -> nn.Module:
    """A deep copy of `model` whose parameters and buffers live on `place` (no data is
    copied for meta and fake tensors; shared parameters stay shared)."""
    memo: dict[int, Any] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        if id(param) not in memo:
            made = place.tensor(param)
            memo[id(param)] = nn.Parameter(made, requires_grad=param.requires_grad)
    for _, buffer in model.named_buffers(remove_duplicate=False):
        if buffer is not None and id(buffer) not in memo:
            memo[id(buffer)] = place.tensor(buffer)
    try:
        copied = copy.deepcopy(model, memo)
    except Exception as exc:
        raise RuntimeError(
            f"the model cannot be copied (copy.deepcopy: {first_line(exc)})"
        ) from exc
    if channels_last:
        copied = copied.to(memory_format=torch.channels_last)
    return copied.train()


def _place_batch(batch: Any, place: _Place, channels_last: bool) -> Any:
    def move(t: torch.Tensor) -> torch.Tensor:
        if channels_last and t.dim() == 4:
            t = t.contiguous(memory_format=torch.channels_last)
        return place.tensor(t)

    return tree_map(lambda v: move(v) if isinstance(v, torch.Tensor) else v, batch)


# -- the step -----------------------------------------------------------------------


def _loss_of(output: Any, *, reduce: bool) -> torch.Tensor:
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(output, Mapping):
        if isinstance(output.get("loss"), torch.Tensor):
            return output["loss"]
        values = [v for v in output.values() if v is not None]
        if values:
            return _loss_of(values[0], reduce=reduce)
    if isinstance(output, torch.Tensor):
        if reduce:
            return output.float().mean()
        return output
    if isinstance(output, (tuple, list)) and output:
        return _loss_of(output[0], reduce=reduce)
    raise _StepError(f"cannot find a loss in the step's output ({type(output).__name__})")


def _forward(model: nn.Module, batch: Any, loss_fn: Callable | None) -> torch.Tensor:
    if loss_fn is not None:
        loss = _loss_of(loss_fn(model, batch), reduce=False)
    else:
        if isinstance(batch, torch.Tensor):
            output = model(batch)
        elif isinstance(batch, (tuple, list)):
            output = model(*batch)
        elif isinstance(batch, Mapping):
            output = model(**batch)
        else:
            output = model(batch)
        loss = _loss_of(output, reduce=True)
    if loss.numel() != 1:
        raise _StepError(f"the loss must be a scalar, got a tensor of shape {tuple(loss.shape)}")
    if not loss.requires_grad:
        raise _StepError("the loss does not depend on any trainable parameter")
    return loss.reshape(())


def _trace_once(
    model: nn.Module,
    batch: Any,
    loss_fn: Callable | None,
    precision: str,
    channels_last: bool,
    cuda_kernels: bool,
) -> tuple[list[RawOp], int, Recorder]:
    recorder = Recorder(channels_last=channels_last)
    recorder.memory.preexisting(list(model.parameters()) + list(model.buffers()))
    recorder.memory.preexisting(_batch_tensors(batch), count=True)
    emulation = CudaEmulation(_AUTOCAST_DTYPES.get(precision), cuda_kernels=cuda_kernels)
    try:
        with emulation, recorder:
            loss = _forward(model, batch, loss_fn)
            emulation.stop_casting()
            recorder.phase = "backward"
            loss.backward()
            del loss
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        peak = recorder.memory.peak(exclude=recorder.memory.serials(grads))
    finally:
        recorder.memory.close()
        for param in model.parameters():
            param.grad = None
    return recorder.ops, peak, recorder


class _Session:
    """A copy of the model on one path, traced at any batch size."""

    def __init__(self, where, model, batch, loss_fn, precision, channels_last) -> None:
        self.where, self.batch, self.loss_fn = where, batch, loss_fn
        self.precision, self.channels_last = precision, channels_last
        self.place = _Place(where)
        with self.place.context():
            self.model = _copy_model(model, self.place, channels_last)

    def trace(self, size: int) -> tuple[list[RawOp], int, Recorder]:
        small = _resize(self.batch, size)  # the user's tensors: cut outside a fake mode
        with self.place.context():
            small = _place_batch(small, self.place, self.channels_last)
            return _trace_once(
                self.model, small, self.loss_fn, self.precision, self.channels_last,
                cuda_kernels=self.where != "cpu",
            )  # fmt: skip


def _trace_paired(where, model, batch, loss_fn, precision, channels_last):
    """(records, activation bytes, traced batches, recorders, notes) of the step on
    `where`: batch 1 and 2 paired; when their ops differ (PyTorch specialises size-1
    dimensions: some copies vanish at batch 1), batch 2 and 3; when those differ too
    (a data-dependent model), batch 3 scaled proportionally."""
    session = _Session(where, model, batch, loss_fn, precision, channels_last)
    (ops1, peak1, rec1), (ops2, peak2, rec2) = session.trace(1), session.trace(2)
    notes: list[str] = []
    if _same_ops(ops1, ops2):
        records = _pair(ops1, ops2, (1, 2))
        return records, Affine.through(1, peak1, 2, peak2), (1, 2), [rec1, rec2], notes
    ops3, peak3, rec3 = session.trace(3)
    if _same_ops(ops2, ops3):
        records = _pair(ops2, ops3, (2, 3))
        return records, Affine.through(2, peak2, 3, peak3), (2, 3), [rec2, rec3], notes
    notes.append(
        f"the step runs different ops at batch 1, 2 and 3 ({len(ops1)}, {len(ops2)}, "
        f"{len(ops3)} ops): costs are the batch-3 trace scaled proportionally"
    )
    return _scaled(ops3, 3), Affine(0.0, peak3 / 3), (3, 3), [rec2, rec3], notes


# -- pairing ------------------------------------------------------------------------


def _same_ops(ops_a: list[RawOp], ops_b: list[RawOp]) -> bool:
    return len(ops_a) == len(ops_b) and all(
        a.op == b.op and a.phase == b.phase and (a.gemm is None) == (b.gemm is None)
        for a, b in zip(ops_a, ops_b, strict=False)
    )


def _pair(ops_a: list[RawOp], ops_b: list[RawOp], batches: tuple[int, int]) -> list[OpRecord]:
    """Each quantity of each op pair as the line through its two values."""
    ba, bb = batches
    records = []
    for a, b in zip(ops_a, ops_b, strict=True):
        gemm = None
        if b.gemm is not None:
            gemm = tuple(Affine.through(ba, x, bb, y) for x, y in zip(a.gemm, b.gemm, strict=True))
        records.append(
            _record(b, Affine.through(ba, a.flops, bb, b.flops),
                    Affine.through(ba, a.bytes, bb, b.bytes), gemm)
        )  # fmt: skip
    return records


def _scaled(ops: list[RawOp], size: int) -> list[OpRecord]:
    """One trace's costs proportional to the batch (the GEMM's M too; N, K as traced)."""
    records = []
    for op in ops:
        gemm = None
        if op.gemm is not None:
            m, n, k = op.gemm
            gemm = (Affine(0.0, m / size), Affine(float(n), 0.0), Affine(float(k), 0.0))
        records.append(
            _record(op, Affine(0.0, op.flops / size), Affine(0.0, op.bytes / size), gemm)
        )
    return records


def _record(raw: RawOp, flops: Affine, nbytes: Affine, gemm: Any) -> OpRecord:
    return OpRecord(
        op=raw.op,
        op_class=raw.op_class,
        phase=raw.phase,
        dtype=raw.dtype,
        count=1,
        flops=_clean(flops),
        bytes=_clean(nbytes),
        gemm=tuple(_clean(d) for d in gemm) if gemm is not None else None,
        groups=raw.groups,
        channels_last=raw.channels_last,
        shape=raw.shape,
    )


def _clean(value: Affine) -> Affine:
    """Integral parts as whole floats (so equal ops compare equal after the solve)."""
    return Affine(float(round(value.fixed, 6)), float(round(value.per_sample, 6)))


# -- facts, cache -------------------------------------------------------------------


def _parameter_counts(model: nn.Module) -> tuple[int, int, int]:
    trainable = tensors = frozen = 0
    for param in model.parameters():
        if param.requires_grad:
            trainable += param.numel()
            tensors += 1
        else:
            frozen += param.numel()
    return trainable, tensors, frozen


def cache_dir() -> Path:
    """Where profiles are cached: <cloudtrain cache>/profiles."""
    return paths.cache_dir() / "profiles"


def _callable_id(fn: Any) -> str:
    if fn is None:
        return "default"
    code = getattr(fn, "__code__", None)
    where = f"{code.co_filename}:{code.co_firstlineno}" if code is not None else ""
    label = getattr(fn, "__qualname__", type(fn).__qualname__)
    return f"{getattr(fn, '__module__', '')}.{label}@{where}"


def _leaf_signature(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ["tensor", str(value.dtype), list(value.shape[1:])]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return type(value).__qualname__


def _cache_key(fingerprint: str, batch: Any, loss_fn: Any, device: str) -> str:
    leaves, spec = tree_flatten(batch)
    parts = [
        TRACER_VERSION,
        PROFILE_VERSION,
        ".".join(torch.__version__.split(".")[:2]),
        device,
        _callable_id(loss_fn),
        str(spec),
        [_leaf_signature(v) for v in leaves],
    ]
    text = json.dumps(parts, sort_keys=True, default=str)
    return f"{fingerprint}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def _load_cached(key: str) -> ModelProfile | None:
    path = cache_dir() / f"{key}.json"
    try:
        return ModelProfile.from_json(path.read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _store_cached(key: str, profile: ModelProfile) -> None:
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(handle, "w") as out:
            out.write(profile.to_json())
        os.replace(tmp, folder / f"{key}.json")
    except OSError:
        pass  # a cache that cannot be written only costs a retrace


# -- text ---------------------------------------------------------------------------


def _attempts_text(attempts: dict[str, str]) -> str:
    return "; ".join(f"{where} {what}" for where, what in attempts.items())
