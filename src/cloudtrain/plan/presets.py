"""Named workloads with cited shapes, and reading a workload from a TOML file.

A TOML file holds a `[workload]` table (or its keys at the top level) with the
`Workload` field names; `preset = "llama-7b"` starts from a preset and the other keys
override it. An optional `[constraints]` table is returned as a plain dict for the
caller to merge with its own flags.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from cloudtrain.errors import DataError, UnknownNameError, UserError, did_you_mean
from cloudtrain.plan.workload import Workload

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

_IMAGENET_1K_TRAIN = 1_281_167
"""Training images in ImageNet-1k (ILSVRC 2012)."""

PRESETS: dict[str, Workload] = {
    "gpt2-124m": Workload(
        name="gpt2-124m",
        parameters=124.44e6,
        embedding_parameters=1024 * 768,
        layers=12,
        hidden_size=768,
        heads=12,
        seq_len=1024,
        vocab_size=50257,
        global_batch=512,
        tokens=10e9,
        source="Radford et al. 2019 (GPT-2 small: 12 layers, 768 hidden, 12 heads, 1024 ctx); "
        "124M with tied embeddings as counted by nanoGPT/llm.c; 10B tokens at 0.5M-token "
        "batches as in llm.c discussion #481",
    ),
    "gpt2-1.5b": Workload(
        name="gpt2-1.5b",
        parameters=1557.6e6,
        embedding_parameters=1024 * 1600,
        layers=48,
        hidden_size=1600,
        heads=25,
        seq_len=1024,
        vocab_size=50257,
        global_batch=1024,
        tokens=32e9,
        source="Radford et al. 2019 (GPT-2 XL: 48 layers, 1600 hidden, 25 heads); 1.56B "
        "parameters; 32B tokens at 1M-token batches as in llm.c discussion #677",
    ),
    "bert-base": Workload(
        name="bert-base",
        parameters=110e6,
        embedding_parameters=(512 + 2) * 768,  # the word embedding is also the MLM decoder
        layers=12,
        hidden_size=768,
        heads=12,
        seq_len=512,
        vocab_size=30522,
        global_batch=256,
        tokens=1e6 * 256 * 512,
        source="Devlin et al. 2019 (BERT-base: 110M, 12 layers, 768 hidden, 12 heads); "
        "1M steps of 256 sequences x 512 tokens; the MLM decoder is tied to the word "
        "embedding, a 768 x 30522 matmul on every token, so only the position and "
        "token-type tables are left out of 6N",
    ),
    "bert-large": Workload(
        name="bert-large",
        parameters=340e6,
        embedding_parameters=(512 + 2) * 1024,  # the word embedding is also the MLM decoder
        layers=24,
        hidden_size=1024,
        heads=16,
        seq_len=512,
        vocab_size=30522,
        global_batch=256,
        tokens=1e6 * 256 * 512,
        source="Devlin et al. 2019 (BERT-large: 340M, 24 layers, 1024 hidden, 16 heads); "
        "1M steps of 256 sequences x 512 tokens",
    ),
    "llama-7b": Workload(
        name="llama-7b",
        parameters=6.74e9,
        embedding_parameters=32000 * 4096,
        layers=32,
        hidden_size=4096,
        heads=32,
        seq_len=2048,
        vocab_size=32000,
        global_batch=2048,
        tokens=1.0e12,
        source="Touvron et al. 2023, LLaMA, Table 2 (6.7B: 32 layers, 4096 dim, 32 heads, "
        "2048 ctx, 4M-token batches, 1.0T tokens)",
    ),
    "llama3-8b": Workload(
        name="llama3-8b",
        parameters=8.03e9,
        embedding_parameters=128256 * 4096,
        layers=32,
        hidden_size=4096,
        heads=32,
        seq_len=8192,
        vocab_size=128256,
        global_batch=512,
        tokens=15e12,
        source="Llama 3 8B (Meta 2024, 'The Llama 3 Herd of Models'): 32 layers, 4096 dim, "
        "32 heads, 8192 ctx, 128K vocab, 15T tokens",
    ),
    "llama-70b": Workload(
        name="llama-70b",
        parameters=68.98e9,
        embedding_parameters=32000 * 8192,
        layers=80,
        hidden_size=8192,
        heads=64,
        seq_len=4096,
        vocab_size=32000,
        global_batch=1024,
        tokens=2.0e12,
        source="Touvron et al. 2023, Llama 2, Table 1 and released config (70B: 80 layers, "
        "8192 dim, 64 heads, 4096 ctx, 4M-token batches, 2.0T tokens)",
    ),
    "vit-b16": Workload(
        name="vit-b16",
        parameters=86.6e6,
        layers=12,
        hidden_size=768,
        heads=12,
        seq_len=197,
        global_batch=4096,
        samples_per_epoch=_IMAGENET_1K_TRAIN,
        epochs=300,
        data_kind="images",
        source="Dosovitskiy et al. 2021, ViT (ViT-B/16: 86M, 12 layers, 768 hidden, 12 heads, "
        "196 patches + class token at 224px; ImageNet 300 epochs at batch 4096)",
    ),
    "resnet50": Workload(
        name="resnet50",
        parameters=25.56e6,
        forward_flops_per_sample=2 * 4.09e9,
        activation_bytes_per_sample=44e6,
        global_batch=256,
        samples_per_epoch=_IMAGENET_1K_TRAIN,
        epochs=90,
        data_kind="images",
        source="He et al. 2016 (ResNet-50, 25.6M parameters; 4.09G multiply-adds per 224px "
        "image as torchvision lists, x2 for FLOPs; ImageNet 90 epochs at batch 256); "
        "activations 44 MB/image under bf16 autocast, measured with "
        "torch.autograd.graph.saved_tensors_hooks",
    ),
}

_FIELDS = {f.name for f in dataclasses.fields(Workload)}
_INT_FIELDS = {"global_batch", "layers", "hidden_size", "heads", "seq_len", "vocab_size"}


def preset(name: str) -> Workload:
    """The preset workload `name`; UnknownNameError listing the presets."""
    found = PRESETS.get(name.lower())
    if found is None:
        raise UnknownNameError("workload preset", name, PRESETS)
    return found


def workload_from_mapping(values: dict[str, Any], *, where: str = "workload") -> Workload:
    """A Workload from a dict of field values; `preset` names a starting point."""
    values = dict(values)
    base_name = values.pop("preset", None)
    unknown = sorted(set(values) - _FIELDS)
    if unknown:
        raise UserError(f"{where}: unknown key '{unknown[0]}'{did_you_mean(unknown[0], _FIELDS)}")
    for key in _INT_FIELDS & set(values):
        if values[key] is not None:
            values[key] = int(values[key])
    if base_name is not None:
        base = preset(str(base_name))
        values.setdefault("name", base.name)
        if "tokens" in values or "samples_per_epoch" in values:
            # The new data amount replaces the preset's, whichever form it takes.
            values.setdefault("tokens", None)
            values.setdefault("samples_per_epoch", None)
        return base.replace(**values)
    values.setdefault("name", "custom")
    if "parameters" not in values or "global_batch" not in values:
        raise UserError(f"{where}: give 'parameters' and 'global_batch' (or a 'preset')")
    try:
        return Workload(**values)
    except TypeError as error:
        raise UserError(f"{where}: {error}") from None


def load_workload_file(path: str | Path) -> tuple[Workload, dict[str, Any]]:
    """Read a workload TOML file; returns the workload and its `[constraints]` table."""
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"workload file {file} does not exist") from None
    except tomllib.TOMLDecodeError as error:
        raise DataError(file, f"not valid TOML: {error}") from None
    constraints = data.pop("constraints", {})
    table = data.pop("workload", None)
    if table is None:
        table = data
    elif data:
        raise DataError(file, f"unexpected top-level key '{next(iter(data))}'")
    try:
        return workload_from_mapping(table, where=str(file)), dict(constraints)
    except DataError:
        raise
    except UserError as error:
        message = str(error)
        if not message.startswith(str(file)):
            message = f"{file}: {message}"
        raise DataError(file, message.split(": ", 1)[1]) from None
