"""Spot availability and price traces: the CSV format, a loader and a synthetic generator.

Trace CSV format (one header row, then one row per interval, evenly spaced):

    timestamp,available,price
    2026-01-01T00:00:00Z,1,0.92
    2026-01-01T00:10:00Z,0,
    2026-01-01T00:20:00Z,1,0.95

- `timestamp`: ISO 8601 (`2026-01-01T00:00:00Z`) or seconds (a number). Rows are
  in increasing order with one constant gap; a row holds from its timestamp until
  the next row's (the last row for one more gap).
- `available`: 1/0 (also true/false, yes/no): can a spot instance be had and kept
  over this interval. A spot instance running when `available` turns 0 is preempted.
- `price`: spot price in USD per hour of the whole instance over this interval;
  may be empty where `available` is 0.

The on-demand price is not part of the trace; it is given separately.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import random
from dataclasses import dataclass
from pathlib import Path

from cloudtrain.errors import DataError, UserError

TRACE_COLUMNS = ("timestamp", "available", "price")
_TRUE = {"1", "true", "yes", "y", "t"}
_FALSE = {"0", "false", "no", "n", "f"}


@dataclass(frozen=True)
class SpotTrace:
    """Spot availability and price over evenly spaced intervals."""

    step_hours: float
    """Length of one interval in hours."""
    available: tuple[bool, ...]
    """Per interval: could a spot instance run through it."""
    price_usd_per_hour: tuple[float | None, ...]
    """Per interval: spot price of the instance; None where unavailable and unpriced."""
    source: str = "synthetic"
    """Where the trace came from: a file path, or 'synthetic(...)' with its parameters."""

    def __post_init__(self) -> None:
        if not self.step_hours > 0:
            raise UserError(f"trace step must be positive, got {self.step_hours} h")
        if len(self.available) != len(self.price_usd_per_hour):
            raise UserError("trace: 'available' and 'price' must have the same length")
        if not self.available:
            raise UserError(f"trace {self.source} is empty; it needs at least one row")

    @property
    def duration_hours(self) -> float:
        return self.step_hours * len(self.available)

    @property
    def availability(self) -> float:
        """Fraction of intervals in which spot was available."""
        return sum(self.available) / len(self.available)

    def at(self, index: int) -> tuple[bool, float | None]:
        """(available, price) of interval `index`; past the end spot is unavailable."""
        if index < len(self.available):
            return self.available[index], self.price_usd_per_hour[index]
        return False, None


def _parse_timestamp(text: str, path: Path, line: int) -> float:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as error:
        raise DataError(
            path, f"timestamp '{text}' is neither ISO 8601 nor seconds", line=line
        ) from error
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return moment.timestamp()


def _parse_available(text: str, path: Path, line: int) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise DataError(path, f"'{text}' is not 1/0 (or true/false)", line=line, column="available")


def _parse_price(text: str, available: bool, path: Path, line: int) -> float | None:
    if not text.strip():
        if available:
            raise DataError(path, "price is empty where spot is available", line=line)
        return None
    try:
        price = float(text)
    except ValueError as error:
        raise DataError(path, f"'{text}' is not a number", line=line, column="price") from error
    if not math.isfinite(price) or price < 0:
        raise DataError(path, f"price {text} must be >= 0", line=line, column="price")
    return price


def load_trace(path: str | Path) -> SpotTrace:
    """Read a trace CSV (format in this module's docstring); DataError names file:line."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"trace file {path} not found; see `cloudtrain spot simulate --help`")
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in TRACE_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise DataError(path, f"missing column(s) {', '.join(missing)}", line=1)
        times: list[float] = []
        available: list[bool] = []
        prices: list[float | None] = []
        for line, row in enumerate(reader, start=2):
            times.append(_parse_timestamp(row["timestamp"] or "", path, line))
            available.append(_parse_available(row["available"] or "", path, line))
            prices.append(_parse_price(row["price"] or "", available[-1], path, line))
    if not times:
        raise DataError(path, "no rows after the header", line=1)
    return SpotTrace(_even_step_hours(times, path), tuple(available), tuple(prices), str(path))


def _even_step_hours(times: list[float], path: Path) -> float:
    if len(times) == 1:
        raise DataError(path, "one row gives no interval length; add a second row", line=2)
    step_s = times[1] - times[0]
    for index in range(1, len(times)):
        gap_s = times[index] - times[index - 1]
        if gap_s <= 0 or abs(gap_s - step_s) > 1e-6 * max(step_s, 1.0):
            raise DataError(
                path,
                f"rows must be evenly spaced ({step_s:g} s apart); this one is {gap_s:g} s "
                "after the previous; resample the trace",
                line=index + 2,
            )
    return step_s / 3600.0


def save_trace(trace: SpotTrace, path: str | Path, *, start_unix_s: float = 0.0) -> Path:
    """Write `trace` in the documented CSV format (timestamps in ISO 8601, UTC)."""
    path = Path(path)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(TRACE_COLUMNS)
        for index, (up, price) in enumerate(
            zip(trace.available, trace.price_usd_per_hour, strict=True)
        ):
            moment = dt.datetime.fromtimestamp(
                start_unix_s + index * trace.step_hours * 3600.0, tz=dt.timezone.utc
            )
            stamp = moment.strftime("%Y-%m-%dT%H:%M:%SZ")
            writer.writerow([stamp, int(up), "" if price is None else f"{price:.6g}"])
    return path


def synthetic_trace(
    preemptions_per_hour: float,
    *,
    hours: float,
    seed: int = 0,
    step_hours: float = 1.0 / 6.0,
    mean_outage_hours: float = 1.0,
    on_demand_price_usd_per_hour: float = 1.0,
    spot_discount: float = 0.7,
    price_jitter: float = 0.1,
) -> SpotTrace:
    """A seeded two-state (available/unavailable) Markov trace.

    While spot is available it is lost in each interval with probability
    `preemptions_per_hour * step_hours` (so about `preemptions_per_hour` preemptions
    per hour of spot use); an outage lasts `mean_outage_hours` on average
    (geometric). The spot price is `on_demand * (1 - spot_discount)` times a factor
    drawn uniformly from [1 - price_jitter, 1 + price_jitter] for each interval.
    """
    if preemptions_per_hour < 0 or preemptions_per_hour * step_hours > 1:
        raise UserError(
            f"interruption rate {preemptions_per_hour}/h must be in [0, {1 / step_hours:g}] "
            f"for {step_hours * 60:g}-minute intervals"
        )
    if not 0 <= spot_discount < 1 or not 0 <= price_jitter < 1:
        raise UserError("spot_discount and price_jitter must be in [0, 1)")
    if mean_outage_hours < step_hours:
        raise UserError(f"mean outage must be at least one interval ({step_hours:g} h)")
    rng = random.Random(seed)
    steps = max(1, math.ceil(hours / step_hours - 1e-9))
    p_lose = preemptions_per_hour * step_hours
    p_recover = step_hours / mean_outage_hours
    base_price = on_demand_price_usd_per_hour * (1.0 - spot_discount)
    up = True
    available: list[bool] = []
    prices: list[float | None] = []
    for _ in range(steps):
        available.append(up)
        jitter = 1.0 + price_jitter * (2.0 * rng.random() - 1.0)
        prices.append(base_price * jitter if up else None)
        up = rng.random() >= p_lose if up else rng.random() < p_recover
    source = (
        f"synthetic(rate={preemptions_per_hour:g}/h, outage={mean_outage_hours:g} h, seed={seed})"
    )
    return SpotTrace(step_hours, tuple(available), tuple(prices), source)
