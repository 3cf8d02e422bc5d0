"""The Trainer's reporting side: the run in the store, per-step records, the progress
display, the metric sinks (TensorBoard, W&B offline), evaluation and the final FitResult."""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from cloudtrain.runtime import distributed as D
from cloudtrain.runtime.checkpoint import LoadedCheckpoint
from cloudtrain.runtime.evaluation import evaluate
from cloudtrain.runtime.precision import autocast
from cloudtrain.runtime.progress import ProgressDisplay, Snapshot
from cloudtrain.runtime.result import FitResult
from cloudtrain.runtime.sinks import open_sinks, step_scalars
from cloudtrain.runtime.telemetry import (
    RunRecorder,
    device_name,
    device_peak,
    host_info,
    memory_gib,
    start_monitor,
)
from cloudtrain.runtime.trainstate import CheckpointClock, Meter
from cloudtrain.store import SYNC_WAIT_KEY


class TelemetryMixin:
    """Methods of Trainer that report (state lives on the Trainer)."""

    # ------------------------------------------------------- telemetry
    def _start_telemetry(self, loaded: LoadedCheckpoint | None) -> None:
        cfg = self.config
        main = self.env.is_main
        self.peak = device_peak(self.device, self.precision.peak_dtype)
        self.recorder = RunRecorder(cfg.store, enabled=main)
        self.recorder.start(
            name=cfg.run_name,
            config=self._resolved_config(),
            host=host_info(self.device, self.env.world_size),
            gpu_name=self.peak.gpu_name,
            gpu_count=self.env.world_size if self.device.type == "cuda" else 0,
            price_usd_per_hour=cfg.price_usd_per_hour,
            continue_run=loaded.state["trainer"].get("run_id") if loaded is not None else None,
        )
        if loaded is not None:
            self.recorder.event(
                "resume",
                f"resumed from step {loaded.step}",
                path=str(loaded.path),
                step=loaded.step,
            )
            self._say(f"resumed from {loaded.path} (step {loaded.step})")
        self.sinks = open_sinks(
            tensorboard_dir=cfg.tensorboard_dir,
            wandb_dir=cfg.wandb_dir(),
            wandb_project=cfg.wandb_project,
            run_name=self.recorder.run_id or cfg.run_name,
            run_config={**self._resolved_config(), "cloudtrain_run_id": self.recorder.run_id},
            enabled=main,
        )
        """Where scalars go besides the store (closed by _finish); opened before
        the clocks start, so starting W&B is not counted as training time."""
        self.progress = ProgressDisplay(cfg.progress if main else False, cfg.max_steps, self.step)
        self.meter = Meter(self.device, self.step)
        self.clock = CheckpointClock(
            cfg.checkpoint_every_seconds, cfg.mtbf_s, enabled=self.ckpt is not None
        )
        self.last_checkpoint = self.resumed_from
        self.logged_step = self.step
        """Newest step written to the store (the resume point before the first log)."""
        self.eval_loss: float | None = None
        self.started_monotonic = time.monotonic()
        self.sampler = start_monitor(self.recorder, cfg.monitor_interval_s) if cfg.monitor else None

    def _stop_monitor(self) -> None:
        """Stop sampling and write the buffered samples (safe to call twice)."""
        sampler, self.sampler = getattr(self, "sampler", None), None
        if sampler is not None:
            sampler.stop()

    def _resolved_config(self) -> dict[str, Any]:
        """The config as run: "auto" replaced by what was chosen, plus the device and
        world. Keys match what `cloudtrain diagnose` reads (`resolved_precision`, `tf32`,
        `num_workers`, ...); `requested` keeps the values that were replaced."""
        asked = self.config.to_dict()
        loader = getattr(self.source, "loader", None)
        workers = getattr(loader, "num_workers", None)
        resolved: dict[str, Any] = {
            "precision": self.precision.name,
            "tf32": self.precision.tf32,
            "compile": self.compiled,
            "channels_last": self.channels_last,
            "micro_batch_size": self.micro_batch_size,
            "parallelism": self.parallelism,
            "device": str(self.device),
            "num_workers": workers if workers is not None else asked["num_workers"],
        }
        changed = {k: asked[k] for k, v in resolved.items() if asked.get(k) != v}
        return {
            **asked,
            **resolved,
            "resolved_precision": self.precision.name,
            "world_size": self.env.world_size,
            "device_name": device_name(self.device),
            "gpu_name": self.peak.gpu_name,
            **self.planner_facts,
            "requested": changed,
        }

    def _log(self) -> None:
        stats = self.meter.read(self.step)
        if stats is None:
            return
        cfg = self.config
        flops_step = self.flops_per_sample * self.local_batch if self.flops_per_sample else None
        mfu = (
            flops_step / stats.step_s / self.peak.peak_flops
            if (flops_step and self.peak.peak_flops and stats.step_s > 0)
            else None
        )
        allocated, reserved, peak = memory_gib(self.device)
        self.last_mfu = mfu
        self.logged_step = self.step
        ranks = self._gather_rank_times(stats, peak)
        lr = self.optimizer.param_groups[0]["lr"]
        if self.env.is_main:
            self._record_other_ranks(ranks)
            record = dict(
                step=self.step,
                rank=0,
                step_s=stats.step_s,
                data_wait_s=stats.data_wait_s,
                samples=cfg.global_batch_size,
                tokens=stats.tokens,
                loss=stats.loss,
                lr=float(lr),
                grad_norm=stats.grad_norm,
                micro_batch=self.micro_batch_size,
                mfu=mfu,
                flops=flops_step,
                memory_allocated_gib=allocated,
                memory_reserved_gib=reserved,
                memory_peak_gib=peak,
                metrics=self._metric_keys(stats),
            )
            self.recorder.step(**record)
            self.sinks.scalars(self.step, step_scalars(record))
            self.progress.update(
                Snapshot(
                    self.step,
                    stats.loss,
                    stats.samples_per_s(cfg.global_batch_size),
                    stats.tokens_per_s(),
                    mfu,
                    self._cost_usd(),
                )
            )

    def _gather_rank_times(self, stats, peak_gib: float | None) -> list[list[float]]:
        """[step_s, data_wait_s, sync_wait_s, memory_peak_gib (nan: unknown)] of every
        rank; one all_gather at log steps of distributed runs, nothing otherwise."""
        if not self.env.is_distributed:
            return []
        peak = math.nan if peak_gib is None else peak_gib
        return D.gather_floats([stats.step_s, stats.data_wait_s, stats.sync_wait_s, peak])

    def _record_other_ranks(self, ranks: list[list[float]]) -> None:
        """One StepRecord per rank other than 0 (rank 0's is the full record), so the
        straggler rule can compare ranks."""
        for rank, (step_s, data_wait_s, sync_wait_s, peak_gib) in enumerate(ranks):
            if rank == 0:
                continue
            self.recorder.step(
                step=self.step,
                rank=rank,
                step_s=step_s,
                data_wait_s=data_wait_s,
                micro_batch=self.micro_batch_size,
                memory_peak_gib=None if math.isnan(peak_gib) else peak_gib,
                metrics={SYNC_WAIT_KEY: sync_wait_s},
            )

    def _metric_keys(self, stats) -> dict[str, float]:
        keys = {"throughput/samples_per_sec": stats.samples_per_s(self.config.global_batch_size)}
        if stats.tokens_per_s() is not None:
            keys["throughput/tokens_per_sec"] = stats.tokens_per_s()
        if self.env.is_distributed:
            keys[SYNC_WAIT_KEY] = stats.sync_wait_s
        return keys

    def _cost_usd(self) -> float | None:
        price = self.config.price_usd_per_hour
        if price is None:
            return None
        return price * (time.monotonic() - self.started_monotonic) / 3600.0

    def _run_eval(self) -> None:
        if self.eval_data is None:
            return
        self.eval_loss = evaluate(
            self.wrapped,
            self.eval_loss_fn,
            self.eval_data,
            micro_batch=self.micro_batch_size,
            env=self.env,
            device=self.device,
            autocast_ctx=lambda: autocast(self.precision, self.device),
            max_batches=self.config.eval_batches,
            channels_last=self.channels_last,
        )
        if self.env.is_main:
            self.sinks.scalars(self.step, {"eval/loss": self.eval_loss})
        for cb in self.callbacks:
            cb.on_eval(self, self.step, self.eval_loss)

    def _say(self, message: str) -> None:
        if self.env.is_main:
            sys.stderr.write(f"cloudtrain: {message}\n")
            sys.stderr.flush()

    def _result(self, stopped_by: str) -> FitResult:
        cfg = self.config
        totals = self.meter.totals(self.step)
        elapsed = time.monotonic() - self.started_monotonic
        steps_run = self.step - self.start_step
        flops_step = (
            self.flops_per_sample * cfg.global_batch_size if self.flops_per_sample else None
        )
        return FitResult(
            steps=self.step,
            start_step=self.start_step,
            stopped_by=stopped_by,
            elapsed_s=elapsed,
            samples_per_s=steps_run * cfg.global_batch_size / elapsed if steps_run else None,
            tokens_per_s=totals.tokens / elapsed if totals.tokens and steps_run else None,
            mfu=getattr(self, "last_mfu", None),
            flops_per_step=flops_step,
            final_loss=totals.last_loss,
            eval_loss=self.eval_loss,
            cost_usd=self._cost_usd(),
            micro_batch_size=self.micro_batch_size,
            global_batch_size=cfg.global_batch_size,
            precision=self.precision.name,
            device=self.device.type,
            world_size=self.env.world_size,
            checkpoint_dir=str(cfg.checkpoint_dir) if cfg.checkpoint_dir else None,
            last_checkpoint=self.last_checkpoint,
            resumed_from=self.resumed_from,
            oom_adjustments=self.oom_adjustments,
            run_id=self.recorder.run_id,
            gpu_name=self.peak.gpu_name,
        )
