"""The training runtime: one `Trainer` that is fast by default, resumes exactly, and
survives preemption and OOM.

    from cloudtrain.runtime import Trainer, TrainConfig

    trainer = Trainer(model, loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                      train_data=dataset,
                      config=TrainConfig(max_steps=1000, global_batch_size=256,
                                         checkpoint_dir="ckpt", checkpoint_every_steps=100))
    result = trainer.fit()
    print(result.summary())

Exit codes after a signal: `EXIT_PREEMPTED` (75, checkpoint written; run again to
resume) and `EXIT_GRACE_EXPIRED` (76).
"""

from cloudtrain.runtime.batching import MemoryProbe
from cloudtrain.runtime.checkpoint import (
    CheckpointError,
    CheckpointManager,
    LoadedCheckpoint,
    load_checkpoint,
    seed_everything,
    young_interval_s,
)
from cloudtrain.runtime.config import TrainConfig
from cloudtrain.runtime.preempt import EXIT_GRACE_EXPIRED, EXIT_PREEMPTED
from cloudtrain.runtime.result import Callback, FitResult
from cloudtrain.runtime.trainer import Trainer

__all__ = [
    "EXIT_GRACE_EXPIRED",
    "EXIT_PREEMPTED",
    "Callback",
    "CheckpointError",
    "CheckpointManager",
    "FitResult",
    "LoadedCheckpoint",
    "MemoryProbe",
    "TrainConfig",
    "Trainer",
    "load_checkpoint",
    "seed_everything",
    "young_interval_s",
]
