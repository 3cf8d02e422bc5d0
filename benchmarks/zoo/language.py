"""Models beyond timm's image benchmark: three transformer language models on one token-model
shell, an LSTM language model and a wide MLP.

- GPT-2 124M: Radford et al. 2019, "Language Models are Unsupervised Multitask Learners", as
  nanoGPT lays it out (learned positions, pre-norm, GELU MLP x4, causal attention through
  ``F.scaled_dot_product_attention``, head tied to the token embedding).
- BERT-base: Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers"
  (word + position + token-type embeddings and a LayerNorm, post-norm blocks, the masked-LM
  head: dense + GELU + LayerNorm, decoder tied to the word embeddings with its own bias).
- Llama-style decoder: Touvron et al. 2023, "LLaMA: Open and Efficient Foundation Language
  Models" (RMSNorm pre-norm, SwiGLU feed-forward, rotary position embeddings of Su et al. 2021,
  no biases, untied head).
- LSTM LM: Zaremba et al. 2014, "Recurrent Neural Network Regularization", the medium model
  (650 units, 2 layers, dropout 0.5, 35 steps, 10k vocabulary).
- A wide MLP: 4096 features -> 4 x (Linear 8192 + GELU) -> 1000 classes.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from .layers import Attention, mlp, transformer_block


class TokenModel(nn.Module):
    """Embed -> blocks -> head transform -> vocabulary logits, optionally tied to the embedding."""

    def __init__(
        self,
        vocab: int,
        dim: int,
        blocks: list[nn.Module],
        head_in: nn.Module,
        positions: int = 0,
        token_types: int = 0,
        embed_norm: nn.Module | None = None,
        tied: bool = True,
        head_bias: bool = False,
    ):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(positions, dim) if positions else None
        self.token_type = nn.Embedding(token_types, dim) if token_types else None
        self.embed_norm = embed_norm or nn.Identity()
        self.blocks = nn.Sequential(*blocks)
        self.head_in = head_in
        self.head = nn.Linear(dim, vocab, bias=head_bias)
        for table in (self.tok, self.pos, self.token_type):  # GPT-2 / BERT's N(0, 0.02)
            if table is not None:
                nn.init.normal_(table.weight, std=0.02)
        if tied:
            self.head.weight = self.tok.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids)
        if self.pos is not None:
            x = x + self.pos(torch.arange(ids.shape[1], device=ids.device))
        if self.token_type is not None:  # one segment: every token is type 0
            x = x + self.token_type.weight[0]
        return self.head(self.head_in(self.blocks(self.embed_norm(x))))


def gpt2(
    vocab: int = 50257,
    seq_len: int = 1024,
    dim: int = 768,
    depth: int = 12,
    heads: int = 12,
    fused_attention: bool = True,
) -> nn.Module:
    blocks = [
        transformer_block(
            dim,
            Attention(dim, heads, causal=True, fused_attention=fused_attention),
            mlp(dim, 4 * dim),
        )
        for _ in range(depth)
    ]
    return TokenModel(vocab, dim, blocks, nn.LayerNorm(dim), positions=seq_len)


def bert(
    vocab: int = 30522,
    seq_len: int = 512,
    dim: int = 768,
    depth: int = 12,
    heads: int = 12,
    fused_attention: bool = True,
) -> nn.Module:
    norm = partial(nn.LayerNorm, eps=1e-12)
    blocks = [
        transformer_block(
            dim,
            Attention(dim, heads, fused_attention=fused_attention),
            mlp(dim, 4 * dim),
            norm,
            post_norm=True,
        )
        for _ in range(depth)
    ]
    transform = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), norm(dim))
    return TokenModel(
        vocab, dim, blocks, transform, seq_len, token_types=2, embed_norm=norm(dim), head_bias=True
    )


class Rotary(nn.Module):
    """Rotary position embedding of (..., N, head_dim), rotating the two halves."""

    def __init__(self, head_dim: int, seq_len: int, base: float = 10000.0):
        super().__init__()
        inv_freq = base ** -(torch.arange(0, head_dim, 2).float() / head_dim)
        angles = torch.outer(torch.arange(seq_len).float(), inv_freq).repeat(1, 2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-2]
        x1, x2 = x.chunk(2, -1)
        return x * self.cos[:n] + torch.cat([-x2, x1], -1) * self.sin[:n]


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def llama(
    vocab: int = 32000,
    seq_len: int = 1024,
    dim: int = 1024,
    depth: int = 8,
    heads: int = 16,
    hidden: int = 2816,
    fused_attention: bool = True,
) -> nn.Module:
    norm = partial(nn.RMSNorm, eps=1e-6)
    rotary = Rotary(dim // heads, seq_len)  # one table, shared by every layer
    attention = partial(
        Attention,
        dim,
        heads,
        bias=False,
        causal=True,
        fused_attention=fused_attention,
        rotary=rotary,
    )
    blocks = [transformer_block(dim, attention(), SwiGLU(dim, hidden), norm) for _ in range(depth)]
    return TokenModel(vocab, dim, blocks, norm(dim), tied=False)


class LSTMLM(nn.Module):
    def __init__(self, vocab: int = 10000, dim: int = 650, layers: int = 2, dropout: float = 0.5):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.drop = nn.Dropout(dropout)
        self.lstm = nn.LSTM(dim, dim, layers, dropout=dropout, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.drop(self.embed(ids)))
        return self.head(self.drop(out))


def wide_mlp(features: int = 4096, width: int = 8192, depth: int = 4, num_classes: int = 1000):
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Linear(width if i else features, width), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(width, num_classes))
