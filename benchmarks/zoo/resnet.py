"""Residual CNNs built from one bottleneck.

- ResNet: He et al. 2016, "Deep Residual Learning for Image Recognition" (v1.5: the stride
  sits on the 3x3 conv, as in timm and torchvision).
- ResNeXt: Xie et al. 2017, "Aggregated Residual Transformations" (grouped 3x3, 32 groups).
- Wide ResNet: Zagoruyko & Komodakis 2016, "Wide Residual Networks" (bottleneck twice as wide).
- RegNetX / RegNetY: Radosavovic et al. 2020, "Designing Network Design Spaces": the widths
  come from the quantized linear rule (w0, wa, wm, depth), the blocks are ResNeXt bottlenecks
  with a fixed group width (bottleneck ratio 1), and RegNetY adds squeeze-excitation whose
  reduction is a quarter of the block's input width.
"""

from __future__ import annotations

import math
from itertools import groupby

from torch import nn

from .layers import ConvNormAct, Residual, SqueezeExcite, classifier, projection


def bottleneck(cin: int, cout: int, stride: int, mid: int, groups: int = 1, se: int = 0):
    """1x1 -> 3x3 (grouped, strided) -> [SE] -> 1x1, added to the shortcut, then ReLU."""
    layers = [ConvNormAct(cin, mid, 1), ConvNormAct(mid, mid, 3, stride, groups)]
    layers += [SqueezeExcite(mid, se)] if se else []
    layers.append(ConvNormAct(mid, cout, 1, act=None))
    return Residual(nn.Sequential(*layers), projection(cin, cout, stride), nn.ReLU())


def basic_block(cin: int, cout: int, stride: int):
    body = nn.Sequential(ConvNormAct(cin, cout, 3, stride), ConvNormAct(cout, cout, 3, act=None))
    return Residual(body, projection(cin, cout, stride), nn.ReLU())


def resnet(
    depths: tuple[int, ...],
    basic: bool = False,
    groups: int = 1,
    base_width: int = 64,
    num_classes: int = 1000,
) -> nn.Module:
    layers: list[nn.Module] = [ConvNormAct(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for stage, depth in enumerate(depths):
        planes = 64 * 2**stage
        for i in range(depth):
            stride = 2 if stage and not i else 1
            if basic:
                cout, block = planes, basic_block(cin, planes, stride)
            else:
                cout, mid = planes * 4, planes * base_width // 64 * groups
                block = bottleneck(cin, cout, stride, mid, groups)
            layers.append(block)
            cin = cout
    return nn.Sequential(*layers, classifier(cin, num_classes))


def regnet_stages(w0: int, wa: float, wm: float, depth: int, group_w: int, q: int = 8):
    """[(width, blocks, group width)] per stage, from the paper's quantized linear widths."""
    exps = [round(math.log((w0 + wa * i) / w0) / math.log(wm)) for i in range(depth)]
    widths = [round(w0 * wm**e / q) * q for e in exps]
    stages = []
    for width, run in groupby(widths):
        gw = min(group_w, width)
        stages.append((round(width / gw) * gw, len(list(run)), gw))
    return stages


def regnet(
    w0: int,
    wa: float,
    wm: float,
    depth: int,
    group_w: int,
    se_ratio: float = 0.0,
    num_classes: int = 1000,
) -> nn.Module:
    layers: list[nn.Module] = [ConvNormAct(3, 32, 3, 2)]
    cin = 32
    for width, blocks, gw in regnet_stages(w0, wa, wm, depth, group_w):
        for i in range(blocks):
            se = round(cin * se_ratio)
            layers.append(bottleneck(cin, width, 1 if i else 2, width, width // gw, se))
            cin = width
    return nn.Sequential(*layers, classifier(cin, num_classes))
