"""Alert rules with typed thresholds. `AlertRules` is a pure, stateful evaluator: feed it
snapshots, steps, spend and progress; it returns the `Alert`s that fire (each rule at
most once per `repeat_s` per GPU). Delivery is `monitor.sinks`; the loop is
`monitor.watchdog`."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from cloudtrain.errors import UserError, did_you_mean
from cloudtrain.monitor.snapshots import GPUSnapshot, Snapshot, throttle_names

RULES = ("gpu_idle", "memory_high", "throttling", "ecc_errors", "nan_loss", "budget", "stall")


@dataclass(frozen=True)
class AlertConfig:
    """Thresholds of the guards. A threshold of None turns its rule off."""

    idle_util_pct: float = 5.0
    """A GPU below this utilization counts as idle."""
    idle_minutes: float | None = 10.0
    """Alert after the GPUs were all idle this long; None: never."""
    idle_stop: bool = False
    """Also stop the job when the idle alert fires (reclaims a rented instance)."""
    memory_fraction: float | None = 0.95
    """Alert when a GPU's used memory exceeds this share of its total."""
    throttle_s: float | None = 30.0
    """Alert when thermal/power throttling lasts this many seconds under load."""
    ecc: bool = True
    """Alert on any new uncorrected ECC error."""
    nan_loss: bool = True
    """Alert on a NaN or infinite loss."""
    budget_usd: float | None = None
    """Alert once spend passes this many USD."""
    stall_s: float | None = 600.0
    """Alert (and dump stacks) after this many seconds with no step progress."""
    repeat_s: float = 600.0
    """Quiet time before the same rule fires again for the same GPU."""
    command: str | None = None
    """Shell command run per alert (alert JSON in $CLOUDTRAIN_ALERT_JSON)."""
    webhook_url: str | None = None
    """URL that receives each alert as a JSON POST."""

    def __post_init__(self) -> None:
        checks = [
            ("idle_util_pct", self.idle_util_pct, 0, 100),
            ("memory_fraction", self.memory_fraction, 0, 1),
        ]
        for name, value, low, high in checks:
            if value is not None and not low <= value <= high:
                raise UserError(f"alert config: {name} must be in [{low}, {high}], not {value}")
        for name in ("idle_minutes", "throttle_s", "budget_usd", "stall_s", "repeat_s"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise UserError(f"alert config: {name} must be >= 0, not {value}")
        if self.webhook_url and not self.webhook_url.startswith(("http://", "https://")):
            raise UserError(
                f"alert config: webhook_url must be http(s)://..., not {self.webhook_url!r}"
            )


def alert_config_from(values: Mapping[str, Any], where: str = "[alerts]") -> AlertConfig:
    """An AlertConfig from a mapping (e.g. the [alerts] table of cloudtrain.toml); unknown
    keys are an error that names the valid ones."""
    valid = [f.name for f in fields(AlertConfig)]
    for key in values:
        if key not in valid:
            raise UserError(f"{where}: unknown key '{key}'{did_you_mean(key, valid)}")
    return AlertConfig(**dict(values))


@dataclass(frozen=True)
class Alert:
    """One firing of a rule. `gpu_index` None: not about one GPU."""

    rule: str
    severity: str
    """"warn" or "critical"."""
    message: str
    value: float | None = None
    threshold: float | None = None
    gpu_index: int | None = None
    time_unix_s: float = field(default_factory=time.time)
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Since:
    """When a condition started holding (None: not holding)."""

    start_s: float | None = None

    def update(self, holds: bool, now_s: float) -> float:
        """Seconds the condition has held now (0 when it does not)."""
        if not holds:
            self.start_s = None
            return 0.0
        if self.start_s is None:
            self.start_s = now_s
        return now_s - self.start_s


class AlertRules:
    """Evaluates the rules; remembers durations, counters and when each alert last fired."""

    def __init__(self, config: AlertConfig | None = None) -> None:
        self.config = config or AlertConfig()
        self._idle = _Since()
        self._throttled: dict[int, _Since] = {}
        self._ecc_seen: dict[int, int] = {}
        self._last_fired: dict[tuple[str, int | None], float] = {}

    def _fire(self, alert: Alert) -> list[Alert]:
        key = (alert.rule, alert.gpu_index)
        last = self._last_fired.get(key)
        if last is not None and alert.time_unix_s - last < self.config.repeat_s:
            return []
        self._last_fired[key] = alert.time_unix_s
        return [alert]

    def check_snapshot(self, snapshot: Snapshot) -> list[Alert]:
        """GPU idle, memory, throttling and ECC rules over one reading."""
        now = snapshot.time_unix_s
        alerts = self._check_idle(snapshot.gpus, now)
        for gpu in snapshot.gpus:
            alerts += self._check_memory(gpu, now)
            alerts += self._check_throttle(gpu, now)
            alerts += self._check_ecc(gpu, now)
        return alerts

    def _check_idle(self, gpus: tuple[GPUSnapshot, ...], now: float) -> list[Alert]:
        minutes = self.config.idle_minutes
        utils = [g.util_pct for g in gpus if g.util_pct is not None]
        if minutes is None or not utils:
            return []
        idle = all(u < self.config.idle_util_pct for u in utils)
        idle_s = self._idle.update(idle, now)
        if not idle or idle_s < minutes * 60:
            return []
        action = " - stopping the job" if self.config.idle_stop else ""
        return self._fire(
            Alert(
                "gpu_idle",
                "warn",
                f"GPUs idle (< {self.config.idle_util_pct:g}% utilization) for "
                f"{idle_s / 60:.1f} min{action}",
                value=idle_s,
                threshold=minutes * 60,
                time_unix_s=now,
                data={"stop": self.config.idle_stop, "max_util_pct": max(utils)},
            )
        )

    def _check_memory(self, gpu: GPUSnapshot, now: float) -> list[Alert]:
        limit, used = self.config.memory_fraction, gpu.memory_used_fraction
        if limit is None or used is None or used <= limit:
            return []
        return self._fire(
            Alert(
                "memory_high",
                "warn",
                f"GPU {gpu.index} memory {used:.0%} used ({gpu.memory_used_gib:.1f} of "
                f"{gpu.memory_total_gib:.1f} GiB): close to out of memory",
                value=used,
                threshold=limit,
                gpu_index=gpu.index,
                time_unix_s=now,
            )
        )

    def _check_throttle(self, gpu: GPUSnapshot, now: float) -> list[Alert]:
        if self.config.throttle_s is None:
            return []
        reasons = throttle_names(gpu.throttle_reasons)
        busy = gpu.util_pct is None or gpu.util_pct >= 50.0
        held_s = self._throttled.setdefault(gpu.index, _Since()).update(bool(reasons) and busy, now)
        if not reasons or not busy or held_s < self.config.throttle_s:
            return []
        clocks = ""
        if gpu.sm_clock_mhz is not None and gpu.sm_clock_max_mhz:
            clocks = f", SM clock {gpu.sm_clock_mhz:.0f}/{gpu.sm_clock_max_mhz:.0f} MHz"
        return self._fire(
            Alert(
                "throttling",
                "warn",
                f"GPU {gpu.index} throttled ({', '.join(reasons)}) for {held_s:.0f} s{clocks}",
                value=held_s,
                threshold=self.config.throttle_s,
                gpu_index=gpu.index,
                time_unix_s=now,
                data={
                    "reasons": reasons,
                    "temperature_c": gpu.temperature_c,
                    "power_w": gpu.power_w,
                },
            )
        )

    def _check_ecc(self, gpu: GPUSnapshot, now: float) -> list[Alert]:
        count = gpu.ecc_uncorrected_volatile
        if not self.config.ecc or count is None:
            return []
        previous = self._ecc_seen.get(gpu.index)
        self._ecc_seen[gpu.index] = count
        if count == 0 or (previous is not None and count <= previous):
            return []
        return self._fire(
            Alert(
                "ecc_errors",
                "critical",
                f"GPU {gpu.index} has {count} uncorrected ECC error(s): results may be wrong; "
                "drain the GPU and reset it (or ask the provider for another machine)",
                value=float(count),
                threshold=0.0,
                gpu_index=gpu.index,
                time_unix_s=now,
            )
        )

    def check_loss(self, step: int, loss: float | None, now: float) -> list[Alert]:
        if not self.config.nan_loss or loss is None or math.isfinite(loss):
            return []
        return self._fire(
            Alert(
                "nan_loss",
                "critical",
                f"loss is {loss} at step {step}",
                value=None,
                time_unix_s=now,
                data={"step": step},
            )
        )

    def check_spend(self, spend_usd: float | None, now: float) -> list[Alert]:
        budget = self.config.budget_usd
        if budget is None or spend_usd is None or spend_usd <= budget:
            return []
        return self._fire(
            Alert(
                "budget",
                "critical",
                f"spend ${spend_usd:,.2f} exceeds the budget ${budget:,.2f}",
                value=spend_usd,
                threshold=budget,
                time_unix_s=now,
                data={"spend_usd": spend_usd, "budget_usd": budget},
            )
        )

    def check_progress(
        self, last_progress_s: float | None, step: int | None, now: float
    ) -> list[Alert]:
        """Stall rule: `last_progress_s` is when the step count last changed."""
        limit = self.config.stall_s
        if limit is None or last_progress_s is None or now - last_progress_s < limit:
            return []
        quiet_s = now - last_progress_s
        return self._fire(
            Alert(
                "stall",
                "critical",
                f"no step progress for {quiet_s:.0f} s (last step {step})",
                value=quiet_s,
                threshold=limit,
                time_unix_s=now,
                data={"step": step},
            )
        )
