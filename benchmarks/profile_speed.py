"""How long `cloudtrain.profiling.profile_model` takes to trace one training step of
GPT-2 124M (12 x 768, 12 heads, vocab 50257, T=1024, tied head, SDPA) and ResNet-50
(224 x 224), bf16 autocast, for a model built on the CPU and one built on the meta
device: the first profile of the process (lazy imports included), the best of
`--repeat` more, and a cache hit. Target: under 10 s each. Writes JSON.

    .venv/bin/python benchmarks/profile_speed.py [--repeat 3] [--out PATH]

The models come from `benchmarks/zoo` (MODELS["gpt2"], MODELS["resnet50"]) when it is
there, else from the small definitions below.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_result
from cloudtrain.profiling import profile_model

TARGET_S = 10.0


# -- local definitions, used when benchmarks/zoo is missing ------------------------------


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class _GPT2(nn.Module):
    def __init__(self, vocab=50257, t=1024, dim=768, depth=12, heads=12) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(t, dim)
        self.blocks = nn.Sequential(*(_Block(dim, heads) for _ in range(depth)))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.head(self.ln(self.blocks(self.wte(ids) + self.wpe(pos))))


class _Bottleneck(nn.Module):
    def __init__(self, c_in: int, width: int, stride: int) -> None:
        super().__init__()
        c_out = width * 4
        self.body = nn.Sequential(
            nn.Conv2d(c_in, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True), nn.Conv2d(width, c_out, 1, bias=False), nn.BatchNorm2d(c_out),
        )  # fmt: skip
        self.skip = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.skip = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.skip(x))


def _resnet50(classes: int = 1000) -> nn.Module:
    layers: list[nn.Module] = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
    ]  # fmt: skip
    c_in = 64
    for i, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512), strict=True)):
        for j in range(blocks):
            layers.append(_Bottleneck(c_in, width, 2 if j == 0 and i > 0 else 1))
            c_in = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, classes)]
    return nn.Sequential(*layers)


def _cross_entropy(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def _cases() -> tuple[str, dict[str, tuple[Callable[[], nn.Module], Any, Callable]]]:
    """name -> (builder, batch of 2, loss_fn), and where the models came from."""
    try:
        from zoo import MODELS, example_batch, loss_fn

        cases = {}
        for key, label in (("gpt2", "gpt2-124m"), ("resnet50", "resnet50")):
            zoo_model = MODELS[key]
            cases[label] = (zoo_model.build, example_batch(zoo_model, 2), loss_fn(zoo_model))
        return "benchmarks/zoo", cases
    except ImportError:
        ids = torch.randint(0, 50257, (2, 1024))
        images = torch.randn(2, 3, 224, 224), torch.randint(0, 1000, (2,))
        return "local definitions", {
            "gpt2-124m": (_GPT2, (ids, torch.randint(0, 50257, (2, 1024))), _cross_entropy),
            "resnet50": (_resnet50, images, _cross_entropy),
        }


def _profile(model: nn.Module, batch: Any, loss_fn: Callable, cache: bool):
    start = time.perf_counter()
    profile = profile_model(model, batch, loss_fn, precision="bf16", cache=cache)
    return time.perf_counter() - start, profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    os.environ["CLOUDTRAIN_HOME"] = tempfile.mkdtemp(prefix="profile_speed_")  # a cold cache
    source, cases = _cases()
    results: dict[str, Any] = {}
    first_call_s = None
    for name, (build, batch, loss_fn) in cases.items():
        for built_on in ("cpu", "meta"):
            torch.manual_seed(0)
            with torch.device(built_on):
                model = build()
            first, profile = _profile(model, batch, loss_fn, cache=False)
            if first_call_s is None:
                first_call_s = first
            warm = min(_profile(model, batch, loss_fn, cache=False)[0] for _ in range(args.repeat))
            _profile(model, batch, loss_fn, cache=True)  # fills the cache
            hit_s, hit = _profile(model, batch, loss_fn, cache=True)
            assert hit.extra["traced"] is False
            results[f"{name} (built on {built_on})"] = {
                "first_s": round(first, 3),
                "profile_s": round(warm, 3),
                "cache_hit_s": round(hit_s, 4),
                "traced_on": profile.traced_on,
                "traced_batches": list(profile.traced_batches),
                "op_kinds": len(profile.ops),
                "ops_per_step": sum(op.count for op in profile.ops),
                "parameters": profile.parameters,
                "forward_gflops_per_sample": round(profile.forward_flops_per_sample() / 1e9, 3),
                "step_gflops_per_sample": round(profile.flops_per_sample() / 1e9, 3),
                "activation_mb": {
                    "fixed": round(profile.activation_bytes.fixed / 2**20, 1),
                    "per_sample": round(profile.activation_bytes.per_sample / 2**20, 1),
                },
                "notes": list(profile.notes),
                "under_target": warm < TARGET_S and first < TARGET_S,
            }
            del model
    payload = {
        "models_from": source,
        "precision": "bf16",
        "first_profile_of_process_s": round(first_call_s or 0.0, 3),
        "cases": results,
        "target": f"under {TARGET_S:g} s per profile (GPT-2 124M, ResNet-50)",
    }
    write_result("profile_speed", payload, args.out)


if __name__ == "__main__":
    main()
