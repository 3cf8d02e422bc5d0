"""A pickle of a loaded catalog, reused while none of its source files changed.

Only large catalogs are cached (imported SkyPilot catalogs run to tens of thousands of
rows; the bundled one parses in milliseconds). The key covers the cloudtrain version,
the record types' fields, the kinds loaded, and every source file's path, size and
modification time; a stale, unreadable or foreign file is ignored and rewritten.
Files live in `$CLOUDTRAIN_HOME/cache/`; `rm -r` it at any time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle
from collections.abc import Sequence
from pathlib import Path

from cloudtrain import __version__, paths
from cloudtrain.catalog.sources import Source
from cloudtrain.catalog.types import (
    AchievableRate,
    Catalog,
    ExchangeRate,
    GPUSpec,
    GridIntensity,
    Offer,
    ProviderPUE,
    Region,
)

MIN_BYTES = 1_000_000
"""Catalogs whose sources total fewer bytes are parsed every time."""
KEEP = 4
"""Cache files kept (the most recently used)."""
_RECORDS = (
    GPUSpec,
    Offer,
    Region,
    GridIntensity,
    ProviderPUE,
    ExchangeRate,
    AchievableRate,
    Catalog,
)


def cache_dir() -> Path:
    return paths.cache_dir()


def key_for(sources: Sequence[Source], kinds: Sequence[str]) -> str | None:
    """The cache key of these sources, or None when they are too small to be worth caching."""
    if sum(source.size for source in sources) < MIN_BYTES:
        return None
    digest = hashlib.sha256()
    digest.update(f"{__version__}\n{','.join(kinds)}\n".encode())
    for record in _RECORDS:
        names = ",".join(f.name for f in dataclasses.fields(record))
        digest.update(f"{record.__name__}:{names}\n".encode())
    for source in sources:
        if source.path is None:
            identity = hashlib.sha256((source.content or "").encode()).hexdigest()
        else:
            identity = f"{source.size}:{source.mtime_ns}"
        digest.update(f"{source.shown}\t{identity}\n".encode())
    return digest.hexdigest()[:32]


def load(key: str) -> Catalog | None:
    """The cached catalog for `key`, or None (missing, unreadable or not a Catalog)."""
    path = cache_dir() / f"catalog-{key}.pickle"
    try:
        with path.open("rb") as handle:
            catalog = pickle.load(handle)
        os.utime(path)  # most recently used
    except Exception:  # a broken cache file is just a miss
        return None
    return catalog if isinstance(catalog, Catalog) else None


def store(key: str, catalog: Catalog) -> None:
    """Write the cache file atomically and drop the least recently used beyond KEEP."""
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"catalog-{key}.pickle"
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as handle:
            pickle.dump(catalog, handle, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
        old = sorted(directory.glob("catalog-*.pickle"), key=lambda p: p.stat().st_mtime_ns)
        for stale in old[:-KEEP]:
            stale.unlink(missing_ok=True)
    except OSError:
        return  # a read-only home only costs speed
