"""`cloudtrain runs`: list recorded runs; `cloudtrain runs show RUN`: one run in detail."""

from __future__ import annotations

import time
from typing import Any

import typer
from rich import box
from rich.table import Table

from cloudtrain.cli import render
from cloudtrain.errors import UnknownNameError
from cloudtrain.store import RUN_STATUSES, Run, RunOverview, RunStore

runs_app = typer.Typer(
    help="Recorded runs: `cloudtrain runs` lists them, `cloudtrain runs show RUN` details one.",
    invoke_without_command=True,
    no_args_is_help=False,
)


def register(app: typer.Typer) -> None:
    """Add this group's commands to the app."""
    app.add_typer(runs_app, name="runs")


@runs_app.callback()
def list_runs(
    ctx: typer.Context,
    limit: int = typer.Option(20, "--limit", "-n", min=1, help="Show at most N runs."),
    status: str | None = typer.Option(
        None, "--status", help="Only runs with this status (running, completed, failed, ...)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List runs, newest first: status, duration, GPU, cost so far and last step."""
    if ctx.invoked_subcommand is not None:
        return
    if status is not None and status not in RUN_STATUSES:
        raise UnknownNameError("run status", status, RUN_STATUSES)
    with RunStore.open() as store:
        overviews = store.overviews(limit=limit, status=status)
    if as_json:
        render.print_json(overviews)
        return
    if not overviews:
        where = f" with status '{status}'" if status else ""
        typer.echo(f"no runs yet{where} (runs appear here when training records them)")
        return
    render.console().print(_runs_table(overviews))


def _runs_table(overviews: list[RunOverview]) -> Table:
    rows = [
        (
            o.run.id,
            o.run.name,
            o.run.status,
            _when(o.run.started_at, "%m-%d %H:%M"),
            _duration(o.duration_s),
            _gpus(o.run),
            _usd(o.cost_usd),
            None if o.last_step is None else o.last_step.step,
        )
        for o in overviews
    ]
    columns = ("id", "name", "status", "started", "duration", "GPU", "cost", "step")
    out = render.table(None, columns, rows, right_align=("duration", "cost", "step"))
    out.box = box.SIMPLE_HEAD  # no vertical rules: the name column keeps its width
    out.show_edge = False
    out.padding = (0, 1, 0, 0)
    return out


@runs_app.command("show")
def show_run(
    run: str = typer.Argument(..., help="Run id, unique id prefix, name, or 'latest'."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """One run: where and how it ran, its cost, last step, events, attempts, findings."""
    with RunStore.open() as store:
        overview = store.overview(run)
    if as_json:
        render.print_json(overview)
        return
    console = render.console()
    console.print(_details_table(overview))
    if overview.attempts:
        rows = [
            (a.attempt, _when(a.started_at), _duration(a.duration_s()), a.exit_code, a.reason,
             _usd(a.spend_usd))
            for a in overview.attempts
        ]  # fmt: skip
        columns = ("attempt", "started", "duration", "exit", "reason", "spend")
        console.print(render.table("attempts", columns, rows, right_align=("duration", "spend")))


def _details_table(o: RunOverview) -> Table:
    r = o.run
    offer = " / ".join(v for v in (r.provider, r.region, r.instance_type, r.pricing) if v)
    price = None if r.price_usd_per_hour is None else f"${r.price_usd_per_hour:,.2f}/h"
    fields: list[tuple[str, Any]] = [
        ("id", r.id),
        ("name", r.name),
        ("kind", r.kind),
        ("status", r.status),
        ("created", _when(r.created_at)),
        ("started", _when(r.started_at)),
        ("ended", _when(r.ended_at)),
        ("duration", _duration(o.duration_s)),
        ("GPU", _gpus(r)),
        ("offer", offer or None),
        ("price", price),
        ("cost", _usd(o.cost_usd)),
        ("command", " ".join(r.command) or None),
        ("config", _pairs(r.config)),
        ("host", _pairs(r.host)),
        ("summary", _pairs(r.summary)),
        ("last step", _step_line(o)),
        ("events", _pairs(o.event_counts)),
        ("findings", _pairs(o.finding_counts)),
    ]
    out = Table(show_header=False, box=None, pad_edge=False)
    out.add_column("field", style="bold", no_wrap=True)
    out.add_column("value", overflow="fold")
    for name, value in fields:
        out.add_row(name, render.fmt(value))
    return out


def _step_line(o: RunOverview) -> str | None:
    s = o.last_step
    if s is None:
        return None
    parts = [f"step {s.step}", f"{o.step_records} records"]
    for label, value, spec in (
        ("loss", s.loss, ".4f"),
        ("step_s", s.step_s, ".3f"),
        ("mfu", s.mfu, ".3f"),
        ("lr", s.lr, ".3g"),
    ):
        if value is not None:
            parts.append(f"{label} {value:{spec}}")
    return ", ".join(parts)


def _pairs(values: dict[str, Any]) -> str | None:
    if not values:
        return None
    return ", ".join(f"{key}={render.fmt(value, 4)}" for key, value in values.items())


def _when(unix_s: float | None, form: str = "%Y-%m-%d %H:%M") -> str | None:
    """Local time, or None for a time that is not set."""
    if unix_s is None:
        return None
    return time.strftime(form, time.localtime(unix_s))


def _duration(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.0f}s"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours >= 24:
        return f"{hours // 24}d{hours % 24:02d}h"
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _gpus(run: Run) -> str | None:
    if run.gpu_name is None:
        return None if run.gpu_count == 0 else f"{run.gpu_count}x ?"
    return f"{run.gpu_count}x {run.gpu_name}" if run.gpu_count > 1 else run.gpu_name


def _usd(value: float | None) -> str | None:
    return None if value is None else f"${value:,.2f}"
