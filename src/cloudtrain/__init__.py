"""cloudtrain: fast, cheap and safe deep-learning training on rented GPU servers.

The main entry points are imported lazily, so `import cloudtrain` (and the CLI)
stay fast and do not load torch until a training class is used:

- `cloudtrain.Trainer`, `cloudtrain.TrainConfig` (runtime)
- `cloudtrain.load_catalog` (catalog)
- `cloudtrain.plan_job` is `cloudtrain.plan.plan` (planner)
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "Trainer": ("cloudtrain.runtime", "Trainer"),
    "TrainConfig": ("cloudtrain.runtime", "TrainConfig"),
    "load_catalog": ("cloudtrain.catalog", "load_catalog"),
    "plan_job": ("cloudtrain.plan", "plan"),
    "Workload": ("cloudtrain.plan", "Workload"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'cloudtrain' has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    return getattr(importlib.import_module(module_name), attribute)
