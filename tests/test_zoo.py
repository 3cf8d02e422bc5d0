"""The benchmark model zoo: every model builds on the meta device with timm's parameter count
(within 1%), a handful train one step on the CPU, and explicit attention equals the fused one."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from zoo import MODELS, NUM_CLASSES, build, example_batch, loss_fn
from zoo.layers import Attention

# the models beyond timm's CSV, in millions (GPT-2 counts its tied head once)
EXTRA_PARAMS_M = {
    "gpt2": 124.44,
    "bert-base": 109.51,
    "llama-small": 168.31,
    "lstm-lm": 19.78,
    "mlp-wide": 243.11,
}


def trainable_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_every_model_has_a_reference_count_and_a_known_kind():
    assert len(MODELS) == 59
    for name, m in MODELS.items():
        assert m.name == name and m.kind in ("image", "tokens", "vector")
        assert (m.param_count_m is not None) == (m.kind == "image") != (name in EXTRA_PARAMS_M)
        assert (m.vocab_size is not None) == (m.kind == "tokens")
    sizes = {n: m.input_shape for n, m in MODELS.items() if n.startswith("efficientnet")}
    assert [s[1] for s in sizes.values()] == [224, 224, 256, 288]


@pytest.mark.parametrize("name", list(MODELS))
def test_parameter_count_on_meta(name):
    with torch.device("meta"):
        model = build(name)
    expected = MODELS[name].param_count_m or EXTRA_PARAMS_M[name]
    assert trainable_params(model) / 1e6 == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize(
    "name, seq_len",
    [
        ("resnet18", None),
        ("mobilenetv2_050", None),
        ("vit_tiny_patch16_224", None),
        ("swin_tiny_patch4_window7_224", None),
        ("mixer_s32_224", None),
        ("gpt2", 32),
        ("lstm-lm", None),
        ("mlp-wide", None),
    ],
)
def test_one_training_step_on_cpu(name, seq_len):
    torch.manual_seed(0)
    zm = MODELS[name]
    model = zm.build()
    inputs, targets = batch = example_batch(zm, 2, seq_len=seq_len)
    logits = model(inputs)
    if zm.kind == "tokens":
        assert inputs.dtype == torch.int64
        assert logits.shape == (*inputs.shape, zm.vocab_size)
    else:
        assert logits.shape == (2, NUM_CLASSES)
    loss = loss_fn(zm)(model, batch)
    loss.backward()
    assert math.isfinite(loss.item()) and targets.dtype == torch.int64
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("causal", [False, True])
def test_explicit_attention_equals_fused(causal):
    torch.manual_seed(0)
    attn = Attention(64, 4, causal=causal)
    x, bias = torch.randn(2, 3, 10, 64), torch.randn(4, 10, 10)
    explicit = attn(x, None if causal else bias)
    attn.fused = True
    torch.testing.assert_close(attn(x, None if causal else bias), explicit)


def test_swin_shifted_window_attention_explicit_equals_fused():
    torch.manual_seed(0)
    with torch.no_grad():
        model = build("swin_tiny_patch4_window7_224").eval()
        x = torch.randn(1, 3, 224, 224)
        explicit = model(x)
        for m in model.modules():
            if isinstance(m, Attention):
                m.fused = True
        torch.testing.assert_close(model(x), explicit, rtol=1e-4, atol=1e-4)


def test_builders_take_overrides():
    with torch.device("meta"):
        vit = build("vit_tiny_patch16_224", fused_attention=True)
        gpt = build("gpt2", seq_len=128)
    assert all(m.fused for m in vit.modules() if isinstance(m, Attention))
    assert gpt.pos.num_embeddings == 128
