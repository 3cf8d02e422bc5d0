"""GPU name matching: exact after normalisation, never fuzzy.

Names and aliases are compared after lower-casing, dropping every character that is
not a letter or digit, and dropping leading vendor/brand words ("NVIDIA", "Tesla",
"GeForce", "Quadro", "AMD", "Instinct", "Radeon"). So "NVIDIA H100 PCIe",
"h100-pcie" and "H100 PCIe" are one name, while "NVIDIA H100 NVL" stays a different
one: nothing is matched by prefix or similarity.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from cloudtrain.catalog.types import GPUSpec

_NOT_ALNUM = re.compile(r"[^0-9a-z]+")
_BRAND_WORDS = ("nvidia", "tesla", "geforce", "quadro", "amd", "instinct", "radeon")
_cache: dict[str, str] = {}


def normalize_gpu_name(name: str) -> str:
    """The comparison form of a GPU name: 'NVIDIA A100-SXM4-80GB' -> 'a100sxm480gb'."""
    known = _cache.get(name)
    if known is not None:
        return known
    words = [w for w in _NOT_ALNUM.split(name.lower()) if w]
    while len(words) > 1 and words[0] in _BRAND_WORDS:
        words.pop(0)
    normal = "".join(words)
    if len(_cache) < 10_000:
        _cache[name] = normal
    return normal


class AliasClash(ValueError):
    """Two GPUs claim the same (normalised) name or alias."""

    def __init__(self, alias: str, first: GPUSpec, second: GPUSpec) -> None:
        super().__init__(f"'{alias}' names both GPU '{first.name}' and GPU '{second.name}'")
        self.alias = alias
        self.first = first
        self.second = second


def gpu_index(gpus: Iterable[GPUSpec]) -> dict[str, GPUSpec]:
    """Normalised name and every normalised alias -> spec; raises AliasClash on a clash."""
    index: dict[str, GPUSpec] = {}
    for spec in gpus:
        for alias in (spec.name, *spec.aliases):
            key = normalize_gpu_name(alias)
            if not key:
                continue
            other = index.get(key)
            if other is not None and other is not spec:
                raise AliasClash(alias, other, spec)
            index[key] = spec
    return index
