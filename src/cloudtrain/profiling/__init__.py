"""Trace a model's training step into a `cloudtrain.plan.profile.ModelProfile`.

    from cloudtrain.profiling import profile_model
    profile = profile_model(model, batch, precision="bf16")

`profile_model` and `fingerprint_model` need torch (imported on first use);
`op_class_of` does not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cloudtrain.profiling.ops import op_class_of

if TYPE_CHECKING:
    from cloudtrain.profiling.api import fingerprint_model, profile_model

__all__ = ["fingerprint_model", "op_class_of", "profile_model"]


def __getattr__(name: str) -> Any:
    if name in ("profile_model", "fingerprint_model"):
        from cloudtrain.profiling import api

        return getattr(api, name)
    raise AttributeError(f"module 'cloudtrain.profiling' has no attribute '{name}'")
