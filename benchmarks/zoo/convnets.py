"""Other CNNs.

- ConvNeXt: Liu et al. 2022, "A ConvNet for the 2020s" (4x4 patchify stem, depthwise 7x7,
  channels-last LayerNorm, inverted MLP x4 with GELU, layer scale 1e-6, LayerNorm + 2x2
  strided conv between stages, LayerNorm before the classifier).
- DenseNet-121: Huang et al. 2017, "Densely Connected Convolutional Networks" (growth 32,
  blocks 6-12-24-16, BN-ReLU-conv bottleneck x4, transitions halving the channels).
- VGG-11 / VGG-16: Simonyan & Zisserman 2015, configurations A and D without batch norm, with
  the 4096-4096 classifier.
"""

from __future__ import annotations

import torch
from torch import nn

from .layers import ConvNormAct, LayerScale, Permute, Residual, classifier, mlp


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def convnext_block(dim: int) -> nn.Module:
    return Residual(
        nn.Sequential(
            nn.Conv2d(dim, dim, 7, padding=3, groups=dim),
            Permute(0, 2, 3, 1),
            nn.LayerNorm(dim, eps=1e-6),
            mlp(dim, 4 * dim),
            LayerScale(dim),
            Permute(0, 3, 1, 2),
        )
    )


def convnext(depths: tuple[int, ...], dims: tuple[int, ...], num_classes: int = 1000) -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0], eps=1e-6)]
    for i, (depth, dim) in enumerate(zip(depths, dims, strict=True)):
        if i:
            layers += [LayerNorm2d(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], dim, 2, 2)]
        layers += [convnext_block(dim) for _ in range(depth)]
    return nn.Sequential(*layers, classifier(dims[-1], num_classes, norm=nn.LayerNorm))


def norm_act_conv(cin: int, cout: int, kernel: int) -> list[nn.Module]:
    """DenseNet's pre-activation unit: BN -> ReLU -> conv."""
    return [
        nn.BatchNorm2d(cin),
        nn.ReLU(),
        nn.Conv2d(cin, cout, kernel, padding=kernel // 2, bias=False),
    ]


class DenseLayer(nn.Module):
    """Concatenates ``growth`` new feature maps onto its input."""

    def __init__(self, cin: int, growth: int, bn_size: int):
        super().__init__()
        mid = bn_size * growth
        self.body = nn.Sequential(*norm_act_conv(cin, mid, 1), *norm_act_conv(mid, growth, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.body(x)], 1)


def densenet(
    growth: int = 32,
    blocks: tuple[int, ...] = (6, 12, 24, 16),
    bn_size: int = 4,
    stem: int = 64,
    num_classes: int = 1000,
) -> nn.Module:
    layers: list[nn.Module] = [ConvNormAct(3, stem, 7, 2), nn.MaxPool2d(3, 2, 1)]
    c = stem
    for i, n in enumerate(blocks):
        for _ in range(n):
            layers.append(DenseLayer(c, growth, bn_size))
            c += growth
        if i < len(blocks) - 1:
            layers += [*norm_act_conv(c, c // 2, 1), nn.AvgPool2d(2)]
            c //= 2
    return nn.Sequential(*layers, nn.BatchNorm2d(c), nn.ReLU(), classifier(c, num_classes))


VGG_CONFIGS = {
    11: [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    16: [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
}


def vgg(depth: int, num_classes: int = 1000) -> nn.Module:
    layers: list[nn.Module] = []
    cin = 3
    for v in VGG_CONFIGS[depth]:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers.append(ConvNormAct(cin, v, 3, norm=None))
            cin = v
    return nn.Sequential(
        *layers,
        nn.AdaptiveAvgPool2d(7),
        nn.Flatten(),
        nn.Linear(cin * 49, 4096),
        nn.ReLU(),
        nn.Linear(4096, 4096),
        nn.ReLU(),
        nn.Linear(4096, num_classes),
    )
