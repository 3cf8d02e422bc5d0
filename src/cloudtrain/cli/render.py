"""Rendering helpers shared by the commands: JSON of dataclasses, and rich tables."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table


def to_jsonable(value: Any) -> Any:
    """Dataclasses, tuples, paths and floats turned into plain JSON values (NaN -> null)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def split_list(values: Iterable[str] | None) -> list[str]:
    """Repeatable options that also take comma lists: ['A100,H100', 'L4'] -> 3 names."""
    return [part.strip() for value in values or () for part in value.split(",") if part.strip()]


def print_json(value: Any) -> None:
    json.dump(to_jsonable(value), sys.stdout, indent=2)
    sys.stdout.write("\n")


def console() -> Console:
    """A console that is 100 columns wide when output is not a terminal."""
    stdout = Console()
    if stdout.is_terminal:
        return stdout
    return Console(width=100)


def fmt(value: Any, digits: int = 2) -> str:
    """A table cell: '-' for None, fixed decimals for floats."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def table(
    title: str | None,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    right_align: Iterable[str] = (),
) -> Table:
    aligned = set(right_align)
    out = Table(title=title, title_justify="left", header_style="bold", pad_edge=False)
    for column in columns:
        out.add_column(column, justify="right" if column in aligned else "left", overflow="fold")
    for row in rows:
        out.add_row(*(fmt(cell) for cell in row))
    return out
