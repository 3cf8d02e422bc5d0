"""Records to table rows and back: column lists, JSON columns, NaN-preserving floats.

SQLite stores a bound NaN as NULL. A NaN loss is a finding in itself, so step columns
that held NaN are listed in the row's `nan_fields` and restored on read. JSON columns
(dicts, lists) are compact JSON; NaN and infinities survive as Python's JSON extensions.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields
from typing import Any

from cloudtrain.store.records import Attempt, Event, Finding, Run, Sample, StepRecord

RUN_COLUMNS = tuple(f.name for f in fields(Run))
RUN_JSON_COLUMNS = frozenset({"config", "host", "command", "summary"})
ATTEMPT_COLUMNS = tuple(f.name for f in fields(Attempt))

STEP_FIELDS = tuple(f.name for f in fields(StepRecord) if f.name != "metrics")
STEP_COLUMNS = (*STEP_FIELDS, "metrics", "nan_fields")
SAMPLE_COLUMNS = ("run_id", "host", "time_unix_s", "metrics")
EVENT_COLUMNS = ("run_id", "time_unix_s", "kind", "message", "data")
FINDING_COLUMNS = tuple(f.name for f in fields(Finding))


def dumps(value: Any) -> str:
    """Compact JSON; objects JSON cannot hold (paths, enums) are written as strings."""
    return json.dumps(value, separators=(",", ":"), default=str)


def loads(text: str | None, empty: Any) -> Any:
    return empty if text is None or text == "" else json.loads(text)


def insert_sql(table: str, columns: tuple[str, ...]) -> str:
    marks = ", ".join("?" for _ in columns)
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"


def select_sql(table: str, columns: tuple[str, ...]) -> str:
    return f"SELECT {', '.join(columns)} FROM {table}"


def run_value(column: str, value: Any) -> Any:
    """A Run field as stored: JSON for dicts and lists, the value itself otherwise."""
    if column not in RUN_JSON_COLUMNS:
        return value
    if value is None:
        value = [] if column == "command" else {}
    return dumps(value)


def row_to_run(row: tuple[Any, ...]) -> Run:
    values = dict(zip(RUN_COLUMNS, row, strict=True))
    for column in RUN_JSON_COLUMNS:
        values[column] = loads(values[column], [] if column == "command" else {})
    return Run(**values)


def row_to_attempt(row: tuple[Any, ...]) -> Attempt:
    return Attempt(*row)


def step_to_row(record: StepRecord) -> tuple[Any, ...]:
    values = [getattr(record, name) for name in STEP_FIELDS]
    nan_fields = []
    for i, value in enumerate(values):
        if isinstance(value, float) and math.isnan(value):
            nan_fields.append(STEP_FIELDS[i])
            values[i] = None
    metrics = dumps(record.metrics) if record.metrics else None
    return (*values, metrics, ",".join(nan_fields) or None)


def row_to_step(row: tuple[Any, ...]) -> StepRecord:
    record = StepRecord(*row[: len(STEP_FIELDS)], metrics=loads(row[-2], {}))
    if row[-1]:
        for name in row[-1].split(","):
            setattr(record, name, math.nan)
    return record


def sample_to_row(sample: Sample) -> tuple[Any, ...]:
    return (sample.run_id, sample.host, sample.time_unix_s, dumps(sample.metrics))


def row_to_sample(row: tuple[Any, ...]) -> Sample:
    run_id, host, time_unix_s, metrics = row
    return Sample(time_unix_s=time_unix_s, metrics=loads(metrics, {}), run_id=run_id, host=host)


def event_to_row(event: Event) -> tuple[Any, ...]:
    return (event.run_id, event.time_unix_s, event.kind, event.message, dumps(event.data))


def row_to_event(row: tuple[Any, ...]) -> Event:
    run_id, time_unix_s, kind, message, data = row
    return Event(run_id, kind, message, time_unix_s=time_unix_s, data=loads(data, {}))


def finding_to_row(finding: Finding) -> tuple[Any, ...]:
    values = [getattr(finding, name) for name in FINDING_COLUMNS]
    values[-1] = dumps(finding.data)
    return tuple(values)


def row_to_finding(row: tuple[Any, ...]) -> Finding:
    return Finding(*row[:-1], data=loads(row[-1], {}))
