"""The Trainer's checkpoint side: when to save, what a checkpoint holds (plain or
gathered from FSDP shards), and writing it through the CheckpointManager."""

from __future__ import annotations

import json
from typing import Any

import torch

from cloudtrain.runtime import distributed as D
from cloudtrain.runtime.checkpoint import capture_rng


class CheckpointingMixin:
    """Methods of Trainer that deal with checkpoints (state lives on the Trainer)."""

    # ------------------------------------------------------- checkpoints
    def _maybe_checkpoint(self) -> None:
        if self.ckpt is None:
            return
        every = self.config.checkpoint_every_steps
        due = every is not None and self.step % every == 0
        if due or self._step_flags().checkpoint_due:
            self.save_checkpoint()

    def save_checkpoint(self, *, blocking: bool = False) -> str | None:
        """Write a checkpoint of the current step now; returns its directory."""
        if self.ckpt is None:
            return None

        rank_state = {"rng": capture_rng(self.device), "data": self.source.position.to_dict()}
        if self.comm_hook_state is not None:  # PowerSGD: error feedback, warm start, RNG
            rank_state["powersgd"] = D.powersgd_state_dict(self.comm_hook_state)
        fsdp = self.parallelism == "fsdp"
        path = self.ckpt.save(
            self.step,
            self._full_state,
            rank_state,
            async_write=self.config.async_checkpoint and not blocking,
            sharded=self._save_shards if fsdp else None,
        )
        if blocking:
            self.ckpt.wait()
        self.saved_step = self.step
        self.clock.saved(self.ckpt.last_save_s)
        self.last_checkpoint = str(path)
        self.recorder.event(
            "checkpoint",
            f"checkpoint at step {self.step}",
            path=str(path),
            step=self.step,
            save_s=self.ckpt.last_save_s,
        )
        for cb in self.callbacks:
            cb.on_checkpoint(self, self.step, str(path))
        return str(path)

    def _full_state(self) -> dict[str, Any]:
        """What rank 0 writes to state.pt; under FSDP the model and optimizer are not in
        it (each rank wrote its shards, see `_save_shards`)."""
        if self.parallelism == "fsdp":
            model_state, optim_state = None, None
        else:
            model_state, optim_state = self.model.state_dict(), self.optimizer.state_dict()
        return {
            "model": model_state,
            "optimizer": optim_state,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "trainer": {
                "step": self.step,
                "micro_batch_size": self.micro_batch_size,
                "data": self.source.position.to_dict(),
                "world_size": self.env.world_size,
                "run_id": self.recorder.run_id,
                "config": _json(self.config.to_dict()),
            },
        }

    def full_model_state(self) -> dict[str, torch.Tensor]:
        """The whole model's state_dict as plain tensors (under FSDP a collective: call
        it on every rank, e.g. from Callback.on_fit_end)."""
        if getattr(self, "parallelism", "none") == "fsdp":
            from torch.distributed.checkpoint.state_dict import get_model_state_dict

            return get_model_state_dict(self.model, options=self._fsdp_options())
        return self.model.state_dict()

    # ------------------------------------------------------- FSDP state
    def _fsdp_options(self):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True, cpu_offload=True)

    def _sharded_state(self) -> dict[str, Any]:
        """Model and optimizer state as DCP sees it: this rank's shards (DTensors) under
        FSDP, whole tensors otherwise; optimizer state keyed by parameter name."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optimizer": optim_state}

    def _save_shards(self, directory) -> None:
        from cloudtrain.runtime.sharded import save_sharded

        save_sharded(self._sharded_state(), directory)

    def _load_shards(self, directory) -> None:
        """Model and optimizer from a sharded checkpoint (each rank reads its shards; a
        checkpoint from another world size or parallelism is resharded by DCP)."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        from cloudtrain.runtime.sharded import load_sharded

        state = self._sharded_state()
        load_sharded(state, directory)
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
        )

    def _fsdp_load_model(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.model, state, options=self._fsdp_options())

    def _fsdp_load_optimizer(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.optimizer, state, options=self._fsdp_options())


def _json(value: Any) -> Any:
    """Round-trip through JSON so only plain values remain (strings for the rest)."""
    return json.loads(json.dumps(value, default=str))
