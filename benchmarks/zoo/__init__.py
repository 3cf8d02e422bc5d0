"""Our own PyTorch definitions of the models in timm's RTX 3090 training benchmark (timm 0.6
architectures: same layers, widths, depths, activations, SE blocks and norms, so the parameter
counts match timm's CSV), plus five models beyond it (GPT-2, BERT, a Llama-style decoder, an
LSTM LM, a wide MLP). Each family's module names the paper it follows.

Every builder returns an ``nn.Module`` and builds on the meta device and on the CPU, with no
downloads::

    with torch.device("meta"):
        model = build("resnet50")
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from .convnets import convnext, densenet, vgg
from .language import LSTMLM, bert, gpt2, llama, wide_mlp
from .mobile import efficientnet, mobilenetv2, mobilenetv3
from .resnet import regnet, resnet
from .vision_transformers import VisionTransformer, mixer, swin

NUM_CLASSES = 1000


@dataclass(frozen=True)
class ZooModel:
    name: str  # timm's model name, for the image models
    family: str
    build: Callable[..., nn.Module]  # keyword overrides, e.g. fused_attention=True
    input_shape: tuple[int, ...]  # one sample: (3, H, W), (T,) token ids or (features,)
    kind: Literal["image", "tokens", "vector"] = "image"
    vocab_size: int | None = None
    param_count_m: float | None = None  # timm's CSV figure (millions), image models only


_resnext = partial(resnet, groups=32)
_regnetx = regnet
_regnety = partial(regnet, se_ratio=0.25)
_vit = VisionTransformer

# timm name, family, builder, params in timm's CSV (millions), train image size
_IMAGE_MODELS: list[tuple] = [
    ("resnet18", "resnet", partial(resnet, (2, 2, 2, 2), basic=True), 11.69),
    ("resnet34", "resnet", partial(resnet, (3, 4, 6, 3), basic=True), 21.8),
    ("resnet50", "resnet", partial(resnet, (3, 4, 6, 3)), 25.56),
    ("resnet101", "resnet", partial(resnet, (3, 4, 23, 3)), 44.55),
    ("resnet152", "resnet", partial(resnet, (3, 8, 36, 3)), 60.19),
    ("resnext50_32x4d", "resnet", partial(_resnext, (3, 4, 6, 3), base_width=4), 25.03),
    ("resnext101_32x8d", "resnet", partial(_resnext, (3, 4, 23, 3), base_width=8), 88.79),
    ("wide_resnet50_2", "resnet", partial(resnet, (3, 4, 6, 3), base_width=128), 68.88),
    ("wide_resnet101_2", "resnet", partial(resnet, (3, 4, 23, 3), base_width=128), 126.89),
    # RegNet (w0, wa, wm, depth, group width): Radosavovic et al. 2020, Appendix C
    ("regnetx_002", "regnet", partial(_regnetx, 24, 36.44, 2.49, 13, 8), 2.68),
    ("regnetx_004", "regnet", partial(_regnetx, 24, 24.48, 2.54, 22, 16), 5.16),
    ("regnetx_006", "regnet", partial(_regnetx, 48, 36.97, 2.24, 16, 24), 6.2),
    ("regnetx_008", "regnet", partial(_regnetx, 56, 35.73, 2.28, 16, 16), 7.26),
    ("regnetx_016", "regnet", partial(_regnetx, 80, 34.01, 2.25, 18, 24), 9.19),
    ("regnetx_032", "regnet", partial(_regnetx, 88, 26.31, 2.25, 25, 48), 15.3),
    ("regnetx_040", "regnet", partial(_regnetx, 96, 38.65, 2.43, 23, 40), 22.12),
    ("regnety_002", "regnet", partial(_regnety, 24, 36.44, 2.49, 13, 8), 3.16),
    ("regnety_004", "regnet", partial(_regnety, 48, 27.89, 2.09, 16, 8), 4.34),
    ("regnety_006", "regnet", partial(_regnety, 48, 32.54, 2.32, 15, 16), 6.06),
    ("regnety_008", "regnet", partial(_regnety, 56, 38.84, 2.4, 14, 16), 6.26),
    ("regnety_016", "regnet", partial(_regnety, 48, 20.71, 2.65, 27, 24), 11.2),
    ("regnety_032", "regnet", partial(_regnety, 80, 42.63, 2.66, 21, 24), 19.44),
    ("regnety_040", "regnet", partial(_regnety, 96, 31.41, 2.24, 22, 64), 20.65),
    ("efficientnet_b0", "efficientnet", partial(efficientnet, 1.0, 1.0), 5.29),
    ("efficientnet_b1", "efficientnet", partial(efficientnet, 1.0, 1.1), 7.79),
    ("efficientnet_b2", "efficientnet", partial(efficientnet, 1.1, 1.2), 9.11, 256),
    ("efficientnet_b3", "efficientnet", partial(efficientnet, 1.2, 1.4), 12.23, 288),
    ("mobilenetv2_050", "mobilenet", partial(mobilenetv2, 0.5), 1.97),
    ("mobilenetv2_100", "mobilenet", partial(mobilenetv2, 1.0), 3.5),
    ("mobilenetv2_140", "mobilenet", partial(mobilenetv2, 1.4), 6.11),
    ("mobilenetv3_large_100", "mobilenet", partial(mobilenetv3, small=False), 5.48),
    ("mobilenetv3_small_100", "mobilenet", partial(mobilenetv3, small=True), 2.54),
    ("convnext_tiny", "convnext", partial(convnext, (3, 3, 9, 3), (96, 192, 384, 768)), 28.59),
    ("convnext_small", "convnext", partial(convnext, (3, 3, 27, 3), (96, 192, 384, 768)), 50.22),
    ("convnext_base", "convnext", partial(convnext, (3, 3, 27, 3), (128, 256, 512, 1024)), 88.59),
    ("vit_tiny_patch16_224", "vit", partial(_vit, 192, 12, 3), 5.72),
    ("vit_small_patch16_224", "vit", partial(_vit, 384, 12, 6), 22.05),
    ("vit_base_patch16_224", "vit", partial(_vit, 768, 12, 12), 86.57),
    ("vit_base_patch32_224", "vit", partial(_vit, 768, 12, 12, patch=32), 88.22),
    ("vit_large_patch16_224", "vit", partial(_vit, 1024, 24, 16), 304.33),
    ("deit_tiny_patch16_224", "vit", partial(_vit, 192, 12, 3), 5.72),
    ("deit_small_patch16_224", "vit", partial(_vit, 384, 12, 6), 22.05),
    ("deit_base_patch16_224", "vit", partial(_vit, 768, 12, 12), 86.57),
    (
        "swin_tiny_patch4_window7_224",
        "swin",
        partial(swin, 96, (2, 2, 6, 2), (3, 6, 12, 24)),
        28.29,
    ),
    (
        "swin_small_patch4_window7_224",
        "swin",
        partial(swin, 96, (2, 2, 18, 2), (3, 6, 12, 24)),
        49.61,
    ),
    (
        "swin_base_patch4_window7_224",
        "swin",
        partial(swin, 128, (2, 2, 18, 2), (4, 8, 16, 32)),
        87.77,
    ),
    ("mixer_s16_224", "mixer", partial(mixer, 512, 8, 16), 18.53),
    ("mixer_b16_224", "mixer", partial(mixer, 768, 12, 16), 59.88),
    ("mixer_s32_224", "mixer", partial(mixer, 512, 8, 32), 19.1),
    ("mixer_b32_224", "mixer", partial(mixer, 768, 12, 32), 60.29),
    ("mixer_l16_224", "mixer", partial(mixer, 1024, 24, 16), 208.2),
    ("densenet121", "densenet", densenet, 7.98),
    ("vgg11", "vgg", partial(vgg, 11), 132.86),
    ("vgg16", "vgg", partial(vgg, 16), 138.36),
]


def _image(name: str, family: str, fn: Callable, params: float, size: int = 224) -> ZooModel:
    return ZooModel(name, family, fn, (3, size, size), param_count_m=params)


MODELS: dict[str, ZooModel] = {row[0]: _image(*row) for row in _IMAGE_MODELS}
MODELS.update(
    (m.name, m)
    for m in [
        ZooModel("gpt2", "gpt", gpt2, (1024,), "tokens", 50257),
        ZooModel("bert-base", "bert", bert, (512,), "tokens", 30522),
        ZooModel("llama-small", "llama", llama, (1024,), "tokens", 32000),
        ZooModel("lstm-lm", "lstm", LSTMLM, (35,), "tokens", 10000),
        ZooModel("mlp-wide", "mlp", wide_mlp, (4096,), "vector"),
    ]
)


def build(name: str, **overrides) -> nn.Module:
    """``MODELS[name].build(**overrides)``; builds on the current default device."""
    return MODELS[name].build(**overrides)


def example_batch(
    model: ZooModel, batch: int, device: str | torch.device = "cpu", seq_len: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets): random float inputs and int64 class targets, or (B, T) int64 token ids
    and targets (``seq_len`` overrides T; at most the model's position table)."""
    if model.kind == "tokens":
        assert model.vocab_size is not None
        shape = (batch, seq_len or model.input_shape[0])
        ids = torch.randint(model.vocab_size, shape, device=device)
        return ids, torch.randint(model.vocab_size, shape, device=device)
    inputs = torch.randn(batch, *model.input_shape, device=device)
    return inputs, torch.randint(NUM_CLASSES, (batch,), device=device)


def loss_fn(zoo_model: ZooModel) -> Callable[[nn.Module, tuple], torch.Tensor]:
    """Cross-entropy on the logits; for token models over every position."""

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, targets = batch
        logits = model(inputs)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return loss


__all__ = ["MODELS", "NUM_CLASSES", "ZooModel", "build", "example_batch", "loss_fn"]
