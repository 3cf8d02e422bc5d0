"""Patch-token vision models, all built from ``layers.transformer_block``.

- ViT: Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words" (conv patch embedding, class
  token, learned position embedding, pre-norm blocks, MLP ratio 4, GELU, the class token's
  final LayerNorm'd state into the head). DeiT (Touvron et al. 2021, "Training data-efficient
  image transformers") is the same network; its non-distilled models are ViT-Ti/S/B.
- Swin: Liu et al. 2021, "Swin Transformer: Hierarchical Vision Transformer using Shifted
  Windows" (4x4 patches, 7x7 window attention with a relative position bias table, shifted
  windows on every second block, 2x2 patch merging between stages, mean-pooled head).
- MLP-Mixer: Tolstikhin et al. 2021, "MLP-Mixer: An all-MLP Architecture for Vision" (token
  MLP 0.5x the width across patches, channel MLP 4x, pre-norm, mean-pooled head).

Attention is explicit by default (as timm 0.6 wrote it); ``fused_attention=True`` switches to
``F.scaled_dot_product_attention``.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from .layers import Attention, PatchEmbed, Permute, TokenMean, mlp, transformer_block


class VisionTransformer(nn.Module):
    def __init__(
        self,
        dim: int,
        depth: int,
        heads: int,
        patch: int = 16,
        img_size: int = 224,
        num_classes: int = 1000,
        fused_attention: bool = False,
    ):
        super().__init__()
        self.patch_embed = PatchEmbed(dim, patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, (img_size // patch) ** 2 + 1, dim) * 0.02)
        norm = partial(nn.LayerNorm, eps=1e-6)
        self.blocks = nn.Sequential(
            *[
                transformer_block(
                    dim,
                    Attention(dim, heads, fused_attention=fused_attention),
                    mlp(dim, 4 * dim),
                    norm,
                )
                for _ in range(depth)
            ]
        )
        self.norm = norm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], 1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


def _windows(x: torch.Tensor, window: int) -> torch.Tensor:
    """(B, H, W, C) -> (B, windows, window * window, C)."""
    b, h, w, c = x.shape
    x = x.view(b, h // window, window, w // window, window, c).transpose(2, 3)
    return x.reshape(b, -1, window * window, c)


def _unwindows(x: torch.Tensor, res: int, window: int) -> torch.Tensor:
    """(B, windows, window * window, C) -> (B, res, res, C), the inverse of ``_windows``."""
    b, g, c = x.shape[0], res // window, x.shape[-1]
    return x.view(b, g, g, window, window, c).transpose(2, 3).reshape(b, res, res, c)


class WindowAttention(Attention):
    """Attention within ``window`` x ``window`` windows of a square token grid, cyclically
    shifted by ``shift`` (the shifted-window block) with the cross-region pairs masked out."""

    def __init__(
        self, dim: int, heads: int, res: int, window: int, shift: int, fused_attention=False
    ):
        super().__init__(dim, heads, fused_attention=fused_attention)
        if res <= window:  # the last stage's grid is one window: nothing to shift
            window, shift = res, 0
        self.res, self.window, self.shift = res, window, shift
        self.bias_table = nn.Parameter(torch.randn((2 * window - 1) ** 2, heads) * 0.02)
        yx = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij"))
        rel = (yx.flatten(1)[:, :, None] - yx.flatten(1)[:, None, :]) + window - 1
        self.register_buffer("bias_index", rel[0] * (2 * window - 1) + rel[1], persistent=False)
        mask = None
        if shift:
            pos = torch.arange(res)
            band = (pos >= res - window).long() + (pos >= res - shift).long()
            region = (band[:, None] * 3 + band[None, :])[None, :, :, None]  # 9 regions
            region = _windows(region, window)[0, ..., 0]  # (windows, N)
            mask = (region[:, :, None] != region[:, None, :]).float()[:, None] * -100.0
        self.register_buffer("mask", mask, persistent=False)  # (windows, 1, N, N)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        x = x.view(b, self.res, self.res, c)
        if self.shift:
            x = torch.roll(x, (-self.shift, -self.shift), (1, 2))
        bias = self.bias_table[self.bias_index].permute(2, 0, 1)  # (heads, N, N)
        if self.mask is not None:
            bias = bias + self.mask
        x = super().forward(_windows(x, self.window), bias)  # (B, windows, N, C)
        x = _unwindows(x, self.res, self.window)
        if self.shift:
            x = torch.roll(x, (self.shift, self.shift), (1, 2))
        return x.reshape(b, n, c)


class PatchMerging(nn.Module):
    """Concatenate each 2x2 neighbourhood (4C), LayerNorm, project to 2C without bias."""

    def __init__(self, dim: int, res: int):
        super().__init__()
        self.res = res
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, c = x.shape
        h = self.res // 2
        x = x.view(b, h, 2, h, 2, c).permute(0, 1, 3, 4, 2, 5).reshape(b, h * h, 4 * c)
        return self.reduction(self.norm(x))


def swin(
    dim: int,
    depths: tuple[int, ...],
    heads: tuple[int, ...],
    window: int = 7,
    img_size: int = 224,
    num_classes: int = 1000,
    fused_attention: bool = False,
) -> nn.Module:
    res = img_size // 4
    layers: list[nn.Module] = [PatchEmbed(dim, 4, norm=nn.LayerNorm)]
    for stage, (depth, h) in enumerate(zip(depths, heads, strict=True)):
        for i in range(depth):
            attn = WindowAttention(
                dim, h, res, window, window // 2 if i % 2 else 0, fused_attention
            )
            layers.append(transformer_block(dim, attn, mlp(dim, 4 * dim)))
        if stage < len(depths) - 1:
            layers.append(PatchMerging(dim, res))
            dim, res = 2 * dim, res // 2
    return nn.Sequential(*layers, nn.LayerNorm(dim), TokenMean(), nn.Linear(dim, num_classes))


def mixer(
    dim: int, depth: int, patch: int, img_size: int = 224, num_classes: int = 1000
) -> nn.Module:
    tokens = (img_size // patch) ** 2
    norm = partial(nn.LayerNorm, eps=1e-6)
    blocks = [
        transformer_block(
            dim,
            nn.Sequential(Permute(0, 2, 1), mlp(tokens, dim // 2), Permute(0, 2, 1)),
            mlp(dim, 4 * dim),
            norm,
        )
        for _ in range(depth)
    ]
    return nn.Sequential(
        PatchEmbed(dim, patch), *blocks, norm(dim), TokenMean(), nn.Linear(dim, num_classes)
    )
