"""Layered settings: defaults < user config < ./cloudtrain.toml < CLOUDTRAIN_* env < flags.

Each layer is read in turn and later layers win per key:

1. the defaults of each section's dataclass,
2. `$CLOUDTRAIN_HOME/config.toml` (the user config),
3. `./cloudtrain.toml` in the current directory (the project config),
4. environment variables `CLOUDTRAIN_<SECTION>_<KEY>`, e.g. `CLOUDTRAIN_PLAN_CURRENCY=CNY`,
5. command-line flags, applied by the commands with `with_flags`.

A section is a TOML table (`[plan]`) whose keys are the fields of a dataclass that
validates itself. Every value is checked where it is read, so an error names the file
or variable, the `section.key` and what is expected. In TOML, `false` for an optional
setting that is not a bool (a threshold, a price) means None: "off". In the environment,
lists are comma-separated and `off` or `none` mean None.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloudtrain import paths
from cloudtrain.errors import DataError, UserError, did_you_mean

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ENV_PREFIX = "CLOUDTRAIN_"
PROJECT_FILE = "cloudtrain.toml"
USER_FILE = "config.toml"
DEFAULT_SOURCE = "default"
USER_SOURCE = "user config"
PROJECT_SOURCE = "./cloudtrain.toml"
RESERVED_ENV = frozenset({"CLOUDTRAIN_RUN_ID"})
"""Variables cloudtrain sets for the processes it starts; never read as settings."""
PLAN_OBJECTIVES = ("cost", "time", "carbon")
"""What `plan` may minimize (kept equal to cloudtrain.plan.result.OBJECTIVES by a test)."""


# ---------------------------------------------------------------- the sections


@dataclass(frozen=True)
class CatalogSettings:
    """[catalog]: extra catalog rows for every command that reads the catalog."""

    paths: tuple[Path, ...] = ()
    """Extra catalog CSV files or directories (like --catalog); relative paths are
    relative to the file that names them. Empty: the bundled and user rows only."""


@dataclass(frozen=True)
class RunSettings:
    """[run]: `cloudtrain run` (the supervised torchrun)."""

    price_usd_per_hour: float | None = None
    """Price of this machine, for spend and the budget; None: spend is not counted."""
    budget_usd: float | None = None
    """Stop (with a checkpoint) before spend would pass this; None: no budget."""
    max_restarts: int = 3
    """Restarts after failures before giving up."""
    grace_s: float = 30.0
    """Seconds workers get to checkpoint and exit when stopped."""

    def __post_init__(self) -> None:
        if self.price_usd_per_hour is not None and self.price_usd_per_hour < 0:
            raise UserError(f"price_usd_per_hour must be >= 0, not {self.price_usd_per_hour}")
        if self.budget_usd is not None and self.budget_usd <= 0:
            raise UserError(f"budget_usd must be > 0, not {self.budget_usd}")
        if self.max_restarts < 0:
            raise UserError(f"max_restarts must be >= 0, not {self.max_restarts}")
        if self.grace_s <= 0:
            raise UserError(f"grace_s must be > 0, not {self.grace_s}")


@dataclass(frozen=True)
class PlanSettings:
    """[plan]: `cloudtrain plan`. A workload file's [constraints] wins over these."""

    currency: str = "USD"
    """ISO 4217 code that costs and budgets are shown in, e.g. USD or CNY."""
    objective: str = "cost"
    """What the best plan minimizes: cost, time or carbon."""
    top: int = 10
    """Estimates shown; 0: all."""

    def __post_init__(self) -> None:
        code = self.currency.upper()
        if len(code) != 3 or not code.isalpha():
            raise UserError(f"currency must be an ISO 4217 code like USD, not '{self.currency}'")
        object.__setattr__(self, "currency", code)
        if self.objective not in PLAN_OBJECTIVES:
            raise UserError(
                f"objective must be one of {', '.join(PLAN_OBJECTIVES)}, not '{self.objective}'"
            )
        if self.top < 0:
            raise UserError(f"top must be >= 0 (0: all), not {self.top}")


