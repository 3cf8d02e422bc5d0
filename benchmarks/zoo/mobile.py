"""Inverted-residual (MBConv) networks built from one block.

- MobileNetV2: Sandler et al. 2018, "MobileNetV2: Inverted Residuals and Linear Bottlenecks"
  (ReLU6, expansion 6, width multiplier on every layer but a 1280-wide head at least).
- MobileNetV3: Howard et al. 2019, "Searching for MobileNetV3" (Table 1 and 2, large and
  small: hard-swish, SE with a hard-sigmoid gate and a ReLU, reduced to a quarter of the
  expanded width rounded to 8, and a biased, norm-free 1x1 conv after the pool).
- EfficientNet: Tan & Le 2019, "EfficientNet: Rethinking Model Scaling" (the B0 stages of
  Table 1, SiLU, SE reduced to a quarter of the block's input width, width multipliers
  rounded to 8 and depth multipliers rounded up).
"""

from __future__ import annotations

import math

from torch import nn

from .layers import ConvNormAct, Layer, Residual, SqueezeExcite, classifier, make_divisible


def mbconv(
    cin: int,
    mid: int,
    cout: int,
    kernel: int = 3,
    stride: int = 1,
    act: Layer = nn.ReLU,
    se: int = 0,
    se_act: Layer | None = None,
    gate: Layer = nn.Sigmoid,
) -> nn.Module:
    """[1x1 expand to ``mid`` unless mid == cin] -> depthwise -> [SE] -> linear 1x1 projection,
    residual when the shape is kept."""
    layers = [] if mid == cin else [ConvNormAct(cin, mid, 1, act=act)]
    layers.append(ConvNormAct(mid, mid, kernel, stride, groups=mid, act=act))
    layers += [SqueezeExcite(mid, se, se_act or act, gate)] if se else []
    layers.append(ConvNormAct(mid, cout, 1, act=None))
    body = nn.Sequential(*layers)
    return Residual(body) if stride == 1 and cin == cout else body


# expansion, kernel, stride, repeats, channels
MOBILENETV2_STAGES = [
    (1, 3, 1, 1, 16),
    (6, 3, 2, 2, 24),
    (6, 3, 2, 3, 32),
    (6, 3, 2, 4, 64),
    (6, 3, 1, 3, 96),
    (6, 3, 2, 3, 160),
    (6, 3, 1, 1, 320),
]
EFFICIENTNET_STAGES = [
    (1, 3, 1, 1, 16),
    (6, 3, 2, 2, 24),
    (6, 5, 2, 2, 40),
    (6, 3, 2, 3, 80),
    (6, 5, 1, 3, 112),
    (6, 5, 2, 4, 192),
    (6, 3, 1, 1, 320),
]


def _inverted_residual_net(
    stages, width: float, depth: float, stem: int, head: int, act: Layer, se_ratio: float, classes
) -> nn.Module:
    cin = make_divisible(stem * width)
    layers: list[nn.Module] = [ConvNormAct(3, cin, 3, 2, act=act)]
    for expand, kernel, stride, repeats, channels in stages:
        cout = make_divisible(channels * width)
        for i in range(math.ceil(repeats * depth)):
            se = round(cin * se_ratio)
            layers.append(mbconv(cin, cin * expand, cout, kernel, 1 if i else stride, act, se))
            cin = cout
    layers.append(ConvNormAct(cin, head, 1, act=act))
    return nn.Sequential(*layers, classifier(head, classes))


def mobilenetv2(width: float = 1.0, num_classes: int = 1000) -> nn.Module:
    head = max(1280, make_divisible(1280 * width))
    return _inverted_residual_net(
        MOBILENETV2_STAGES, width, 1.0, 32, head, nn.ReLU6, 0.0, num_classes
    )


def efficientnet(width: float = 1.0, depth: float = 1.0, num_classes: int = 1000) -> nn.Module:
    head = make_divisible(1280 * width)
    return _inverted_residual_net(
        EFFICIENTNET_STAGES, width, depth, 32, head, nn.SiLU, 0.25, num_classes
    )


# kernel, expanded width, out channels, SE, hard-swish (else ReLU), stride
MOBILENETV3_LARGE = [
    (3, 16, 16, False, False, 1),
    (3, 64, 24, False, False, 2),
    (3, 72, 24, False, False, 1),
    (5, 72, 40, True, False, 2),
    (5, 120, 40, True, False, 1),
    (5, 120, 40, True, False, 1),
    (3, 240, 80, False, True, 2),
    (3, 200, 80, False, True, 1),
    (3, 184, 80, False, True, 1),
    (3, 184, 80, False, True, 1),
    (3, 480, 112, True, True, 1),
    (3, 672, 112, True, True, 1),
    (5, 672, 160, True, True, 2),
    (5, 960, 160, True, True, 1),
    (5, 960, 160, True, True, 1),
]
MOBILENETV3_SMALL = [
    (3, 16, 16, True, False, 2),
    (3, 72, 24, False, False, 2),
    (3, 88, 24, False, False, 1),
    (5, 96, 40, True, True, 2),
    (5, 240, 40, True, True, 1),
    (5, 240, 40, True, True, 1),
    (5, 120, 48, True, True, 1),
    (5, 144, 48, True, True, 1),
    (5, 288, 96, True, True, 2),
    (5, 576, 96, True, True, 1),
    (5, 576, 96, True, True, 1),
]


def mobilenetv3(small: bool = False, num_classes: int = 1000) -> nn.Module:
    blocks, head = (MOBILENETV3_SMALL, 1024) if small else (MOBILENETV3_LARGE, 1280)
    cin = 16
    layers: list[nn.Module] = [ConvNormAct(3, cin, 3, 2, act=nn.Hardswish)]
    for kernel, mid, cout, se, hswish, stride in blocks:
        act = nn.Hardswish if hswish else nn.ReLU
        se_width = make_divisible(mid / 4) if se else 0
        layers.append(
            mbconv(cin, mid, cout, kernel, stride, act, se_width, nn.ReLU, nn.Hardsigmoid)
        )
        cin = cout
    last = 6 * cin
    return nn.Sequential(
        *layers,
        ConvNormAct(cin, last, 1, act=nn.Hardswish),
        nn.AdaptiveAvgPool2d(1),
        ConvNormAct(last, head, 1, act=nn.Hardswish, norm=None),
        nn.Flatten(),
        nn.Linear(head, num_classes),
    )
