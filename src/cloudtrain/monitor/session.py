"""Watching a job: the progress of the active run (throughput, MFU, ETA, cost, energy) and
running any command as a recorded run with a sampler and a watchdog around it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cloudtrain.catalog import Catalog, load_catalog, lookup
from cloudtrain.monitor.alerts import Alert, AlertConfig
from cloudtrain.monitor.energy import carbon_intensity, kg_co2e, pue_of
from cloudtrain.monitor.nvml import Nvml, open_nvml
from cloudtrain.monitor.sampler import Sampler, SamplerConfig
from cloudtrain.monitor.sinks import default_sinks
from cloudtrain.monitor.snapshots import Snapshot
from cloudtrain.monitor.stacks import STACK_DUMP_ENV
from cloudtrain.monitor.watchdog import Watchdog
from cloudtrain.paths import home_dir
from cloudtrain.store import Run, RunStore

RUN_ID_ENV = "CLOUDTRAIN_RUN_ID"
"""Set for a watched command: the id of the run that records it."""


@dataclass(frozen=True)
class RunProgress:
    """Where a run stands. Rates are over the recent steps; None when not recorded."""

    run_id: str
    name: str
    status: str
    step: int | None
    max_steps: int | None
    steps_per_s: float | None
    samples_per_s: float | None
    tokens_per_s: float | None
    mfu: float | None
    loss: float | None
    eta_s: float | None
    """Seconds to max_steps at the recent rate; None without max_steps or a rate."""
    elapsed_s: float | None
    cost_usd: float | None
    gpu_energy_kwh: float | None
    """GPU energy since the sampler started (this watch), from the latest snapshot."""
    kg_co2e: float | None


def active_run(store: RunStore) -> Run | None:
    """The most recently created run that is still running; None if none."""
    running = store.list_runs(limit=1, status="running")
    return running[0] if running else None


def _rate(values: Sequence[tuple[float, float]]) -> float | None:
    if len(values) < 2 or values[-1][0] <= values[0][0]:
        return None
    return (values[-1][1] - values[0][1]) / (values[-1][0] - values[0][0])


def run_progress(
    store: RunStore,
    run: Run,
    snapshot: Snapshot | None = None,
    catalog: Catalog | None = None,
    now: float | None = None,
) -> RunProgress:
    """Progress of `run` from its recent steps (rank 0) and the latest snapshot."""
    now = time.time() if now is None else now
    last = store.last_step(run.id)
    since = None if last is None else max(-1, last.step - 50)
    recent = [s for s in store.steps(run.id, rank=0, since_step=since)] if last else []
    steps_per_s = _rate([(s.time_unix_s, float(s.step)) for s in recent])
    samples_per_s = _metric(recent, "throughput/samples_per_sec")
    tokens_per_s = _metric(recent, "throughput/tokens_per_sec")
    max_steps = run.config.get("max_steps")
    eta = None
    if max_steps and steps_per_s and last is not None:
        eta = max(0.0, (int(max_steps) - last.step) / steps_per_s)
    energy_j = None
    if snapshot is not None:
        energies = [g.energy_j for g in snapshot.gpus if g.energy_j is not None]
        energy_j = sum(energies) if energies else None
    co2 = None
    if energy_j is not None:
        catalog = catalog if catalog is not None else load_catalog()
        intensity, _ = carbon_intensity(catalog, run.provider, run.region)
        co2 = kg_co2e(energy_j, pue_of(catalog, run.provider), intensity)
    return RunProgress(
        run.id,
        run.name,
        run.status,
        None if last is None else last.step,
        int(max_steps) if max_steps else None,
        steps_per_s,
        samples_per_s,
        tokens_per_s,
        None if last is None else last.mfu,
        None if last is None else last.loss,
        eta,
        run.duration_s(now),
        run.cost_usd(now),
        None if energy_j is None else energy_j / 3.6e6,
        co2,
    )


def _metric(records, key: str) -> float | None:
    for record in reversed(records):
        if record.metrics.get(key) is not None:
            return float(record.metrics[key])
    return None


def resolve_gpu_name(catalog: Catalog, snapshot: Snapshot) -> str | None:
    """Canonical catalog name of the first GPU (None: no GPU, or unknown to the catalog)."""
    if not snapshot.gpus:
        return None
    spec = lookup.resolve_gpu(catalog, snapshot.gpus[0].name)
    return spec.name if spec else snapshot.gpus[0].name


class WatchedCommand:
    """Runs `command` as a recorded run (kind "watch"): samples the machine and the
    command's process tree into the store, guards it with a watchdog, and records how it
    ended. The command gets $CLOUDTRAIN_RUN_ID and $CLOUDTRAIN_STACK_DUMP (a script that
    calls `enable_stack_dumps_from_env()` can then be stack-dumped when it stalls)."""

    def __init__(
        self,
        command: Sequence[str],
        store: RunStore,
        *,
        name: str | None = None,
        alerts: AlertConfig | None = None,
        sampler: SamplerConfig | None = None,
        nvml: Nvml | None = None,
        price_usd_per_hour: float | None = None,
        provider: str | None = None,
        region: str | None = None,
        catalog: Catalog | None = None,
    ) -> None:
        self.command = list(command)
        self.store = store
        self.alerts = alerts or AlertConfig()
        nvml = nvml if nvml is not None else open_nvml()
        probe = Sampler(nvml=nvml, config=sampler).read()
        catalog = catalog if catalog is not None else load_catalog()
        self.run_id = store.create_run(
            name,
            kind="watch",
            command=self.command,
            gpu_name=resolve_gpu_name(catalog, probe),
            gpu_count=len(probe.gpus),
            provider=provider,
            region=region,
            price_usd_per_hour=price_usd_per_hour,
            host={"hostname": probe.host.hostname},
        )
        self.stack_path = stack_dump_file(self.run_id)
        self.process: subprocess.Popen[bytes] | None = None
        self.sampler = Sampler(config=sampler, nvml=nvml, store=store, run_id=self.run_id)
        self.watchdog = Watchdog(
            self.alerts,
            store=store,
            run_id=self.run_id,
            stack_dump_path=self.stack_path,
            sinks=default_sinks(
                command=self.alerts.command,
                webhook_url=self.alerts.webhook_url,
                store=store,
                run_id=self.run_id,
            ),
            stop_job=self._stop,
            spend_usd=self._spend,
        )
        self.sampler.add_listener(self.watchdog.on_snapshot)
        self.stopped_by: str | None = None

    def _spend(self, now: float) -> float | None:
        run = self.store.get_run(self.run_id)
        return run.cost_usd(now)

    def _stop(self, alert: Alert) -> None:
        self.stopped_by = alert.rule
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def start(self) -> WatchedCommand:
        self.stack_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, RUN_ID_ENV: self.run_id, STACK_DUMP_ENV: str(self.stack_path)}
        try:
            self.process = subprocess.Popen(self.command, env=env)
        except OSError as error:
            self.store.update_run(self.run_id, status="failed", summary={"error": str(error)})
            raise
        self.sampler.host.watch_process(self.process.pid)
        self.sampler.start()
        return self

    def wait(self, poll_s: float = 0.2) -> int:
        """Wait for the command; record its end; return its exit code."""
        if self.process is None:
            raise RuntimeError("WatchedCommand.wait() before start()")
        try:
            while (code := self.process.poll()) is None:
                time.sleep(poll_s)
        except KeyboardInterrupt:
            self.process.send_signal(signal.SIGINT)
            code = self.process.wait()
            self.stopped_by = self.stopped_by or "interrupt"
        self.finish(code)
        return code

    def finish(self, exit_code: int) -> Run:
        self.sampler.stop()
        status = "stopped" if self.stopped_by else ("completed" if exit_code == 0 else "failed")
        return self.store.update_run(
            self.run_id,
            status=status,
            summary={
                "exit_code": exit_code,
                "stopped_by": self.stopped_by,
                "samples": self.sampler.sample_count,
            },
        )


def stack_dump_file(run_id: str) -> Path:
    """Where a watched run's processes write their stack dumps."""
    return home_dir() / "stacks" / f"{run_id}.txt"
