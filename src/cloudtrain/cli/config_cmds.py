"""Command `config show` (the effective settings and where each came from), and the
settings the commands read: `cli_settings()` and the helpers that put flags on top."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import typer

from cloudtrain.catalog import Catalog, load_catalog
from cloudtrain.cli import render
from cloudtrain.monitor.alerts import AlertConfig, alert_config_from
from cloudtrain.settings import (
    BASE_SECTIONS,
    CatalogSettings,
    PlanSettings,
    RunSettings,
    Section,
    Settings,
    load_settings,
    with_flags,
)

SECTIONS = (*BASE_SECTIONS, Section("alerts", AlertConfig, alert_config_from))
"""Every section the CLI reads: [catalog], [run], [plan] and [alerts] (cloudtrain watch)."""

config_app = typer.Typer(
    help="Settings: defaults < user config < ./cloudtrain.toml < CLOUDTRAIN_* env < flags.",
    no_args_is_help=True,
)


@functools.cache
def cli_settings() -> Settings:
    """The settings of this process (read once)."""
    return load_settings(SECTIONS)


def catalog_paths(flag_paths: list[Path] | None) -> tuple[Path, ...]:
    """--catalog when given, else [catalog] paths."""
    if flag_paths:
        return tuple(flag_paths)
    catalog: CatalogSettings = cli_settings().get("catalog")
    return catalog.paths


def cli_catalog(flag_paths: list[Path] | None = None) -> Catalog:
    """The catalog every command uses: bundled + user rows + --catalog or [catalog] paths."""
    return load_catalog(extra_paths=catalog_paths(flag_paths))


def alert_settings(**flags: Any) -> AlertConfig:
    """[alerts] with the given flags (None: not given) on top."""
    return with_flags(cli_settings().get("alerts"), **flags)


def run_settings(**flags: Any) -> RunSettings:
    """[run] with the given flags (None: not given) on top."""
    return with_flags(cli_settings().get("run"), **flags)


def plan_settings(**flags: Any) -> PlanSettings:
    """[plan] with the given flags (None: not given) on top."""
    return with_flags(cli_settings().get("plan"), **flags)


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return ", ".join(str(v) for v in value) or "(empty)"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@config_app.command("show")
def show(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """The effective settings, and for each value where it came from."""
    settings = cli_settings()
    files = {
        label: {"path": path, "exists": path.is_file()} for label, path in settings.files.items()
    }
    if as_json:
        values: dict[str, dict[str, Any]] = {}
        for section, key, value, source in settings.rows():
            values.setdefault(section, {})[key] = {"value": value, "source": source}
        render.print_json({"settings": values, "files": files})
        return
    rows = [
        (f"{section}.{key}", _shown(value), source)
        for section, key, value, source in settings.rows()
    ]
    out = render.console()
    out.print(render.table(None, ["setting", "value", "source"], rows))
    for label, file in files.items():
        state = "" if file["exists"] else " (not present)"
        out.print(f"{label}: {file['path']}{state}", highlight=False, markup=False)
    out.print("env: CLOUDTRAIN_<SECTION>_<KEY>, e.g. CLOUDTRAIN_PLAN_CURRENCY=CNY", highlight=False)


def register(app: typer.Typer) -> None:
    """Add this group's commands to the app."""
    app.add_typer(config_app, name="config")
