"""FP8 training through torchao: which Linear layers convert, and that a converted
model trains. torchao emulates the float8 matmuls on the CPU, so this runs in CI; the
speed-up is a GPU matter (compute capability 8.9+, see tests/test_trainer_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cloudtrain.errors import UserError
from cloudtrain.runtime.precision import convert_to_fp8, resolve_precision

pytest.importorskip("torchao")


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, 256),  # first: stays
        nn.GELU(),
        nn.Linear(256, 256),  # inner, >= 256 and a multiple of 16: converts
        nn.GELU(),
        nn.Linear(256, 100),  # 100 is not a multiple of 16: stays
        nn.Linear(100, 256),  # stays, same reason
        nn.Linear(256, 8),  # last: stays
    )


def test_only_inner_large_aligned_linears_convert():
    converted = convert_to_fp8(_mlp())
    kinds = {name: type(m).__name__ for name, m in converted.named_children()}
    assert kinds["2"] == "Float8Linear"
    assert [kinds[k] for k in ("0", "4", "5", "6")] == ["Linear"] * 4


def test_a_converted_model_trains_like_bf16():
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
    y = x[:, :8].sin()

    def train(model: nn.Module) -> list[float]:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses = []
        for _ in range(20):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.mse_loss(model(x).float(), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        return losses

    fp8, bf16 = train(convert_to_fp8(_mlp())), train(_mlp())
    assert fp8[-1] < 0.5 * fp8[0]  # it learns
    assert fp8[-1] == pytest.approx(bf16[-1], rel=0.25)  # about as well as bf16


def test_fp8_is_refused_off_the_gpu_with_the_reason():
    with pytest.raises(UserError, match=r"compute capability 8\.9"):
        resolve_precision("fp8", torch.device("cpu"), allow_tf32=True)
