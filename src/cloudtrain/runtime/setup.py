"""Preparing the model and optimizer for speed: channels_last, FP8, activation
checkpointing, compile, and the default (fused) AdamW."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from cloudtrain.errors import UserError

OptimizerArg = torch.optim.Optimizer | Callable[..., torch.optim.Optimizer] | None
SchedulerArg = Callable[[torch.optim.Optimizer], object] | None


def has_conv(model: nn.Module) -> bool:
    return any(isinstance(m, (nn.Conv2d, nn.Conv3d)) for m in model.modules())


def use_channels_last(setting: bool | str, model: nn.Module, device: torch.device) -> bool:
    if setting == "auto":
        return device.type == "cuda" and has_conv(model)
    return bool(setting)


def use_compile(setting: bool | str, device: torch.device) -> bool:
    return device.type == "cuda" if setting == "auto" else bool(setting)


def checkpoint_blocks(model: nn.Module) -> int:
    """Recompute each ModuleList block's activations in backward instead of storing
    them. The forward is replaced on the instance, so state_dict keys do not change.
    Returns the number of blocks wrapped."""
    count = 0
    for module in list(model.modules()):
        if not isinstance(module, nn.ModuleList):
            continue
        for block in module:
            inner = block.forward

            @functools.wraps(inner)
            def forward(*args, _inner=inner, **kwargs):
                return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

            block.forward = forward
            count += 1
    return count


def make_optimizer(
    arg: OptimizerArg, model: nn.Module, device: torch.device, lr: float, weight_decay: float
) -> torch.optim.Optimizer:
    """The optimizer: the instance given, the factory called on the parameters, or
    AdamW (fused on CUDA: one kernel for all parameters)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if isinstance(arg, torch.optim.Optimizer):
        return arg
    if arg is None:
        fused = device.type == "cuda"
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused)
    if callable(arg):
        optimizer = arg(params)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise UserError(
                f"the optimizer factory returned {type(optimizer).__name__}, "
                "not a torch.optim.Optimizer"
            )
        return optimizer
    raise UserError(f"optimizer must be an Optimizer, a factory or None, not {type(arg)}")
