"""What a run records so that later plans of the same model learn from it
(cloudtrain.plan.learned): the model's fingerprint (the one `profile_model` gives the
same model and sample shape), the precision in the planner's terms, the optimizer."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten


def planner_precision(name: str, tf32: bool) -> str | None:
    """The planner's precision for a Trainer precision ('fp32' with TF32 is 'tf32');
    None for one the planner does not trace (fp8)."""
    if name in ("bf16", "fp16"):
        return name
    if name == "fp32":
        return "tf32" if tf32 else "fp32"
    return None


def optimizer_facts(optimizer: torch.optim.Optimizer) -> dict[str, str]:
    """The optimizer's name (lower case; the planner reads names it knows) and its
    implementation."""
    name = type(optimizer).__name__.lower()
    defaults = optimizer.defaults
    if defaults.get("fused"):
        impl = "fused"
    elif defaults.get("foreach") is False:
        impl = "plain"
    else:
        impl = "foreach"
    return {"optimizer_name": name, "optimizer_impl": impl}


def planner_facts(
    model: torch.nn.Module,
    batch: Any,
    precision_name: str,
    tf32: bool,
    channels_last: bool,
    optimizer: torch.optim.Optimizer,
) -> dict[str, Any]:
    """Config keys for the run record: model_fingerprint, planner_precision,
    optimizer_name, optimizer_impl (the fingerprint is None without a batch or for fp8)."""
    from cloudtrain.profiling import fingerprint_model

    precision = planner_precision(precision_name, tf32)
    tensors = [t for t in tree_flatten(batch)[0] if isinstance(t, torch.Tensor) and t.dim() > 0]
    fingerprint = None
    if precision is not None and tensors:
        sample_shape = tuple(int(s) for s in tensors[0].shape[1:])
        fingerprint = fingerprint_model(
            model, sample_shape, precision=precision, channels_last=channels_last
        )
    return {
        "model_fingerprint": fingerprint,
        "planner_precision": precision,
        **optimizer_facts(optimizer),
    }
