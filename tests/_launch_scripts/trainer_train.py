"""A small training script on cloudtrain's Trainer, for the supervisor's tests.

Checkpoints go to CLOUDTRAIN_CHECKPOINT_DIR (set by `cloudtrain run`) and the
Trainer resumes from there by itself. Test hooks: --kill-at STEPS sends SIGKILL to
this process once at each listed step, after the step and before its checkpoint;
--step-sleep slows every step; --out saves the final parameters (rank 0).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import torch

from cloudtrain.runtime import Callback, TrainConfig, Trainer


class Hooks(Callback):
    def __init__(self, ckpt_dir: Path, kill_at: set[int], step_sleep_s: float) -> None:
        self.ckpt_dir, self.kill_at, self.step_sleep_s = ckpt_dir, kill_at, step_sleep_s

    def on_step_end(self, trainer, step, loss) -> None:
        marker = self.ckpt_dir / f"killed-{step}"
        if step in self.kill_at and not marker.exists():
            marker.write_text("")
            os.kill(os.getpid(), signal.SIGKILL)
        if int(os.environ.get("RANK", "0")) == 0:
            (self.ckpt_dir / "progress").write_text(str(step))
        time.sleep(self.step_sleep_s)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--out", required=True)
    parser.add_argument("--kill-at", default="")
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--every", type=int, default=3, help="checkpoint every N steps")
    args = parser.parse_args()
    ckpt_dir = Path(os.environ["CLOUDTRAIN_CHECKPOINT_DIR"])
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    x = torch.randn(96, 8)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).sin())
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1)
    )
    config = TrainConfig(
        max_steps=args.steps,
        global_batch_size=16,
        micro_batch_size=8,
        lr=1e-2,
        seed=0,
        checkpoint_dir=ckpt_dir,
        checkpoint_every_steps=args.every,
        grace_period_s=float(os.environ.get("CLOUDTRAIN_GRACE_S", "30")),
        store=False,
        progress=False,
    )
    kill_at = {int(s) for s in args.kill_at.split(",") if s}
    trainer = Trainer(
        model,
        loss_fn=lambda m, batch: torch.nn.functional.mse_loss(m(batch[0]), batch[1]),
        train_data=data,
        config=config,
        callbacks=[Hooks(ckpt_dir, kill_at, args.step_sleep)],
    )
    trainer.fit()
    if int(os.environ.get("RANK", "0")) == 0:
        params = torch.cat([p.detach().flatten() for p in model.parameters()])
        torch.save(params, args.out)


if __name__ == "__main__":
    main()
