"""Reading catalog CSV files: comment lines, header checks, typed cells, exact error places.

A catalog CSV is UTF-8 with one header row; lines whose first non-blank character is
`#` and blank lines are skipped (line numbers in errors still count them). Every cell
is parsed by its column's parser; an empty cell is `None` (or the column's default).
A bad cell raises `DataError` naming file, line, column and the problem, e.g.
"offers.csv:14: column 'gpu_count': expected a positive integer, got 'x'".
"""

from __future__ import annotations

import csv
import datetime as dt
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cloudtrain.errors import DataError, did_you_mean


class CellError(ValueError):
    """A cell (or a row, when `column` is None) that cannot be used; the loader adds file:line."""

    def __init__(self, problem: str, column: str | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.column = column


Parser = Callable[[str], Any]


@dataclass(frozen=True)
class Column:
    """One CSV column and the record field it fills."""

    name: str
    """Header name in the CSV file."""
    field: str
    """Keyword of the record (dataclass field or loader-internal name)."""
    parse: Parser
    """Turns a non-empty, stripped cell into a value; raises CellError with the problem."""
    required: bool = False
    """The column must be present and every cell non-empty."""
    default: Any = None
    """Value of an empty cell in an optional column."""


# ---------------------------------------------------------------- cell parsers


def text(cell: str) -> str:
    return cell


def positive_int(cell: str) -> int:
    try:
        value = int(cell)
    except ValueError:
        value = 0
    if value <= 0:
        raise CellError(f"expected a positive integer, got '{cell}'")
    return value


def _number(cell: str, *, allow_zero: bool) -> float:
    try:
        value = float(cell)
    except ValueError:
        value = float("nan")
    if value != value or value in (float("inf"), float("-inf")) or value < 0:
        bound = ">= 0" if allow_zero else "> 0"
        raise CellError(f"expected a number {bound}, got '{cell}'")
    if value == 0 and not allow_zero:
        raise CellError(f"expected a number > 0, got '{cell}'")
    return value


def non_negative(cell: str) -> float:
    return _number(cell, allow_zero=True)


def positive(cell: str) -> float:
    return _number(cell, allow_zero=False)


def at_least_one(cell: str) -> float:
    value = _number(cell, allow_zero=False)
    if value < 1:
        raise CellError(f"expected a number >= 1, got '{cell}'")
    return value


def iso_date(cell: str) -> str:
    """An ISO date 'YYYY-MM-DD', kept as text."""
    try:
        dt.date.fromisoformat(cell)
    except ValueError:
        raise CellError(f"expected an ISO date YYYY-MM-DD, got '{cell}'") from None
    if len(cell) != 10:
        raise CellError(f"expected an ISO date YYYY-MM-DD, got '{cell}'")
    return cell


def name_list(cell: str) -> tuple[str, ...]:
    """A '|'-separated list; blank items are dropped."""
    return tuple(item.strip() for item in cell.split("|") if item.strip())


def one_of(*choices: str) -> Parser:
    allowed = frozenset(choices)

    def parse(cell: str) -> str:
        if cell not in allowed:
            raise CellError(f"expected one of {', '.join(choices)}, got '{cell}'")
        return cell

    return parse


# ---------------------------------------------------------------- reading files


@dataclass(frozen=True)
class RawTable:
    """A CSV file split into its header and data rows, with original line numbers."""

    path: str
    header: tuple[str, ...]
    header_line: int
    lines: list[int]
    """Line number (1-based, comments counted) of each data row."""
    rows: list[list[str]]
    """Cells of each data row."""
    padded: bool = True
    """Some cell may have surrounding blanks (False: no cell needs stripping)."""


_OTHER_ASCII_BLANKS = ("\t", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f")
"""ASCII characters besides space and newline that str.strip() removes."""


def _maybe_padded(content: str) -> bool:
    """False only if surely no cell starts or ends with whitespace (fast substring checks)."""
    if not content.isascii() or content[:1] == " " or content.rstrip("\n")[-1:] == " ":
        return True
    if any(blank in content for blank in _OTHER_ASCII_BLANKS):
        return True
    return any(edge in content for edge in (", ", " ,", "\n ", " \n"))


def _plain(content: str) -> bool:
    """True if no line is blank, a comment or starts with whitespace (no filtering needed)."""
    if not content or content[0] in "# \t\n" or "\r" in content:
        return False
    return not any(mark in content for mark in ("\n#", "\n\n", "\n ", "\n\t"))


def _numbered_rows(content: str, path: str) -> tuple[list[int], list[list[str]]]:
    """(line numbers, cells) of the rows that are not blank and not comments."""
    lines = content.splitlines()
    if _plain(content):
        keep, kept = list(range(1, len(lines) + 1)), lines
    else:
        keep = [n for n, line in enumerate(lines, 1) if line.strip() and line.lstrip()[0] != "#"]
        kept = [lines[n - 1] for n in keep]
    reader = csv.reader(kept)
    try:
        rows = list(reader)
        if len(rows) == len(kept):  # one line per row: no quoted line breaks
            return keep, rows
        reader = csv.reader(kept)
        rows, numbers = [], []
        for cells in reader:
            rows.append(cells)
            numbers.append(keep[reader.line_num - 1])
        return numbers, rows
    except csv.Error as error:
        raise DataError(path, f"malformed CSV: {error}", line=keep[reader.line_num - 1]) from None


def read_table(path: str | Path, content: str | None = None) -> RawTable:
    """Read a catalog CSV (from `content` if given, else from `path`)."""
    shown = str(path)
    if content is None:
        try:
            content = Path(path).read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as error:
            raise DataError(shown, f"cannot read: {error}") from None
    numbers, rows = _numbered_rows(content, shown)
    if not rows:
        raise DataError(shown, "no header row (the file is empty or all comments)")
    header = tuple(cell.strip() for cell in rows[0])
    padded = _maybe_padded(content)
    return RawTable(shown, header, numbers[0], numbers[1:], rows[1:], padded)


def check_header(table: RawTable, columns: tuple[Column, ...], kind: str) -> list[int | None]:
    """Index of each column in the file (None: absent); errors on unknown or missing columns."""
    known = {column.name for column in columns}
    seen: set[str] = set()
    for name in table.header:
        if name in seen:
            raise DataError(table.path, f"column '{name}' appears twice", line=table.header_line)
        seen.add(name)
        if name not in known:
            hint = did_you_mean(name, known)
            raise DataError(
                table.path,
                f"unknown column '{name}' for {kind}.csv{hint}",
                line=table.header_line,
            )
    for column in columns:
        if column.required and column.name not in seen:
            raise DataError(
                table.path,
                f"missing column '{column.name}' (required in {kind}.csv)",
                line=table.header_line,
            )
    position = {name: index for index, name in enumerate(table.header)}
    return [position.get(column.name) for column in columns]


def _check_widths(table: RawTable) -> None:
    width = len(table.header)
    if set(map(len, table.rows)) <= {width}:
        return
    for line, cells in zip(table.lines, table.rows, strict=True):
        if len(cells) != width:
            problem = f"expected {width} cells as in the header, got {len(cells)}"
            raise DataError(table.path, problem, line=line)


# Parsers with a whole-column fast path: C-level conversion, then one range check.
_FAST: dict[Parser, tuple[Callable[[str], Any], Callable[[list[Any]], bool]]] = {
    text: (str, lambda values: True),  # shared, not converted
    positive_int: (int, lambda values: min(values) > 0),
    non_negative: (float, lambda values: min(values) >= 0 and all(map(math.isfinite, values))),
    positive: (float, lambda values: min(values) > 0 and all(map(math.isfinite, values))),
}


class _BadCell(Exception):
    def __init__(self, row: int, problem: str) -> None:
        self.row = row
        self.problem = problem


def _slow_column(cells: list[str], column: Column) -> list[Any]:
    """Each distinct value parsed once; _BadCell at the first bad cell."""
    values: dict[str, Any] = {}
    bad: dict[str, str] = {}
    for cell in set(cells):
        if not cell:
            if column.required:
                bad[cell] = "value is missing"
            else:
                values[cell] = column.default
            continue
        try:
            values[cell] = column.parse(cell)
        except CellError as error:
            bad[cell] = error.problem
    if bad:
        row = min(cells.index(cell) for cell in bad)
        raise _BadCell(row, bad[cells[row]])
    return list(map(values.__getitem__, cells))


def _shared(cells: list[str]) -> list[str]:
    """The same cells, equal strings made one object (less memory, smaller cache pickles)."""
    first: dict[str, str] = {}
    return list(map(first.setdefault, cells, cells))


def _parse_column(cells: list[str], column: Column) -> list[Any]:
    fast = _FAST.get(column.parse)
    if fast is not None and cells and "" not in cells:
        convert, in_range = fast
        if convert is str:
            return _shared(cells)
        try:
            values = list(map(convert, cells))
            if in_range(values):
                return values
        except ValueError:
            pass
    return _slow_column(cells, column)


def parse_table(table: RawTable, columns: tuple[Column, ...], kind: str) -> dict[str, list[Any]]:
    """Column field -> its parsed values, one per data row (row order = `table.lines`).

    Raises DataError naming the earliest bad cell: file:line: column 'name': problem.
    """
    indexes = check_header(table, columns, kind)
    _check_widths(table)
    by_position = list(zip(*table.rows, strict=True)) if table.rows else [() for _ in table.header]
    count = len(table.rows)
    values: dict[str, list[Any]] = {}
    errors: list[tuple[int, int, str]] = []
    for order, (index, column) in enumerate(zip(indexes, columns, strict=True)):
        if index is None:
            values[column.field] = [column.default] * count
            continue
        cells = list(map(str.strip, by_position[index])) if table.padded else by_position[index]
        try:
            values[column.field] = _parse_column(cells, column)
        except _BadCell as bad:
            errors.append((bad.row, order, bad.problem))
    if errors:
        row, order, problem = min(errors)
        line = table.lines[row]
        raise DataError(table.path, problem, line=line, column=columns[order].name)
    return values
