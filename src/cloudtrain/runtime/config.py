"""`TrainConfig`: every knob of the Trainer, validated when it is built.

Each field says its unit and what `None` or `"auto"` means. A bad value raises a
`UserError` naming the field and the fix, before any model or data is touched.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from cloudtrain.errors import UserError
from cloudtrain.paths import home_dir

PRECISIONS = ("auto", "fp32", "bf16", "fp16", "fp8")
PARALLELISMS = ("auto", "none", "ddp", "fsdp")
GRAD_COMPRESSIONS = ("bf16", "fp16", "powersgd")
WANDB_PROJECT_FORBIDDEN = "/\\#?%:"
"""Characters W&B does not allow in a project name."""
CHECKPOINT_DIR_ENV = "CLOUDTRAIN_CHECKPOINT_DIR"
"""Default `checkpoint_dir`; set by `cloudtrain run`."""
MTBF_ENV = "CLOUDTRAIN_MTBF_S"
"""Default `mtbf_s` in seconds; set by `cloudtrain run` from --mtbf-hours or the band."""
DEFAULT_MTBF_S = 6 * 3600.0
NODE_PRICE_ENV = "CLOUDTRAIN_NODE_PRICE_USD_PER_HOUR"
"""Price of one node; set by `cloudtrain run --price/--offer`."""


def _env_checkpoint_dir() -> str | None:
    return os.environ.get(CHECKPOINT_DIR_ENV) or None


def _env_number(name: str, allow_zero: bool = False) -> float | None:
    """$name as a finite number > 0 (>= 0 with allow_zero); None when unset."""
    text = os.environ.get(name)
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value >= 0 if allow_zero else value > 0) or value == float("inf"):
        wanted = "a number >= 0" if allow_zero else "a positive number"
        raise UserError(f"${name} must be {wanted}, not {text!r}")
    return value


def _env_mtbf_s() -> float:
    value = _env_number(MTBF_ENV)
    return DEFAULT_MTBF_S if value is None else value


def _env_job_price() -> float | None:
    """The node price `cloudtrain run` hands over, times the nodes of the torchrun job."""
    node_price = _env_number(NODE_PRICE_ENV, allow_zero=True)
    if node_price is None:
        return None
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    return node_price * max(1, world // max(1, per_node))


@dataclass
class TrainConfig:
    """How to train: batch sizes, stopping, precision, checkpoints, telemetry."""

    # --- how long ---------------------------------------------------------
    max_steps: int | None = None
    """Optimizer steps to train for; None: no step limit (another limit must be set)."""
    max_epochs: int | None = None
    """Passes over the training data; None: no epoch limit."""
    max_seconds: float | None = None
    """Wall-clock budget of this process's fit() in seconds; None: no time limit."""

    # --- batching -----------------------------------------------------------
    global_batch_size: int = 32
    """Samples per optimizer step summed over all ranks: the batch the math sees."""
    micro_batch_size: int | Literal["auto"] = "auto"
    """Samples per forward/backward on one rank; gradients accumulate up to the
    global batch. "auto": the largest that fits under `memory_target_fraction`
    (on CPU, with no memory limit, the whole per-rank batch)."""
    memory_target_fraction: float = 0.9
    """Share of device memory the auto micro-batch search may use (0-1]."""

    # --- optimisation ---------------------------------------------------------
    lr: float = 3e-4
    """Learning rate of the default optimizer (AdamW), used when `optimizer` is None."""
    weight_decay: float = 0.0
    """Weight decay of the default optimizer."""
    grad_clip_norm: float | None = None
    """Clip the global gradient L2 norm to this; None: no clipping."""
    seed: int = 0
    """Seeds Python, NumPy and torch (plus the rank) and the data order."""

    # --- speed ----------------------------------------------------------------
    device: str = "auto"
    """'auto' (cuda:LOCAL_RANK when CUDA is present, else cpu), 'cpu', 'cuda' or 'cuda:N'."""
    precision: str = "auto"
    """'auto' (bf16 autocast on GPUs with bf16, fp16 + GradScaler on older GPUs, fp32 on
    CPU), 'fp32', 'bf16', 'fp16', or 'fp8' (torchao float8 training; Hopper and newer)."""
    tf32: bool = True
    """Allow TF32 tensor cores for fp32 matmuls and convolutions on Ampere and newer."""
    compile: bool | Literal["auto"] = "auto"
    """torch.compile the model; "auto": on for CUDA, off on CPU."""
    channels_last: bool | Literal["auto"] = "auto"
    """channels_last memory format; "auto": on for models with Conv2d on CUDA."""
    activation_checkpointing: bool = False
    """Recompute the activations of each block of the model's ModuleLists in backward."""
    num_workers: int | Literal["auto"] = "auto"
    """DataLoader worker processes; "auto": from the CPU cores per GPU (0 on CPU)."""

    # --- distributed ----------------------------------------------------------
    parallelism: str = "auto"
    """'auto' (DDP when WORLD_SIZE > 1), 'none', 'ddp' or 'fsdp' (FSDP2 fully_shard)."""
    find_unused_parameters: bool = False
    """DDP: let parameters go unused in a step (a branch the forward skips). Costs an
    extra pass over the autograd graph each step, so off unless the model needs it."""
    grad_compression: str | None = None
    """DDP gradient compression for slow networks: 'bf16' (needs NCCL), 'fp16', or
    'powersgd' (rank 2, from the 10th step; its error feedback, warm-start matrices and
    RNG go into each rank's checkpoint, so a resume is exact); None: none."""

    # --- checkpoints ----------------------------------------------------------
    checkpoint_dir: str | Path | None = field(default_factory=_env_checkpoint_dir)
    """Where checkpoints go; a checkpoint found there is resumed. Default:
    $CLOUDTRAIN_CHECKPOINT_DIR when set (`cloudtrain run` sets it), else None: no
    checkpoints."""
    checkpoint_every_steps: int | None = None
    """Save every this many optimizer steps; None: not by steps."""
    checkpoint_every_seconds: float | Literal["auto"] | None = "auto"
    """Save every this many seconds; "auto": Young's interval sqrt(2 * save_s * mtbf_s)
    from the measured save time (only when there is a checkpoint_dir); None: not by time
    (then only checkpoint_every_steps, preemption and the end of the fit save)."""
    mtbf_s: float = field(default_factory=_env_mtbf_s)
    """Expected seconds between interruptions, for the "auto" interval. Default:
    $CLOUDTRAIN_MTBF_S when set (`cloudtrain run --mtbf-hours/--interruption-band` sets
    it), else 6 hours."""
    keep_checkpoints: int = 3
    """How many checkpoints to keep (the newest); older ones are deleted."""
    async_checkpoint: bool = False
    """Snapshot state to CPU memory and write it in a background thread."""
    resume: bool = True
    """Continue from the newest valid checkpoint in `checkpoint_dir` when there is one."""

    # --- preemption -------------------------------------------------------------
    grace_period_s: float = 30.0
    """After SIGTERM/SIGUSR1: finish the step, checkpoint and exit within this many seconds."""
    exit_on_preemption: bool = True
    """Exit the process with EXIT_PREEMPTED after a signal; False: fit() returns instead."""

    # --- evaluation -------------------------------------------------------------
    eval_every_steps: int | None = None
    """Evaluate on `eval_data` every this many steps (and at the end); None: only at the end."""
    eval_batches: int | None = None
    """Evaluate on at most this many batches; None: the whole eval data."""

    # --- telemetry --------------------------------------------------------------
    log_every_steps: int = 10
    """Read loss and timings back from the device every this many steps (a host sync)."""
    run_name: str | None = None
    """Name of the run in the store; None: generated."""
    store: bool | str | Path = True
    """Record the run in the run store: True (the default store), a path, or False."""
    price_usd_per_hour: float | None = field(default_factory=_env_job_price)
    """Price of all the job's machines, for cost so far; None: cost is not shown.
    Default: $CLOUDTRAIN_NODE_PRICE_USD_PER_HOUR (set by `cloudtrain run --price` or
    `--offer`) times the number of nodes of the torchrun job; None when unset."""
    progress: bool | Literal["auto"] = "auto"
    """Progress bar; "auto": on when stderr is a terminal (else a line every 10 s)."""
    monitor: bool = True
    """Sample GPUs and host (utilisation, memory, power, energy) on rank 0 while fitting,
    into the run store under the run's id; off when `store` is False."""
    monitor_interval_s: float = 1.0
    """Seconds between monitor samples (> 0)."""
    tensorboard_dir: str | Path | None = None
    """Also write scalars for TensorBoard here (needs the tensorboard package); None: off."""
    wandb: bool | str | Path = False
    """Also write scalars to an offline Weights & Biases run (needs the wandb package;
    nothing is sent, upload later with `wandb sync`). True: under `checkpoint_dir`, or
    the cloudtrain home when there is none (see `wandb_dir()`); a path: under it;
    False: off."""
    wandb_project: str = "cloudtrain"
    """W&B project of that run (used by `wandb sync`)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form values recorded with the run's config (e.g. model size)."""

    def __post_init__(self) -> None:
        _check_limits(self)
        _check_batching(self)
        _check_choices(self)
        _check_checkpoints(self)
        _check_sinks(self)
        _positive("monitor_interval_s", self.monitor_interval_s, allow_none=False)
        if self.log_every_steps < 1:
            raise UserError(f"log_every_steps must be >= 1, not {self.log_every_steps}")

    def wandb_dir(self) -> Path | None:
        """Folder the offline W&B run goes under (as `<it>/wandb/offline-run-*`); None
        when `wandb` is False."""
        if self.wandb is False:
            return None
        if self.wandb is not True:
            return Path(self.wandb).expanduser()
        if self.checkpoint_dir is not None:
            return Path(self.checkpoint_dir).expanduser()
        return home_dir()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values (paths as strings)."""
        out = asdict(self)
        for key, value in out.items():
            if isinstance(value, Path):
                out[key] = str(value)
        return out


def _positive(name: str, value: float | None, *, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise UserError(f"TrainConfig.{name} must be a positive number, not {value!r}")


def _check_limits(cfg: TrainConfig) -> None:
    _positive("max_steps", cfg.max_steps)
    _positive("max_epochs", cfg.max_epochs)
    _positive("max_seconds", cfg.max_seconds)
    if cfg.max_steps is None and cfg.max_epochs is None and cfg.max_seconds is None:
        raise UserError("TrainConfig needs a limit: set max_steps, max_epochs or max_seconds")


def _check_batching(cfg: TrainConfig) -> None:
    _positive("global_batch_size", cfg.global_batch_size, allow_none=False)
    if cfg.micro_batch_size != "auto":
        _positive("micro_batch_size", cfg.micro_batch_size, allow_none=False)
        if cfg.micro_batch_size > cfg.global_batch_size:
            raise UserError(
                f"micro_batch_size {cfg.micro_batch_size} exceeds global_batch_size "
                f"{cfg.global_batch_size}; lower it or use 'auto'"
            )
    if not 0 < cfg.memory_target_fraction <= 1:
        raise UserError("memory_target_fraction must be in (0, 1], e.g. 0.9")
    _positive("grad_clip_norm", cfg.grad_clip_norm)
    _positive("lr", cfg.lr, allow_none=False)
    if cfg.num_workers != "auto" and (not isinstance(cfg.num_workers, int) or cfg.num_workers < 0):
        raise UserError(f"num_workers must be 'auto' or an int >= 0, not {cfg.num_workers!r}")


def _one_of(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UserError(f"TrainConfig.{name} must be one of {', '.join(choices)}, not {value!r}")


def _check_choices(cfg: TrainConfig) -> None:
    _one_of("precision", cfg.precision, PRECISIONS)
    _one_of("parallelism", cfg.parallelism, PARALLELISMS)
    if cfg.grad_compression is not None:
        _one_of("grad_compression", cfg.grad_compression, GRAD_COMPRESSIONS)
    if cfg.compile not in (True, False, "auto"):
        raise UserError(f"compile must be True, False or 'auto', not {cfg.compile!r}")
    if cfg.channels_last not in (True, False, "auto"):
        raise UserError(f"channels_last must be True, False or 'auto', not {cfg.channels_last!r}")
    device = cfg.device
    if not (device in ("auto", "cpu", "cuda") or device.startswith("cuda:")):
        raise UserError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', not {device!r}")


def _check_checkpoints(cfg: TrainConfig) -> None:
    _positive("checkpoint_every_steps", cfg.checkpoint_every_steps)
    if cfg.checkpoint_every_seconds != "auto":
        _positive("checkpoint_every_seconds", cfg.checkpoint_every_seconds)
    _positive("mtbf_s", cfg.mtbf_s, allow_none=False)
    _positive("grace_period_s", cfg.grace_period_s, allow_none=False)
    if cfg.keep_checkpoints < 1:
        raise UserError(f"keep_checkpoints must be >= 1, not {cfg.keep_checkpoints}")
    timed = cfg.checkpoint_every_seconds not in (None, "auto")
    if (cfg.checkpoint_every_steps or timed) and cfg.checkpoint_dir is None:
        raise UserError("checkpoint_every_* is set but checkpoint_dir is None; set checkpoint_dir")


def _is_dir_value(value: object) -> bool:
    return isinstance(value, Path) or (isinstance(value, str) and value.strip() != "")


def _check_sinks(cfg: TrainConfig) -> None:
    if cfg.tensorboard_dir is not None and not _is_dir_value(cfg.tensorboard_dir):
        raise UserError(
            f"TrainConfig.tensorboard_dir must be a directory path or None, "
            f"not {cfg.tensorboard_dir!r}"
        )
    if not (isinstance(cfg.wandb, bool) or _is_dir_value(cfg.wandb)):
        raise UserError(
            f"TrainConfig.wandb must be True, False or a directory path, not {cfg.wandb!r}"
        )
    project = cfg.wandb_project
    if not isinstance(project, str) or not project.strip() or len(project) > 128:
        raise UserError(
            f"TrainConfig.wandb_project must be a name of 1 to 128 characters, not {project!r}"
        )
    bad = sorted({c for c in project if c in WANDB_PROJECT_FORBIDDEN})
    if bad:
        raise UserError(
            f"TrainConfig.wandb_project {project!r} may not contain {' '.join(bad)}; "
            f"use letters, digits, '-', '_' or '.'"
        )