@dataclass(frozen=True)
class Section:
    """A settings table: its name, the dataclass of its keys and how to build it."""

    name: str
    schema: type
    """A dataclass: its fields are the keys, its defaults the defaults."""
    build: Callable[[Mapping[str, Any], str], Any] | None = None
    """Makes the section from checked values and a label of where they came from;
    None: `schema(**values)`."""

    def make(self, values: Mapping[str, Any], where: str) -> Any:
        """The section value; raises the schema's UserError when a value is out of range."""
        return self.build(values, where) if self.build else self.schema(**values)

    def key_names(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self.schema)]


BASE_SECTIONS = (
    Section("catalog", CatalogSettings),
    Section("run", RunSettings),
    Section("plan", PlanSettings),
)
"""Sections defined here; packages above the base add theirs (the CLI adds [alerts])."""


# ---------------------------------------------------------------- the result


@dataclass(frozen=True)
class Settings:
    """The effective settings and, per key, which layer set it."""

    sections: Mapping[str, Any]
    """Section name -> its validated dataclass."""
    sources: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Section -> key -> source label ('user config', './cloudtrain.toml', 'env VAR');
    a key that is absent has its default."""
    files: Mapping[str, Path] = field(default_factory=dict)
    """Source label -> the config file it stands for (whether or not it exists)."""

    def get(self, section: str) -> Any:
        """The dataclass of one section."""
        if section not in self.sections:
            raise UserError(
                f"unknown settings section '{section}'{did_you_mean(section, self.sections)}"
            )
        return self.sections[section]

    def source(self, section: str, key: str) -> str:
        """Where the value of section.key came from ('default' when no layer set it)."""
        return self.sources.get(section, {}).get(key, DEFAULT_SOURCE)

    def rows(self) -> list[tuple[str, str, Any, str]]:
        """(section, key, value, source) for every key of every section."""
        return [
            (name, f.name, getattr(value, f.name), self.source(name, f.name))
            for name, value in self.sections.items()
            for f in dataclasses.fields(value)
        ]


def with_flags(section_value: Any, **flags: Any) -> Any:
    """The section with every flag that was given on top; a flag of None was not given."""
    given = {key: value for key, value in flags.items() if value is not None}
    return dataclasses.replace(section_value, **given) if given else section_value


# ---------------------------------------------------------------- loading


def user_config_path() -> Path:
    """The user config file, `$CLOUDTRAIN_HOME/config.toml` (may not exist)."""
    return paths.home_dir() / USER_FILE


def load_settings(
    sections: Sequence[Section] = BASE_SECTIONS,
    *,
    cwd: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Read the layers and return the validated settings; a bad value is a UserError."""
    by_name = {s.name: s for s in sections}
    project = (cwd or Path.cwd()) / PROJECT_FILE
    files = {USER_SOURCE: user_config_path(), PROJECT_SOURCE: project}
    values: dict[str, dict[str, Any]] = {name: {} for name in by_name}
    sources: dict[str, dict[str, str]] = {name: {} for name in by_name}
    layers = [(label, _read_file(path, by_name)) for label, path in files.items()]
    layers.append(("env", _read_env(os.environ if environ is None else environ, by_name)))
    for layer_label, layer in layers:
        for section, key, value, where in layer:
            values[section][key] = value
            sources[section][key] = where if layer_label == "env" else layer_label
    built = {}
    for name, section in by_name.items():
        built[name] = section.make(values[name], f"[{name}]")
    return Settings(built, sources, files)


Entry = tuple[str, str, Any, str]
"""(section, key, checked value, where: a file path or 'env VAR')."""


def _read_file(path: Path, sections: Mapping[str, Section]) -> list[Entry]:
    if not path.is_file():
        return []
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise DataError(path, f"not valid TOML: {error}") from None
    entries: list[Entry] = []
    for name, table in data.items():
        if name not in sections:
            raise UserError(f"{path}: unknown section [{name}]{did_you_mean(name, sections)}")
        if not isinstance(table, dict):
            raise UserError(f"{path}: '{name}' must be a table: [{name}] with key = value lines")
        for key, raw in table.items():
            value = _check(sections[name], key, raw, str(path), base=path.parent)
            entries.append((name, key, value, str(path)))
    return entries


