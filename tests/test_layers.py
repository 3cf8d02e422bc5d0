"""The package layering of DESIGN.md, enforced: imports point one way only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "src" / "cloudtrain"

# package -> the cloudtrain packages it may import (besides itself and the shared
# base modules errors/paths). profiling (needs torch) hands plan its data types; the
# Trainer fingerprints its model through it. diagnose may use monitor: the doctor reads the GPU
# through monitor, which is the only package that talks to NVML.
ALLOWED = {
    "catalog": set(),
    "store": set(),
    "plan": {"catalog"},
    "monitor": {"store", "catalog"},
    "profiling": {"plan"},
    "runtime": {"monitor", "store", "catalog", "profiling"},
    "diagnose": {"store", "catalog", "monitor"},
    "report": {"store", "catalog", "diagnose"},
    "launch": {"runtime", "plan", "store", "catalog", "monitor"},
    "cli": {
        "catalog",
        "store",
        "plan",
        "monitor",
        "runtime",
        "diagnose",
        "report",
        "launch",
        "profiling",
    },
}
BASE_MODULES = {"errors", "paths", "settings"}
# third-party modules that only one package may import
EXCLUSIVE = {"sqlite3": "store", "pynvml": "monitor"}
NO_TORCH = {"catalog", "plan", "store"}


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            pytest.fail(f"{path}: use absolute imports (from cloudtrain...)")
    return names


def _package_files():
    for package in ALLOWED:
        for path in sorted((PACKAGE_ROOT / package).rglob("*.py")):
            yield package, path


def test_every_package_is_listed():
    present = {p.name for p in PACKAGE_ROOT.iterdir() if (p / "__init__.py").exists()}
    assert present == set(ALLOWED)


@pytest.mark.parametrize(("package", "path"), list(_package_files()), ids=lambda v: str(v))
def test_imports_point_one_way(package: str, path: Path):
    for name in _imports(path):
        parts = name.split(".")
        if parts[0] == "cloudtrain" and len(parts) > 1:
            target = parts[1]
            assert target == package or target in BASE_MODULES or target in ALLOWED[package], (
                f"{path.relative_to(PACKAGE_ROOT)} imports {name}: "
                f"{package} may only use {sorted(ALLOWED[package]) or 'nothing of ours'}"
            )
        owner = EXCLUSIVE.get(parts[0])
        assert owner in (None, package), f"{path.name}: only {owner} may import {parts[0]}"
        if package in NO_TORCH:
            assert parts[0] != "torch", f"{path.name}: {package} must not import torch"


def test_the_checker_catches_a_bad_import(tmp_path: Path):
    bad = tmp_path / "bad.py"
    bad.write_text("from cloudtrain.runtime import trainer\n")
    assert _imports(bad) == ["cloudtrain.runtime"]
    assert "runtime" not in ALLOWED["catalog"]
