"""The watchdog: runs the alert rules over snapshots, steps, spend and progress, and acts:
it sends alerts to the sinks, dumps the stacks of a stalled process into the alert (and so
into the store), and stops the job when an idle guard says so.

Wire it to a sampler with `sampler.add_listener(watchdog.on_snapshot)`; report steps with
`on_step` or let it read them from the store (`store` + `run_id`)."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from cloudtrain.monitor.alerts import Alert, AlertConfig, AlertRules
from cloudtrain.monitor.sinks import AlertSink
from cloudtrain.monitor.snapshots import Snapshot
from cloudtrain.monitor.stacks import request_stack_dump
from cloudtrain.store import RunStore

log = logging.getLogger(__name__)

MAX_STACK_CHARS = 200_000


class Watchdog:
    """Guards one job.

    `stack_dump_path`: the file the training process registered with `enable_stack_dumps`
    (None: no dumps). `stop_job(alert)`: called when a rule asks to stop the job (idle
    guard with `idle_stop`); None: never stops anything. `spend_usd(now)`: the job's spend
    so far for the budget rule; None: no budget check. The stall rule starts counting at
    the first step seen, so a job that reports no steps never "stalls".
    """

    def __init__(
        self,
        config: AlertConfig | None = None,
        *,
        sinks: Iterable[AlertSink] = (),
        store: RunStore | None = None,
        run_id: str | None = None,
        stack_dump_path: str | Path | None = None,
        stop_job: Callable[[Alert], None] | None = None,
        spend_usd: Callable[[float], float | None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config or AlertConfig()
        self.rules = AlertRules(self.config)
        self.sinks = list(sinks)
        self.store = store
        self.run_id = run_id
        self.stack_dump_path = Path(stack_dump_path) if stack_dump_path else None
        self.stop_job = stop_job
        self.spend_usd = spend_usd
        self.clock = clock
        self.fired: list[Alert] = []
        self.last_step: int | None = None
        self.last_progress_s: float | None = None
        self.stopped = False
        self._lock = threading.Lock()

    def on_step(self, step: int, loss: float | None = None, now: float | None = None) -> None:
        """Report a finished step (and its loss, checked for NaN/inf)."""
        now = self.clock() if now is None else now
        with self._lock:
            if self.last_step is None or step != self.last_step:
                self.last_step, self.last_progress_s = step, now
        self._dispatch(self.rules.check_loss(step, loss, now))

    def _steps_from_store(self, now: float) -> None:
        if self.store is None or self.run_id is None:
            return
        try:
            record = self.store.last_step(self.run_id)
        except Exception:
            log.exception("watchdog could not read the last step")
            return
        if record is not None and record.step != self.last_step:
            self.on_step(record.step, record.loss, now)

    def on_snapshot(self, snapshot: Snapshot) -> None:
        """Sampler listener: rules over the reading, then the periodic checks."""
        self._dispatch(self.rules.check_snapshot(snapshot))
        self.poll(snapshot.time_unix_s)

    def poll(self, now: float | None = None) -> list[Alert]:
        """Progress (stall), and spend (budget) checks; returns what fired."""
        now = self.clock() if now is None else now
        self._steps_from_store(now)
        alerts = self.rules.check_progress(self.last_progress_s, self.last_step, now)
        if self.spend_usd is not None:
            alerts += self.rules.check_spend(self.spend_usd(now), now)
        return self._dispatch(alerts)

    def _with_stacks(self, alert: Alert) -> Alert:
        if self.stack_dump_path is None:
            return dataclasses.replace(alert, data={**alert.data, "stacks": None})
        stacks = request_stack_dump(self.stack_dump_path)
        note = "" if stacks else " (no process registered for stack dumps)"
        return dataclasses.replace(
            alert,
            message=alert.message + note,
            data={
                **alert.data,
                "stacks": stacks[:MAX_STACK_CHARS] if stacks else None,
                "stack_dump_path": str(self.stack_dump_path),
            },
        )

    def _dispatch(self, alerts: list[Alert]) -> list[Alert]:
        delivered = []
        for alert in alerts:
            if alert.rule == "stall":
                alert = self._with_stacks(alert)
            delivered.append(alert)
            self.fired.append(alert)
            for sink in self.sinks:
                try:
                    sink.send(alert)
                except Exception:
                    log.exception("alert sink %r failed", sink)
            if alert.data.get("stop") and self.stop_job is not None and not self.stopped:
                self.stopped = True
                self.stop_job(alert)
        return delivered
