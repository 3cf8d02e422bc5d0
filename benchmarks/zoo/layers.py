"""Building blocks shared by every family in the zoo, written once.

Convolutional pieces: conv-norm-act (the conv-BN-ReLU unit of He et al. 2016), squeeze-and-
excitation (Hu et al. 2018, "Squeeze-and-Excitation Networks") and a generic residual wrapper.
Transformer pieces: multi-head attention (Vaswani et al. 2017, "Attention Is All You Need"),
written explicitly (``q @ k^T``, softmax, ``@ v``) or through ``F.scaled_dot_product_attention``,
the two-layer MLP, and a pre- or post-norm block built from a token mixer and a feed-forward.

Dropout and stochastic depth are left out everywhere: they have no parameters and timm's
benchmark runs its models at their (zero) defaults.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

Layer = Callable[..., nn.Module]


def make_divisible(value: float, divisor: int = 8, round_limit: float = 0.9) -> int:
    """Round to the nearest multiple of ``divisor``, never more than 10% below ``value``
    (the channel rounding of the MobileNet and EfficientNet papers)."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < round_limit * value else rounded


class ConvNormAct(nn.Sequential):
    """Conv (same padding) -> BatchNorm -> activation; ``norm=None`` gives a biased conv."""

    def __init__(
        self,
        cin: int,
        cout: int,
        kernel: int = 3,
        stride: int = 1,
        groups: int = 1,
        act: Layer | None = nn.ReLU,
        norm: Layer | None = nn.BatchNorm2d,
    ):
        layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=not norm)]
        layers += [norm(cout)] if norm else []
        layers += [act()] if act else []
        super().__init__(*layers)


class SqueezeExcite(nn.Module):
    """Channel gating: x * gate(expand(act(reduce(avgpool(x))))), both 1x1 convs biased."""

    def __init__(self, channels: int, reduced: int, act: Layer = nn.ReLU, gate: Layer = nn.Sigmoid):
        super().__init__()
        self.fc = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Conv2d(channels, reduced, 1),
            act(),
            nn.Conv2d(reduced, channels, 1),
            gate(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.fc(x)


class Residual(nn.Module):
    """``post(body(x) + shortcut(x))``; the shortcut defaults to the identity, post to nothing."""

    def __init__(
        self, body: nn.Module, shortcut: nn.Module | None = None, post: nn.Module | None = None
    ):
        super().__init__()
        self.body = body
        self.shortcut = nn.Identity() if shortcut is None else shortcut
        self.post = nn.Identity() if post is None else post

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(self.body(x) + self.shortcut(x))


def projection(cin: int, cout: int, stride: int) -> nn.Module | None:
    """The 1x1 conv-BN shortcut where a residual block changes width or resolution."""
    return ConvNormAct(cin, cout, 1, stride, act=None) if cin != cout or stride != 1 else None


def classifier(channels: int, num_classes: int, norm: Layer | None = None) -> nn.Sequential:
    """Global average pool -> (norm) -> linear, the head of every CNN here."""
    layers = [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    layers += [norm(channels)] if norm else []
    return nn.Sequential(*layers, nn.Linear(channels, num_classes))


class Permute(nn.Module):
    def __init__(self, *dims: int):
        super().__init__()
        self.dims = dims

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(*self.dims)


class LayerScale(nn.Module):
    """Learned per-channel scale of a residual branch (Touvron et al. 2021, CaiT)."""

    def __init__(self, dim: int, init: float = 1e-6):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class PatchEmbed(nn.Module):
    """Non-overlapping ``patch`` x ``patch`` conv, flattened to (B, tokens, dim)."""

    def __init__(self, dim: int, patch: int, cin: int = 3, norm: Layer | None = None):
        super().__init__()
        self.proj = nn.Conv2d(cin, dim, patch, patch)
        self.norm = norm(dim) if norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x).flatten(2).transpose(1, 2))


class TokenMean(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(1)


def mlp(dim: int, hidden: int, act: Layer = nn.GELU) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim, hidden), act(), nn.Linear(hidden, dim))


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None = None,
    causal: bool = False,
    fused: bool = False,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + bias) v over the last two dims; any leading dims."""
    if fused:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal)
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)
    if bias is not None:
        scores = scores + bias
    if causal:
        n = scores.shape[-1]
        future = torch.ones(n, n, dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return scores.softmax(-1) @ v


class Attention(nn.Module):
    """Multi-head self-attention over (..., tokens, dim) with one fused qkv projection.

    ``fused_attention`` switches the explicit matmul-softmax-matmul to
    ``F.scaled_dot_product_attention``; ``rotary`` (a module applied to q and k) adds
    rotary position embeddings.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        bias: bool = True,
        causal: bool = False,
        fused_attention: bool = False,
        rotary: nn.Module | None = None,
    ):
        super().__init__()
        self.heads, self.causal, self.fused = heads, causal, fused_attention
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)
        self.rotary = rotary

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor | None = None) -> torch.Tensor:
        # (..., N, 3C) -> 3 x (..., heads, N, head_dim)
        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, -1)).movedim(-3, 0).transpose(-3, -2)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        out = attend(q, k, v, attn_bias, self.causal, self.fused)
        return self.proj(out.transpose(-3, -2).flatten(-2))


def transformer_block(
    dim: int,
    mixer: nn.Module,
    ffn: nn.Module,
    norm: Layer = nn.LayerNorm,
    post_norm: bool = False,
) -> nn.Sequential:
    """x + mixer(norm(x)), then x + ffn(norm(x)) (pre-norm); or norm(x + f(x)) (post-norm)."""
    if post_norm:
        return nn.Sequential(Residual(mixer, post=norm(dim)), Residual(ffn, post=norm(dim)))
    return nn.Sequential(
        Residual(nn.Sequential(norm(dim), mixer)), Residual(nn.Sequential(norm(dim), ffn))
    )
