"""A small GPT trained with cloudtrain's Trainer.

Character-level on the short text bundled in examples/data/ (or on synthetic tokens),
so it runs anywhere; the same script scales to a GPU or to many under torchrun:

    python examples/gpt.py --max-seconds 30                 # CPU demo, prints the summary
    python examples/gpt.py --device cuda --layers 12 --dim 768 --heads 12 --block 1024
    torchrun --nproc_per_node 8 examples/gpt.py --device cuda --steps 5000

The model: token + position embeddings, `layers` pre-norm blocks (causal
self-attention through scaled_dot_product_attention, a 4x GELU MLP), a final norm and
a head tied to the token embedding. Training FLOPs are about 6N + 12LHQT per token
(PaLM, appendix B); the Trainer measures them with torch's flop counter instead.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from cloudtrain.runtime import FitResult, TrainConfig, Trainer

TEXT = Path(__file__).resolve().parent / "data" / "harbour.txt"


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    block_size: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape  # batch, time, channels
        q, k, v = self.qkv(x).split(c, dim=2)  # each (B, T, C)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(  # (B, H, T, C/H)
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False),
            nn.GELU(),
            nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False),
            nn.Dropout(cfg.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.head.weight = self.tok.weight  # weight tying
        self.apply(self._init)
        for name, p in self.named_parameters():  # scaled init of residual projections
            if name.endswith(("proj.weight", "mlp.2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]  # idx: (B, T) token ids
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))  # (B, T, vocab)


def gpt_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


class TokenWindows(Dataset):
    """Every window of `block` tokens (input) and the same shifted by one (target)."""

    def __init__(self, tokens: torch.Tensor, block: int) -> None:
        self.tokens, self.block = tokens, block

    def __len__(self) -> int:
        return len(self.tokens) - self.block - 1

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.tokens[i : i + self.block + 1]
        return chunk[:-1], chunk[1:]


def text_tokens() -> tuple[torch.Tensor, int]:
    """Character-level tokens of the bundled text and the vocabulary size."""
    text = TEXT.read_text(encoding="utf-8")
    chars = sorted(set(text))
    index = {ch: i for i, ch in enumerate(chars)}
    return torch.tensor([index[ch] for ch in text], dtype=torch.long), len(chars)


def synthetic_tokens(n: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """Token ids with learnable structure: each token mostly follows from the previous."""
    g = torch.Generator().manual_seed(seed)
    step = torch.randint(1, vocab, (vocab,), generator=g)
    out = torch.empty(n, dtype=torch.long)
    out[0] = 0
    noise = torch.rand(n, generator=g) < 0.1
    random_ids = torch.randint(0, vocab, (n,), generator=g)
    for i in range(1, n):
        out[i] = random_ids[i] if noise[i] else (out[i - 1] + step[out[i - 1]]) % vocab
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", choices=("text", "synthetic"), default="text")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: time)")
    p.add_argument("--max-seconds", type=float, default=None, help="wall-clock budget")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--batch", type=int, default=32, help="global batch (sequences)")
    p.add_argument("--micro", default="auto", help="micro-batch or 'auto'")
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--vocab", type=int, default=256, help="vocabulary of synthetic data")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--precision", default="auto")
    p.add_argument("--compile", choices=("auto", "on", "off"), default="auto")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--checkpoint-every", type=int, default=None, help="steps")
    p.add_argument("--price", type=float, default=None, help="USD per hour, for cost so far")
    p.add_argument("--no-store", action="store_true", help="do not record the run")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p.parse_args(argv)


def build(args: argparse.Namespace) -> tuple[GPT, Dataset, Dataset]:
    if args.data == "text":
        tokens, vocab = text_tokens()
    else:
        vocab = args.vocab
        tokens = synthetic_tokens(200_000, vocab)
    split = int(0.9 * len(tokens))
    cfg = GPTConfig(vocab, args.block, args.layers, args.heads, args.dim)
    torch.manual_seed(0)
    model = GPT(cfg)
    return model, TokenWindows(tokens[:split], args.block), TokenWindows(tokens[split:], args.block)


def main(argv: list[str] | None = None) -> FitResult:
    """Train and print the summary; returns the FitResult."""
    args = parse(argv)
    if args.steps is None and args.max_seconds is None:
        args.max_seconds = 30.0
    model, train, val = build(args)
    # flags not given keep TrainConfig's defaults, which `cloudtrain run` sets through
    # the environment (checkpoint directory, node price)
    given = {"checkpoint_dir": args.checkpoint_dir, "price_usd_per_hour": args.price}
    config = TrainConfig(
        **{key: value for key, value in given.items() if value is not None},
        max_steps=args.steps,
        max_seconds=args.max_seconds,
        global_batch_size=args.batch,
        micro_batch_size=args.micro if args.micro == "auto" else int(args.micro),
        lr=args.lr,
        weight_decay=0.1,
        grad_clip_norm=1.0,
        device=args.device,
        precision=args.precision,
        compile={"auto": "auto", "on": True, "off": False}[args.compile],
        checkpoint_every_steps=args.checkpoint_every,
        store=not args.no_store,
        eval_batches=8,
        run_name=None,
        extra={"model": "gpt", "params": sum(p.numel() for p in model.parameters())},
    )
    trainer = Trainer(model, gpt_loss, train, config=config, eval_data=val)
    result = trainer.fit()
    if trainer.is_main:  # under torchrun, once rather than once per rank
        print(json.dumps(result.to_dict(), indent=2) if args.json else result.summary())
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
