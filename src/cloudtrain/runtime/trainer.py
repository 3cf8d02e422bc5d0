"""The Trainer: one loop for CPU, one GPU and many GPUs under torchrun.

fit() assembles the parts in a fixed order (see `_setup`), then runs a loop that
reads top to bottom: next batch -> accumulate micro-batches -> optimizer step ->
log / eval / checkpoint -> stop? Resume, OOM recovery and preemption happen at
step boundaries, so a step is either fully done and saved, or redone.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from cloudtrain.errors import UserError
from cloudtrain.monitor import enable_stack_dumps_from_env
from cloudtrain.runtime import distributed as D
from cloudtrain.runtime.batch import batch_size, count_tokens, slice_batch, to_device
from cloudtrain.runtime.batching import (
    CudaMemoryProbe,
    MemoryProbe,
    find_micro_batch,
    free_memory,
    is_oom,
    micro_slices,
    no_side_effects,
)
from cloudtrain.runtime.checkpoint import (
    CheckpointManager,
    LoadedCheckpoint,
    restore_rng,
    seed_everything,
)
from cloudtrain.runtime.config import CHECKPOINT_DIR_ENV, TrainConfig
from cloudtrain.runtime.data import DataPosition, make_source
from cloudtrain.runtime.planner_facts import planner_facts
from cloudtrain.runtime.precision import (
    apply_tf32,
    autocast,
    convert_to_fp8,
    make_grad_scaler,
    resolve_precision,
)
from cloudtrain.runtime.preempt import EXIT_PREEMPTED, PreemptionHandler
from cloudtrain.runtime.result import Callback, FitResult
from cloudtrain.runtime.setup import (
    OptimizerArg,
    SchedulerArg,
    checkpoint_blocks,
    make_optimizer,
    use_channels_last,
    use_compile,
)
from cloudtrain.runtime.telemetry import measure_flops
from cloudtrain.runtime.trainer_checkpoint import CheckpointingMixin, _json
from cloudtrain.runtime.trainer_telemetry import TelemetryMixin
from cloudtrain.runtime.trainstate import StepFlags

LossFn = Callable[[nn.Module, Any], torch.Tensor]


class Trainer(CheckpointingMixin, TelemetryMixin):
    """Trains `model` on `train_data` by minimising `loss_fn(model, batch)`.

    `train_data`: a map-style Dataset (shuffled per epoch from `config.seed`, split
    across ranks), a DataLoader over one (its dataset, collate_fn and workers are used;
    its batch size and sampler give way to `global_batch_size` and a resumable
    sampler), or any iterable of batches (re-iterated each epoch; a resume skips what
    was used). `optimizer`: an optimizer, a factory `params -> optimizer`, or None (AdamW with
    `config.lr`, fused on CUDA). `lr_scheduler`: a factory `optimizer -> scheduler`
    stepped once per optimizer step. `eval_data`/`eval_loss_fn` (default `loss_fn`):
    evaluated every `config.eval_every_steps` and at the end. `memory_probe`: how the
    auto micro-batch search reads peak memory (default: CUDA's allocator; none on CPU).
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        train_data: Iterable[Any],
        optimizer: OptimizerArg = None,
        config: TrainConfig | None = None,
        *,
        lr_scheduler: SchedulerArg = None,
        eval_data: Iterable[Any] | None = None,
        eval_loss_fn: LossFn | None = None,
        callbacks: Sequence[Callback] = (),
        memory_probe: MemoryProbe | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise UserError(f"model must be a torch.nn.Module, not {type(model).__name__}")
        if not callable(loss_fn):
            raise UserError("loss_fn must be a callable (model, batch) -> scalar loss")
        self.model = model
        self.loss_fn = loss_fn
        self.train_data = train_data
        self.optimizer_arg = optimizer
        self.config = config or TrainConfig(max_steps=1000)
        self.lr_scheduler_arg = lr_scheduler
        self.eval_data = eval_data
        self.eval_loss_fn = eval_loss_fn or loss_fn
        self.callbacks = list(callbacks)
        self.memory_probe = memory_probe
        self.step = 0
        """Optimizer steps done (also the number of the next step, counting from 0)."""
        self.micro_batch_size: int | None = None
        self.scaler: torch.amp.GradScaler | None = None
        self.wrapped: nn.Module = model
        self.oom_adjustments = 0
        self.comm_hook_state: Any = None
        """The DDP compression hook's state (a PowerSGDState; checkpointed per rank)."""
        self._agreed: StepFlags | None = None
        """Distributed runs: the flags all ranks agreed on during the newest step."""
        self.saved_step = -1
        """Step of the newest checkpoint written by this fit() (-1: none yet)."""

    # ------------------------------------------------------------------ setup
    def _setup(self) -> LoadedCheckpoint | None:
        cfg = self.config
        self.env = D.detect_env()
        self.device = D.pick_device(cfg.device, self.env)
        self._owns_group = D.init_process_group(self.env, self.device)
        self.parallelism = D.resolve_parallelism(cfg.parallelism, self.env)
        seed_everything(cfg.seed + self.env.rank)
        self.precision = resolve_precision(cfg.precision, self.device, allow_tf32=cfg.tf32)
        apply_tf32(self.precision)
        self._prepare_model()
        self.ckpt = self._checkpoint_manager()
        loaded = self.ckpt.load_latest(self._agree_index) if self.ckpt and cfg.resume else None
        if loaded is not None and self.parallelism != "fsdp" and loaded.sharded_path is None:
            self.model.load_state_dict(loaded.state["model"])
        self.source = make_source(
            self.train_data,
            global_batch=cfg.global_batch_size,
            rank=self.env.rank,
            world=self.env.world_size,
            seed=cfg.seed,
            device_type=self.device.type,
            local_world=self.env.local_world_size,
            num_workers=cfg.num_workers,
        )
        self.local_batch = cfg.global_batch_size // self.env.world_size
        self._pending_batch = None
        self._restore_trainer_state(loaded)
        if loaded is not None and loaded.rank_state is not None:
            # before the first batch is fetched (a peek, below): loading it may draw
            # random numbers (augmentation), as it did after the checkpoint was taken
            restore_rng(loaded.rank_state["rng"], self.device)
        self._choose_micro_batch(loaded)
        self.flops_per_sample = self._measure_flops()
        self._wrap_model()
        if loaded is not None and self.parallelism == "ddp":
            self._settle_ddp_buckets()
        saved_hook = (loaded.rank_state or {}).get("powersgd") if loaded is not None else None
        if saved_hook is not None and self.comm_hook_state is not None:
            D.load_powersgd_state(self.comm_hook_state, saved_hook, self.device)
        if loaded is not None and self.parallelism == "fsdp" and loaded.sharded_path is None:
            self._fsdp_load_model(loaded.state["model"])  # a gathered (older) checkpoint
        self._build_optimizer(loaded)
        self.planner_facts = planner_facts(
            self.model, self._peek_batch(), self.precision.name, self.precision.tf32,
            self.channels_last, self.optimizer,
        )  # fmt: skip
        return loaded

    def _prepare_model(self) -> None:
        cfg = self.config
        self.model.to(self.device)
        self.channels_last = use_channels_last(cfg.channels_last, self.model, self.device)
        if self.channels_last:
            self.model.to(memory_format=torch.channels_last)
        if self.precision.name == "fp8":
            self.model = convert_to_fp8(self.model)
        if cfg.activation_checkpointing and checkpoint_blocks(self.model) == 0:
            raise UserError("activation_checkpointing found no nn.ModuleList of blocks to wrap")
        self.model.train()

    def _wrap_model(self) -> None:
        self.compiled = use_compile(self.config.compile, self.device)
        if self.compiled:
            self.model.compile()
        if self.parallelism == "ddp":
            cfg = self.config
            self.wrapped, self.comm_hook_state = D.wrap_ddp(
                self.model, self.device, cfg.grad_compression, cfg.find_unused_parameters
            )
        elif self.parallelism == "fsdp":
            self.wrapped = D.wrap_fsdp(self.model, self.device)
        else:
            self.wrapped = self.model

    def _settle_ddp_buckets(self) -> None:
        """One trial pass through DDP on resume, leaving nothing behind. DDP lays its
        gradient buckets out in parameter order for the first step and in gradient-ready
        order from the second on; the layout decides the order in which more than two
        ranks' gradients are summed, and PowerSGD's saved state is in the later layout.
        So the resumed run's first real step must already use the later layout, as the
        uninterrupted run did at that step. A fresh PowerSGD state only counts this
        pass; the saved one replaces it."""
        batch = self._peek_batch()
        if batch is None:
            return
        n = min(self.micro_batch_size, batch_size(batch))
        micro = to_device(slice_batch(batch, 0, n), self.device, channels_last=self.channels_last)
        with no_side_effects(self.model, self.device):
            self._forward_backward(self.wrapped, micro, 1.0)

    def _build_optimizer(self, loaded: LoadedCheckpoint | None) -> None:
        cfg = self.config
        if self.parallelism == "fsdp" and isinstance(self.optimizer_arg, torch.optim.Optimizer):
            raise UserError("under FSDP pass the optimizer as a factory (params -> optimizer)")
        self.optimizer = make_optimizer(
            self.optimizer_arg, self.model, self.device, cfg.lr, cfg.weight_decay
        )
        self.scheduler = self.lr_scheduler_arg(self.optimizer) if self.lr_scheduler_arg else None
        self.scaler = make_grad_scaler(self.precision, self.device)
        if loaded is None:
            return
        state = loaded.state
        if loaded.sharded_path is not None:
            self._load_shards(loaded.sharded_path)  # model and optimizer together
        elif self.parallelism == "fsdp":
            self._fsdp_load_optimizer(state["optimizer"])
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])

    def _checkpoint_manager(self) -> CheckpointManager | None:
        if self.config.checkpoint_dir is None:
            launcher_dir = os.environ.get(CHECKPOINT_DIR_ENV)
            if launcher_dir:  # e.g. checkpoint_dir=args.checkpoint_dir with the flag unset
                self._say(
                    f"${CHECKPOINT_DIR_ENV} is {launcher_dir} but this TrainConfig has "
                    "checkpoint_dir=None: nothing is saved and a restart starts over "
                    "(leave checkpoint_dir out to use it)"
                )
            return None
        return CheckpointManager(
            self.config.checkpoint_dir,
            rank=self.env.rank,
            world=self.env.world_size,
            keep=self.config.keep_checkpoints,
            barrier=D.barrier,
        )

    def _agree_index(self, index: int) -> int:
        return D.broadcast_int(index)

    def _restore_trainer_state(self, loaded: LoadedCheckpoint | None) -> None:
        self.start_step = 0
        self.resumed_from = None
        if loaded is None:
            return
        trainer_state = loaded.state["trainer"]
        self.step = self.start_step = int(trainer_state["step"])
        self.resumed_from = str(loaded.path)
        position = (loaded.rank_state or {}).get("data") or trainer_state["data"]
        self.source.restore(DataPosition.from_dict(position))

    # ----------------------------------------------------------- micro-batch
    def _choose_micro_batch(self, loaded: LoadedCheckpoint | None) -> None:
        """From the checkpoint (never larger than what the config asks), the config,
        or the auto search on the first batch, agreed (minimum) across ranks."""
        asked = self.config.micro_batch_size
        saved = int(loaded.state["trainer"]["micro_batch_size"]) if loaded else None
        if saved is not None:
            micro = saved if asked == "auto" else min(saved, asked)
        elif asked == "auto":
            micro = self._auto_micro_batch()
        else:
            micro = asked
        self.micro_batch_size = D.min_int(min(micro, self.local_batch))

    def _auto_micro_batch(self) -> int:
        batch = self._peek_batch()
        if batch is None:
            return self.local_batch
        probe = self.memory_probe
        if probe is None and self.device.type == "cuda":
            probe = CudaMemoryProbe(self.device)

        def trial(n: int) -> None:
            micro = to_device(
                slice_batch(batch, 0, n), self.device, channels_last=self.channels_last
            )
            self._forward_backward(self.model, micro, 1.0)

        with no_side_effects(self.model, self.device):
            found = find_micro_batch(
                trial, self.local_batch, self.device, probe, self.config.memory_target_fraction
            )
        self._say(f"micro-batch {found} (auto; per-rank batch {self.local_batch})")
        return found

    def _measure_flops(self) -> float | None:
        """Training FLOPs per sample, counted once on one micro-batch (eager model)."""
        batch = self._peek_batch()
        if batch is None:
            return None
        n = min(self.micro_batch_size, batch_size(batch))
        micro = to_device(slice_batch(batch, 0, n), self.device, channels_last=self.channels_last)
        try:
            with no_side_effects(self.model, self.device):
                flops = measure_flops(lambda: self._forward_backward(self.model, micro, 1.0))
        except Exception as error:  # counting is a nicety; training must not fail on it
            if is_oom(error):
                free_memory(self.device)
            self._say(f"FLOPs not counted ({type(error).__name__}: {error}); MFU will be n/a")
            return None
        return flops / n if flops > 0 else None

    def _peek_batch(self) -> Any:
        if self._pending_batch is None:
            self._pending_batch = self._fetch_batch()
        return self._pending_batch

    @property
    def is_main(self) -> bool:
        """True in the process that reports: rank 0 under torchrun, or a single process
        (what to print from, so a summary shows once)."""
        return int(os.environ.get("RANK", "0")) == 0

    # ------------------------------------------------------------------ loop
    def fit(self) -> FitResult:
        """Train until a limit in the config is reached; see FitResult. After SIGTERM or
        SIGUSR1: checkpoint, then exit with EXIT_PREEMPTED (or return, if configured)."""
        enable_stack_dumps_from_env()  # `cloudtrain watch` can ask for every thread's stack
        self.preemption = PreemptionHandler(self.config.grace_period_s)
        self.preemption.install()  # a signal during setup stops before the first step
        try:
            loaded = self._setup()
            self._start_telemetry(loaded)
        except BaseException:
            self.preemption.uninstall()
            raise
        status, stopped_by = "failed", "error"
        try:
            for cb in self.callbacks:
                cb.on_fit_start(self)
            stopped_by = self._loop()
            status = "preempted" if stopped_by == "signal" else "completed"
        except KeyboardInterrupt:
            status, stopped_by = "stopped", "interrupted"
            raise
        finally:
            self.preemption.uninstall()
            result = self._finish(status, stopped_by)
        if stopped_by == "signal" and self.config.exit_on_preemption:
            sys.stdout.flush()
            raise SystemExit(EXIT_PREEMPTED)
        return result

    def _loop(self) -> str:
        cfg = self.config
        while True:
            stop = self._stop_reason()
            if stop is not None:
                return stop
            t0 = time.perf_counter()
            batch = self._next_batch()
            if batch is None:
                return "max_epochs" if self._epochs_done() else "data_exhausted"
            data_wait_s = time.perf_counter() - t0
            loss = self._train_step(batch)
            self.step += 1
            self.meter.add(loss, data_wait_s, self._tokens_in(batch))
            for cb in self.callbacks:
                cb.on_step_end(self, self.step, loss)
            if self.step % cfg.log_every_steps == 0:
                self._log()
            if cfg.eval_every_steps and self.step % cfg.eval_every_steps == 0:
                self._run_eval()
            self._maybe_checkpoint()

    def _local_flags(self) -> StepFlags:
        max_s = self.config.max_seconds
        return StepFlags(
            preempted=self.preemption.requested,
            out_of_time=max_s is not None and time.monotonic() - self.started_monotonic >= max_s,
            checkpoint_due=self.clock.due(),
        )

    def _agree_step_flags(self, oom: bool) -> bool:
        """The one agreement between ranks per step, made before the micro-batch that
        communicates: whether any rank ran out of memory (returned), and the StepFlags
        every rank then acts on after the step. Host values only (see D.host_plane)."""
        local = self._local_flags()
        flags = [oom, local.preempted, local.out_of_time, local.checkpoint_due]
        arrived = time.perf_counter()
        oom, *agreed = D.agree_flags(flags)
        self.meter.add_sync_wait(time.perf_counter() - arrived)  # waiting for the last rank
        self._agreed = StepFlags(*agreed)
        return oom

    def _step_flags(self) -> StepFlags:
        """Single process: as of now. Distributed: as agreed during the step just done,
        so every rank stops and checkpoints after the same step."""
        if not self.env.is_distributed:
            return self._local_flags()
        if self._agreed is None:  # no step yet: a signal during setup stops here
            self._agree_step_flags(oom=False)
        return self._agreed

    def _stop_reason(self) -> str | None:
        cfg = self.config
        flags = self._step_flags()
        if flags.preempted:
            signum = self.preemption.signal_received
            self.recorder.event(
                "preemption",
                f"signal {signum} at step {self.step}",
                signal=signum,
                step=self.step,
                grace_s=self.config.grace_period_s,
            )
            return "signal"
        if cfg.max_steps is not None and self.step >= cfg.max_steps:
            return "max_steps"
        if self._epochs_done():
            return "max_epochs"
        if flags.out_of_time:
            return "max_seconds"
        return None

    def _epochs_done(self) -> bool:
        return self.config.max_epochs is not None and (
            self.source.position.epoch >= self.config.max_epochs
        )

    def _fetch_batch(self) -> Any:
        batch = self.source.next_batch()
        if batch is None and not self._epochs_done():
            batch = self.source.next_batch()  # an iterable ended its epoch: start the next
        return batch

    def _next_batch(self) -> Any:
        if self._pending_batch is not None:
            batch, self._pending_batch = self._pending_batch, None
            return batch
        return self._fetch_batch()

    def _tokens_in(self, batch: Any) -> int | None:
        tokens = count_tokens(batch)
        return tokens * self.env.world_size if tokens is not None else None

    # ------------------------------------------------------------------ step
    def _train_step(self, batch: Any) -> torch.Tensor:
        """One optimizer step on this rank's share of the global batch. On OOM: free,
        halve the micro-batch (all ranks), redo the same batch from the same torch RNG
        state (Python/NumPy draws made by loss_fn before the OOM are not rewound)."""
        rng = _rng_states(self.device)
        while True:
            loss = self._accumulate(batch)
            if loss is not None:
                break
            self._shrink_micro_batch()
            _set_rng_states(rng, self.device)
        self._optimizer_step()
        return loss

    def _accumulate(self, batch: Any) -> torch.Tensor | None:
        """Forward+backward of every micro-batch; the mean loss, or None after an OOM
        (on any rank: ranks agree before the micro-batch that communicates)."""
        n = batch_size(batch)
        slices = micro_slices(n, self.micro_batch_size)
        total: torch.Tensor | None = None
        oom = False
        for i, (start, end) in enumerate(slices):
            last = i == len(slices) - 1
            if last and self.env.is_distributed:
                oom = self._agree_step_flags(oom)
            if oom:
                continue  # skip the work, but every rank still reaches the agreement above
            micro = to_device(
                slice_batch(batch, start, end), self.device, channels_last=self.channels_last
            )
            try:
                with D.no_sync(self.wrapped, self.parallelism, skip_sync=not last):
                    loss = self._forward_backward(self.wrapped, micro, (end - start) / n)
            except Exception as error:
                if _unused_parameters(error):
                    raise UserError(UNUSED_PARAMETERS_FIX) from error
                if not is_oom(error):
                    raise
                oom = True
                continue
            share = loss.detach().float()
            if len(slices) > 1:
                share = share * ((end - start) / n)
            total = share if total is None else total + share
        if oom:
            return None
        return total

    def _forward_backward(self, model: nn.Module, micro: Any, weight: float) -> torch.Tensor:
        with autocast(self.precision, self.device):
            loss = self.loss_fn(model, micro)
        scaled = loss * weight if weight != 1.0 else loss
        if self.scaler is not None and model is self.wrapped:
            scaled = self.scaler.scale(scaled)
        scaled.backward()
        return loss

    def _shrink_micro_batch(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        free_memory(self.device)
        old = self.micro_batch_size
        if old <= 1:
            raise torch.OutOfMemoryError(
                f"step {self.step}: out of memory with micro_batch_size 1; use "
                "activation_checkpointing, FSDP, a smaller model or a bigger GPU"
            )
        self.micro_batch_size = D.min_int(max(1, old // 2))
        self.oom_adjustments += 1
        message = f"out of memory at step {self.step}: micro-batch {old} -> {self.micro_batch_size}"
        self._say(message + ", redoing the step")
        self.recorder.event(
            "oom_adjustment",
            message,
            step=self.step,
            old_micro_batch=old,
            new_micro_batch=self.micro_batch_size,
        )

    def _optimizer_step(self) -> None:
        cfg = self.config
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        measure = (self.step + 1) % cfg.log_every_steps == 0
        if cfg.grad_clip_norm is not None or measure:
            max_norm = cfg.grad_clip_norm if cfg.grad_clip_norm is not None else float("inf")
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
            self.meter.grad_norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    # ------------------------------------------------------------ finish
    def _finish(self, status: str, stopped_by: str) -> FitResult:
        try:
            # after Ctrl-C only a single process can save safely (no collectives)
            can_save = status != "failed" and (status != "stopped" or not self.env.is_distributed)
            if can_save and self.step > self.logged_step:
                self._log()  # the last step is recorded even off the log_every_steps grid
            if status == "completed" and self.eval_data is not None:
                self._run_eval()
            if self.ckpt is not None:
                if can_save and self.step > max(self.start_step, self.saved_step):
                    self.save_checkpoint(blocking=True)
                else:
                    self.ckpt.wait()
            self._stop_monitor()  # its last samples are written before the run ends
            result = self._result(stopped_by)
            self.recorder.finish(status, _json(result.to_dict()))
            for cb in self.callbacks if status != "failed" else ():
                cb.on_fit_end(self, result)
            return result
        finally:
            self._stop_monitor()
            self.progress.close()
            self.sinks.close(status)
            if self._owns_group:
                self._leave_process_group()

    def _leave_process_group(self) -> None:
        """Destroy the group and whatever still holds it while the interpreter is alive.

        A DDP reducer or a pending gloo work object that is only freed during interpreter
        finalization can abort the process ("terminate called without an active
        exception"), and torchrun would count that as a failed worker.
        """
        import gc

        import torch.distributed as dist

        self.wrapped = self.model
        gc.collect()
        dist.destroy_process_group()
        gc.collect()


UNUSED_PARAMETERS_FIX = (
    "DDP found parameters that took no part in the loss (a module the forward skipped); "
    "set TrainConfig(find_unused_parameters=True), or remove them"
)


def _unused_parameters(error: Exception) -> bool:
    """DDP's error for parameters the loss did not reach (its text names the fix)."""
    return isinstance(error, RuntimeError) and "find_unused_parameters" in str(error)


def _rng_states(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The torch generators a step draws from (dropout, init): cheap to copy."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_states(states: tuple, device: torch.device) -> None:
    cpu, cuda = states
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)
