"""What fit() returns, and the callback interface."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from cloudtrain.runtime.trainer import Trainer


@dataclass
class FitResult:
    """Summary of one fit() call (this process's part of the run)."""

    steps: int
    """Optimizer steps done in total (including those before a resume)."""
    start_step: int
    """The step this fit() started from (0, or the resumed checkpoint's step)."""
    stopped_by: str
    """'max_steps', 'max_epochs', 'max_seconds', 'signal' or 'data_exhausted'."""
    elapsed_s: float
    samples_per_s: float | None
    """Global samples per second over this fit()'s steps; None when no step ran."""
    tokens_per_s: float | None
    """Global tokens per second; None when batches carry no token ids."""
    mfu: float | None
    """Model FLOPs utilisation (0-1) vs the catalog's dense peak; None on CPU or an
    unknown GPU."""
    flops_per_step: float | None
    """Training FLOPs of one global step (all ranks); None when not measured."""
    final_loss: float | None
    eval_loss: float | None
    """Mean loss on the eval data at the end; None without eval data."""
    cost_usd: float | None
    """price_usd_per_hour (all the job's machines) x hours this fit() ran; None without a
    price."""
    micro_batch_size: int
    global_batch_size: int
    precision: str
    device: str
    world_size: int
    checkpoint_dir: str | None
    last_checkpoint: str | None
    """Newest checkpoint written or resumed from; None when there is none."""
    resumed_from: str | None
    oom_adjustments: int
    run_id: str | None
    """The run in the store; None when recording was off."""
    gpu_name: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """A few human lines."""
        lines = [
            f"steps {self.start_step} -> {self.steps} ({self.stopped_by}) in "
            f"{self.elapsed_s:.1f} s on {self.world_size} x {self.device} ({self.precision})"
        ]
        rate = []
        if self.samples_per_s is not None:
            rate.append(f"{self.samples_per_s:,.1f} samples/s")
        if self.tokens_per_s is not None:
            rate.append(f"{self.tokens_per_s:,.0f} tokens/s")
        rate.append("MFU " + (f"{100 * self.mfu:.1f}%" if self.mfu is not None else "n/a"))
        lines.append(", ".join(rate))
        loss = f"loss {self.final_loss:.4f}" if self.final_loss is not None else "loss n/a"
        if self.eval_loss is not None:
            loss += f", eval loss {self.eval_loss:.4f}"
        lines.append(f"{loss}; batch {self.global_batch_size} (micro {self.micro_batch_size})")
        if self.cost_usd is not None:
            lines.append(f"cost so far ${self.cost_usd:.4f}")
        if self.last_checkpoint:
            lines.append(f"checkpoint {self.last_checkpoint}")
        if self.run_id:
            lines.append(f"run {self.run_id}")
        return "\n".join(lines)


class Callback:
    """Hooks into fit(); override the ones you need. `loss` is the step's mean loss
    on this rank as a device tensor (calling .item() on it synchronises)."""

    def on_fit_start(self, trainer: Trainer) -> None:
        pass

    def on_step_end(self, trainer: Trainer, step: int, loss: torch.Tensor) -> None:
        pass

    def on_checkpoint(self, trainer: Trainer, step: int, path: str) -> None:
        pass

    def on_eval(self, trainer: Trainer, step: int, eval_loss: float) -> None:
        pass

    def on_fit_end(self, trainer: Trainer, result: FitResult) -> None:
        pass
