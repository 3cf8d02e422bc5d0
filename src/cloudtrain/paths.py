"""Where cloudtrain keeps its files.

Everything lives under one directory, `CLOUDTRAIN_HOME` (default `~/.cloudtrain`):

- `store.db`       the run store (SQLite)
- `catalog/*.csv`  the user's own catalog rows (prices, GPUs, regions) and imports
- `config.toml`    user-level settings, under `./cloudtrain.toml`, `CLOUDTRAIN_<SECTION>_<KEY>`
                   and flags (see `cloudtrain.settings`, `cloudtrain config show`)
"""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "CLOUDTRAIN_HOME"
DEFAULT_HOME = Path("~/.cloudtrain")


def home_dir() -> Path:
    """The cloudtrain home directory (not created here)."""
    configured = os.environ.get(HOME_ENV)
    return Path(configured).expanduser() if configured else DEFAULT_HOME.expanduser()


def user_catalog_dir() -> Path:
    """Directory of the user's catalog CSVs, merged over the bundled catalog."""
    return home_dir() / "catalog"


def cache_dir() -> Path:
    """Caches that can be rebuilt at any time (parsed catalogs, model profiles)."""
    return home_dir() / "cache"


def store_path() -> Path:
    """Default location of the run store."""
    return home_dir() / "store.db"