def _read_env(environ: Mapping[str, str], sections: Mapping[str, Section]) -> list[Entry]:
    entries: list[Entry] = []
    for var in sorted(environ):
        if var in RESERVED_ENV:
            continue
        for name, section in sections.items():
            prefix = f"{ENV_PREFIX}{name.upper()}_"
            if var.startswith(prefix):
                key = var[len(prefix) :].lower()
                where = f"env {var}"
                value = _check(section, key, _parse_env(section, key, environ[var], where), where)
                entries.append((name, key, value, where))
    return entries


def _check(section: Section, key: str, raw: Any, where: str, base: Path | None = None) -> Any:
    """One value: a known key, of the right type, accepted by the section's checks."""
    valid = section.key_names()
    if key not in valid:
        raise UserError(f"{where}: unknown key {section.name}.{key}{did_you_mean(key, valid)}")
    hint = typing.get_type_hints(section.schema)[key]
    value = _coerce(hint, raw, f"{where}: {section.name}.{key} = {raw!r}")
    if base is not None and isinstance(value, tuple):
        value = tuple(base / v if isinstance(v, Path) else v for v in value)
    try:
        section.make({key: value}, f"{where}: [{section.name}]")
    except UserError as error:
        raise UserError(_reworded(where, section.name, key, str(error))) from None
    return value


def _reworded(where: str, section: str, key: str, message: str) -> str:
    """'F: plan.top must be >= 0, not -1' from the schema's 'top must be >= 0, not -1'."""
    at = message.find(f"{key} ")
    detail = message[at + len(key) :] if at >= 0 else f": {message}"
    return f"{where}: {section}.{key}{detail}"


# ---------------------------------------------------------------- types


def _optional(hint: Any) -> tuple[Any, bool]:
    """(the inner type, whether None is allowed) of `X | None`."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(hint))
    return hint, False


_EXPECTED = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
             Path: "a path (a string)"}  # fmt: skip


_EXPECTED_LIST = {str: "a list of strings", Path: "a list of paths (strings)"}


def _expected(hint: Any) -> str:
    inner, optional = _optional(hint)
    if typing.get_origin(inner) is tuple:
        text = _EXPECTED_LIST[typing.get_args(inner)[0]]
    else:
        text = _EXPECTED[inner]
    return text + (" (or false: off)" if optional and inner is not bool else "")


def _coerce(hint: Any, raw: Any, what: str) -> Any:
    """A TOML value as the field's type; a mismatch names what is expected."""
    inner, optional = _optional(hint)
    if optional and raw is False and inner is not bool:
        return None
    if typing.get_origin(inner) is tuple:
        item = typing.get_args(inner)[0]
        items = raw if isinstance(raw, list) else None
        if items is None or not all(isinstance(v, str) for v in items):
            raise UserError(f"{what}: expected {_expected(hint)}")
        return tuple(item(v) for v in items)
    if inner is float and isinstance(raw, int) and not isinstance(raw, bool):
        return float(raw)
    if inner is Path and isinstance(raw, str):
        return Path(raw)
    if type(raw) is not inner:
        raise UserError(f"{what}: expected {_expected(hint)}")
    return raw


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _parse_env(section: Section, key: str, text: str, where: str) -> Any:
    """An environment string as a TOML-like value (bool, int, float, list or str)."""
    if key not in section.key_names():
        return text  # _check names the unknown key
    inner, optional = _optional(typing.get_type_hints(section.schema)[key])
    what = f"{where}={text!r}: expected {_expected(inner)}"
    word = text.strip().lower()
    if optional and inner is not bool and word in ("off", "none", ""):
        return False  # TOML's "off"
    if inner is bool:
        if word not in _TRUE | _FALSE:
            raise UserError(f"{where}={text!r}: expected true/false, 1/0, yes/no or on/off")
        return word in _TRUE
    if typing.get_origin(inner) is tuple:
        return [part.strip() for part in text.split(",") if part.strip()]
    try:
        if inner is int:
            return int(word)
        if inner is float:
            return float(word)
    except ValueError:
        raise UserError(what) from None
    return text
