"""Shared fixtures: every test gets its own CLOUDTRAIN_HOME, so none touches ~/.cloudtrain."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def cloudtrain_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    home = tmp_path_factory.mktemp("cloudtrain_home")
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(home))
    return home


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str


@pytest.fixture
def run_cli():
    """Run `cloudtrain ARGS...` in a subprocess (real exit codes, real output)."""

    def run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> CliResult:
        import os

        full_env = {**os.environ, "COLUMNS": "100", **(env or {})}
        done = subprocess.run(
            [sys.executable, "-m", "cloudtrain.cli", *args],
            capture_output=True,
            text=True,
            env=full_env,
            cwd=cwd,
            timeout=120,
        )
        return CliResult(done.returncode, done.stdout, done.stderr)

    return run
