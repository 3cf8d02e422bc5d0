"""The supervisor's record in the run store: one run, its attempts and events."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from cloudtrain.store import Event, RunStore

if TYPE_CHECKING:
    from cloudtrain.launch.supervisor import AttemptOutcome, RunOutcome


class RunRecorder:
    """Writes the supervised run to the store as it goes (open with `RunRecorder.open`)."""

    def __init__(self, store: RunStore, run_id: str) -> None:
        self.store = store
        self.run_id = run_id

    @classmethod
    def open(cls, config: dict[str, Any], *, store_path: str | Path | None = None) -> RunRecorder:
        store = RunStore.open(store_path)
        offer = config.get("offer") or {}
        run_id = store.create_run(
            config.get("name"),
            kind="train",
            config=config,
            command=list(config.get("command", ())),
            price_usd_per_hour=config.get("price_usd_per_hour"),
            provider=offer.get("provider"),
            region=offer.get("region"),
            instance_type=offer.get("instance_type"),
            pricing=offer.get("pricing"),
        )  # the GPU itself is what the Trainer detects, not what the offer promised
        return cls(store, run_id)

    def __enter__(self) -> RunRecorder:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is not None:
            self.store.update_run(self.run_id, status="failed", summary={"error": str(error)})
        self.store.close()

    def _event(self, kind: str, message: str, **data: Any) -> None:
        self.store.add_event(Event(self.run_id, kind, message, time.time(), data))

    def attempt_started(self, attempt: int) -> None:
        self.store.add_attempt(self.run_id, attempt=attempt)

    def attempt_ended(self, outcome: AttemptOutcome) -> None:
        self.store.update_attempt(
            self.run_id,
            outcome.attempt,
            ended_at=time.time(),
            exit_code=outcome.exit_code,
            reason=outcome.reason,
            spend_usd=outcome.spend_usd,
        )

    def restart(self, attempt: int, exit_code: int, backoff_s: float) -> None:
        self._event(
            "restart",
            f"restarting as attempt {attempt} in {backoff_s:g} s after exit code {exit_code}",
            attempt=attempt,
            exit_code=exit_code,
            backoff_s=backoff_s,
        )

    def preemption(self, signum: int, grace_s: float) -> None:
        name = signal.Signals(signum).name
        self._event("preemption", f"{name}: checkpoint requested", signal=name, grace_s=grace_s)

    def budget(self, spend_usd: float, budget_usd: float | None) -> None:
        self._event(
            "budget",
            f"projected spend {spend_usd:.2f} USD would pass the budget {budget_usd} USD",
            spend_usd=spend_usd,
            budget_usd=budget_usd,
        )

    def finished(self, outcome: RunOutcome) -> None:
        summary = {
            "attempts": len(outcome.attempts),
            "exit_code": outcome.exit_code,
            "spend_usd": outcome.spend_usd,
            "checkpoint_dir": outcome.checkpoint_dir,
        }
        self.store.update_run(self.run_id, status=outcome.status, summary=summary)
