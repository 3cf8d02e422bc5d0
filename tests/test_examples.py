"""The examples as a user runs them, including under `cloudtrain run`, which hands the
checkpoint directory and the node price over through the environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(script: str, *args: str, env: dict[str, str], cwd: Path) -> dict:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args, "--json", "--no-store"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "args"),
    [
        ("gpt.py", ["--data", "synthetic", "--batch", "8", "--block", "16"]),
        ("resnet.py", ["--batch", "8", "--samples", "32"]),
    ],
)
def test_examples_resume_and_price_from_the_environment_cloudtrain_run_sets(tmp_path, script, args):
    env = {
        "CLOUDTRAIN_CHECKPOINT_DIR": str(tmp_path / "ck"),
        "CLOUDTRAIN_NODE_PRICE_USD_PER_HOUR": "3.6",
    }
    first = _run(script, *args, "--steps", "2", env=env, cwd=tmp_path)
    assert first["steps"] == 2 and first["cost_usd"] > 0
    assert Path(first["last_checkpoint"]).parent == tmp_path / "ck"
    again = _run(script, *args, "--steps", "4", env=env, cwd=tmp_path)
    assert (again["start_step"], again["steps"]) == (2, 4)  # resumed, not started over
