"""Where catalog CSVs come from, in merge order: bundled, the user's directory, `--catalog`."""

from __future__ import annotations

import importlib.resources
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cloudtrain import paths
from cloudtrain.catalog import csvdata as cd
from cloudtrain.errors import DataError


@dataclass(frozen=True)
class Source:
    """One catalog CSV file and what identifies its current content."""

    shown: str
    """The path errors name."""
    path: Path | None
    """Filesystem path; None for a bundled file that is not on disk (e.g. in a zip)."""
    size: int
    mtime_ns: int
    """Modification time; 0 where unknown (then `content` is already read)."""
    content: str | None = None

    def read(self) -> cd.RawTable:
        return (
            cd.read_table(self.shown, self.content)
            if self.path is None
            else cd.read_table(self.path)
        )


def _file_source(path: Path) -> Source:
    stat = path.stat()
    return Source(str(path), path, stat.st_size, stat.st_mtime_ns)


def bundled_sources() -> list[Source]:
    """Every bundled `cloudtrain/catalog/data/*.csv`, by file name."""
    data = importlib.resources.files("cloudtrain.catalog").joinpath("data")
    entries = sorted((e for e in data.iterdir() if e.name.endswith(".csv")), key=lambda e: e.name)
    found = []
    for entry in entries:
        if isinstance(entry, Path):
            found.append(_file_source(entry))
        else:
            text = entry.read_text(encoding="utf-8-sig")
            found.append(Source(str(entry), None, len(text), 0, text))
    return found


def csv_files(path: str | Path) -> list[Path]:
    """A CSV file itself, or a directory's `*.csv` by name; DataError if neither exists."""
    target = Path(path).expanduser()
    if target.is_dir():
        return sorted(p for p in target.iterdir() if p.suffix == ".csv" and p.is_file())
    if target.is_file():
        return [target]
    raise DataError(target, "no such file or directory (give a catalog CSV file or a directory)")


def catalog_sources(extra_paths: Iterable[str | Path], include_user: bool) -> list[Source]:
    """Every catalog file in merge order: bundled, `$CLOUDTRAIN_HOME/catalog`, extra paths."""
    found = bundled_sources()
    user_dir = paths.user_catalog_dir()
    if include_user and user_dir.is_dir():
        found += [_file_source(p) for p in csv_files(user_dir)]
    for extra in extra_paths:
        found += [_file_source(p) for p in csv_files(extra)]
    return found
