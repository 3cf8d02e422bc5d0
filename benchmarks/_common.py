"""Shared by the benchmark scripts: machine description and JSON output."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def write_result(name: str, payload: dict[str, Any], out: str | Path | None = None) -> Path:
    """Write `payload` with the date and machine to results/<name>.json (or `out`)."""
    path = Path(out) if out else RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"benchmark": name, "date": dt.date.today().isoformat(), "machine": machine()}
    record.update(payload)
    path.write_text(json.dumps(record, indent=2) + "\n")
    json.dump(record, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return path
