"""Numeric precision: what `precision="auto"` means on this device, and its pieces
(autocast context, GradScaler, TF32 switches, optional FP8 through torchao)."""

from __future__ import annotations

import contextlib
import importlib.util
from dataclasses import dataclass

import torch
from torch import nn

from cloudtrain.errors import UserError


@dataclass(frozen=True)
class Precision:
    """The resolved precision of a run."""

    name: str
    """'fp32', 'bf16', 'fp16' or 'fp8'."""
    autocast_dtype: torch.dtype | None
    """dtype of autocast regions; None: no autocast (fp32)."""
    grad_scaler: bool
    """Loss scaling with a GradScaler (fp16 only)."""
    tf32: bool
    """TF32 matmuls for what stays fp32 (Ampere and newer, when allowed)."""

    @property
    def peak_dtype(self) -> str:
        """Catalog dtype whose peak is the MFU denominator."""
        if self.name == "fp32":
            return "tf32" if self.tf32 else "fp32"
        return self.name


def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else (0, 0)


def resolve_precision(requested: str, device: torch.device, *, allow_tf32: bool) -> Precision:
    """Turn 'auto'/'fp32'/'bf16'/'fp16'/'fp8' into a Precision for `device`."""
    major, minor = _capability(device)
    tf32 = allow_tf32 and device.type == "cuda" and major >= 8
    name = requested
    if requested == "auto":
        if device.type != "cuda":
            name = "fp32"
        else:
            name = "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp16"
    if name == "fp8":
        if device.type != "cuda" or (major, minor) < (8, 9):
            raise UserError("precision 'fp8' needs an NVIDIA GPU of compute capability 8.9+")
        if importlib.util.find_spec("torchao") is None:
            raise UserError("precision 'fp8' needs torchao: pip install 'cloudtrain[fp8]'")
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}
    return Precision(name, dtype[name], grad_scaler=name == "fp16", tf32=tf32)


def apply_tf32(precision: Precision) -> None:
    """Switch TF32 on (or leave it as torch's default, off, for fp32 matmuls)."""
    if precision.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def autocast(precision: Precision, device: torch.device):
    """The autocast context of one forward pass (a no-op for fp32)."""
    if precision.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=precision.autocast_dtype)


def make_grad_scaler(precision: Precision, device: torch.device) -> torch.amp.GradScaler | None:
    return torch.amp.GradScaler(device.type) if precision.grad_scaler else None


def convert_to_fp8(model: nn.Module) -> nn.Module:
    """torchao float8 training for the inner Linear layers. The first and last Linear
    and those with a dimension that is not a multiple of 16 or below 256 stay bf16:
    FP8 does not pay on small matmuls and hurts accuracy at the ends of the network."""
    from torchao.float8 import convert_to_float8_training  # optional dependency

    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    ends = {linears[0], linears[-1]} if linears else set()

    def keep(module: nn.Module, fqn: str) -> bool:
        if not isinstance(module, nn.Linear) or fqn in ends:
            return False
        dims = (module.in_features, module.out_features)
        return all(d % 16 == 0 and d >= 256 for d in dims)

    return convert_to_float8_training(model, module_filter_fn=keep)
