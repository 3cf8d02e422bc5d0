"""A tiny deterministic training script that checkpoints with torch.save itself.

Resumes from CLOUDTRAIN_CHECKPOINT_DIR. Test hooks: --kill-at STEPS kills the
process with SIGKILL once at each listed step (before that step's checkpoint);
--step-sleep slows steps down; SIGTERM finishes the step, checkpoints, exits 75.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import torch

EXIT_PREEMPTED = 75
stop_requested = False


def _on_sigterm(signum, frame):
    global stop_requested
    stop_requested = True


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1)
    )
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def save(ckpt_dir: Path, step, model, optim) -> None:
    state = {
        "step": step,
        "model": model.state_dict(),
        "optim": optim.state_dict(),
        "rng": torch.get_rng_state(),
    }
    tmp = ckpt_dir / f"step-{step}.pt.tmp"
    torch.save(state, tmp)
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, ckpt_dir / f"step-{step}.pt")
    (ckpt_dir / "latest.tmp").write_text(str(step))
    os.replace(ckpt_dir / "latest.tmp", ckpt_dir / "latest")


def load(ckpt_dir: Path, model, optim) -> int:
    latest = ckpt_dir / "latest"
    if not latest.exists():
        return 0
    state = torch.load(ckpt_dir / f"step-{latest.read_text()}.pt", weights_only=True)
    model.load_state_dict(state["model"])
    optim.load_state_dict(state["optim"])
    torch.set_rng_state(state["rng"])
    return int(state["step"])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", required=True)
    parser.add_argument("--kill-at", default="")
    parser.add_argument("--step-sleep", type=float, default=0.0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _on_sigterm)
    ckpt_dir = Path(os.environ["CLOUDTRAIN_CHECKPOINT_DIR"])
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    kill_at = {int(s) for s in args.kill_at.split(",") if s}
    model, optim = build()
    step = load(ckpt_dir, model, optim)
    while step < args.steps:
        data = torch.Generator().manual_seed(step)
        x = torch.randn(32, 8, generator=data)
        y = x.sum(dim=1, keepdim=True).sin()
        loss = torch.nn.functional.mse_loss(model(x), y)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        step += 1
        marker = ckpt_dir / f"killed-{step}"
        if step in kill_at and not marker.exists():
            marker.write_text("")
            os.kill(os.getpid(), signal.SIGKILL)
        save(ckpt_dir, step, model, optim)
        (ckpt_dir / "progress").write_text(str(step))
        if stop_requested:
            print(f"checkpointed step {step} after SIGTERM", file=sys.stderr, flush=True)
            return EXIT_PREEMPTED
        time.sleep(args.step_sleep)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    torch.save(flat, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
