"""`make demo`: the life of a job on this machine, end to end.

1. what to rent: the catalog summary and a filtered offer table
2. what it costs: a plan for GPT-2 124M on 10B tokens
3. train: a small GPT for about 30 s with the Trainer (GPU if there is one, else CPU),
   recorded in the run store with checkpoints
4. see and explain: the run in the store and its diagnosis
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.rule import Rule

EXAMPLES = Path(__file__).resolve().parent
TRAIN_SECONDS = float(os.environ.get("CLOUDTRAIN_DEMO_SECONDS", "30"))


def cloudtrain(*args: str) -> None:
    """Run one `cloudtrain` command as a user would, stopping the demo if it fails."""
    shown = " ".join(args)
    console.print(f"[bold cyan]$ cloudtrain {shown}[/]")
    subprocess.run([sys.executable, "-m", "cloudtrain.cli", *args], check=True)


def train_gpt(checkpoint_dir: Path) -> None:
    console.print(f"[bold cyan]$ python examples/gpt.py --max-seconds {TRAIN_SECONDS:g}[/]")
    subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "gpt.py"),
            "--max-seconds",
            str(TRAIN_SECONDS),
            "--checkpoint-dir",
            str(checkpoint_dir),
            "--price",
            "0.44",
        ],
        check=True,
    )


def main() -> None:
    console.print(Rule("1. What to rent"))
    cloudtrain("catalog", "summary")
    cloudtrain("offers", "--gpu", "A100-80GB,H100", "--max-price", "40", "--limit", "8")
    console.print(Rule("2. What it will cost"))
    cloudtrain(
        "plan", "--preset", "gpt2-124m", "--tokens", "10e9", "--deadline", "24h", "--top", "5"
    )
    console.print(Rule("3. Train (a small GPT, about 30 s)"))
    with tempfile.TemporaryDirectory(prefix="cloudtrain-demo-") as scratch:
        train_gpt(Path(scratch) / "checkpoints")
    console.print(Rule("4. See and explain"))
    cloudtrain("runs", "--limit", "3")
    cloudtrain("diagnose", "latest")


console = Console()

if __name__ == "__main__":
    main()
