"""Commands: `watch` (live dashboard, or run and record a command), `doctor` (environment
checks), `diagnose RUN` (findings), `report RUN [--compare RUN ...]` (HTML)."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from cloudtrain.catalog import Catalog
from cloudtrain.cli import render
from cloudtrain.cli.config_cmds import alert_settings, cli_catalog
from cloudtrain.diagnose import DoctorReport, diagnose_run, run_doctor
from cloudtrain.errors import UserError
from cloudtrain.monitor import AlertConfig, Sampler, SamplerConfig, open_nvml
from cloudtrain.monitor.dashboard import render as render_dashboard
from cloudtrain.monitor.session import RunProgress, WatchedCommand, active_run, run_progress
from cloudtrain.report import write_report
from cloudtrain.store import RunStore

STATUS_STYLE = {"pass": "green", "warn": "yellow", "fail": "red", "skip": "dim"}
SEVERITY_STYLE = {"critical": "red", "warn": "yellow", "info": "cyan"}


def register(app: typer.Typer) -> None:
    """Add this group's commands to the app."""
    app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(watch)
    app.command()(doctor)
    app.command()(diagnose)
    app.command()(report)


def _alerts(
    stall_s: float | None,
    idle_minutes: float | None,
    idle_stop: bool | None,
    budget_usd: float | None,
    alert_command: str | None,
    webhook: str | None,
) -> AlertConfig:
    """[alerts] with the flags that were given (not None) on top."""
    return alert_settings(
        stall_s=stall_s,
        idle_minutes=idle_minutes,
        idle_stop=idle_stop,
        budget_usd=budget_usd,
        command=alert_command,
        webhook_url=webhook,
    )


def _progress(
    store: RunStore, ref: str | None, sampler: Sampler, catalog: Catalog
) -> RunProgress | None:
    run = store.get_run(ref) if ref else active_run(store)
    return None if run is None else run_progress(store, run, sampler.latest, catalog=catalog)


def watch(
    ctx: typer.Context,
    once: bool = typer.Option(False, "--once", help="Print one snapshot and exit."),
    as_json: bool = typer.Option(False, "--json", help="With --once: print JSON."),
    interval_s: float = typer.Option(1.0, "--interval", min=0.05, help="Seconds between readings."),
    run: str | None = typer.Option(
        None, "--run", help="Show this run (default: the newest running one)."
    ),
    name: str | None = typer.Option(None, "--name", help="Name of the run recording COMMAND."),
    price: float | None = typer.Option(
        None, "--price", "--price-usd-per-hour", help="Instance USD per hour, for cost and budget."
    ),
    provider: str | None = typer.Option(None, "--provider", help="Cloud provider (for PUE)."),
    region: str | None = typer.Option(None, "--region", help="Region (for carbon intensity)."),
    stall_s: float | None = typer.Option(
        None,
        "--stall-s",
        help="Alert and dump stacks after this long without a step (default: 600).",
        show_default=False,
    ),
    idle_minutes: float | None = typer.Option(
        None,
        "--idle-minutes",
        help="Alert when GPUs are idle this long (default: 10).",
        show_default=False,
    ),
    idle_stop: bool | None = typer.Option(
        None,
        "--idle-stop/--no-idle-stop",
        help="Stop COMMAND when the idle alert fires (default: no).",
        show_default=False,
    ),
    budget_usd: float | None = typer.Option(None, "--budget-usd", help="Alert above this spend."),
    alert_command: str | None = typer.Option(
        None, "--alert-command", help="Shell command run per alert ($CLOUDTRAIN_ALERT_JSON)."
    ),
    webhook: str | None = typer.Option(None, "--webhook", help="URL that receives alerts as JSON."),
) -> None:
    """Live GPU/host dashboard; `watch -- COMMAND ...` runs COMMAND and records it as a run.

    Alert thresholds not given as flags come from the settings (`alerts` section; see
    `cloudtrain config show`)."""
    command = list(ctx.args)
    if command and command[0] == "--":
        command = command[1:]
    sampler_config = SamplerConfig(interval_s=interval_s)
    alerts = _alerts(stall_s, idle_minutes, idle_stop, budget_usd, alert_command, webhook)
    if once:
        _watch_once(run, as_json)
        return
    if as_json:
        raise UserError("--json needs --once (a live dashboard has no JSON form)")
    with RunStore.open() as store:
        if command:
            code = _watch_command(
                store, command, name, alerts, sampler_config, price, provider, region
            )
            raise typer.Exit(code)
        _watch_live(store, run, sampler_config)


def _watch_once(run: str | None, as_json: bool) -> None:
    sampler = Sampler(nvml=open_nvml())
    sampler.read()
    time.sleep(0.5)  # rates and CPU shares need two readings
    snapshot = sampler.read()
    with RunStore.open() as store:
        progress = _progress(store, run, sampler, cli_catalog())
    if as_json:
        render.print_json({"snapshot": snapshot, "run": progress})
        return
    render.console().print(render_dashboard(snapshot, progress))


def _watch_live(store: RunStore, run: str | None, config: SamplerConfig) -> None:
    sampler = Sampler(nvml=open_nvml(), config=config)
    sampler.read()
    catalog = cli_catalog()  # once: the dashboard redraws every interval
    console = render.console()
    try:
        with Live(console=console, refresh_per_second=4, screen=False) as live:
            while True:
                time.sleep(config.interval_s)
                snapshot = sampler.read()
                live.update(render_dashboard(snapshot, _progress(store, run, sampler, catalog)))
    except KeyboardInterrupt:
        return


def _watch_command(
    store: RunStore,
    command: list[str],
    name: str | None,
    alerts: AlertConfig,
    config: SamplerConfig,
    price: float | None,
    provider: str | None,
    region: str | None,
) -> int:
    catalog = cli_catalog()
    watched = WatchedCommand(
        command,
        store,
        catalog=catalog,
        name=name,
        alerts=alerts,
        sampler=config,
        nvml=open_nvml(),
        price_usd_per_hour=price,
        provider=provider,
        region=region,
    )
    console = render.console()
    watched.start()
    if console.is_terminal:
        with Live(console=console, refresh_per_second=2) as live:
            watched.sampler.add_listener(
                lambda snapshot: live.update(
                    render_dashboard(
                        snapshot,
                        run_progress(
                            store, store.get_run(watched.run_id), snapshot, catalog=catalog
                        ),
                    )
                )
            )
            code = watched.wait()
    else:
        code = watched.wait()
    diagnosis = diagnose_run(store, watched.run_id, catalog=catalog)
    energy = diagnosis.energy
    console.print(
        f"run {diagnosis.run.name} ({watched.run_id}) {diagnosis.run.status}, exit code {code}; "
        f"{watched.sampler.sample_count} samples; GPU {render.fmt(energy.gpu_kwh, 4)} kWh; "
        f"{len(diagnosis.findings)} finding(s): cloudtrain diagnose {watched.run_id}",
        highlight=False,
        markup=False,
    )
    return code


def doctor(
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    data_dir: Path | None = typer.Option(
        None, "--data-dir", help="Measure read throughput of this directory."
    ),
) -> None:
    """Check this machine for training: GPU, driver, torch/CUDA, shm, limits, PCIe, ECC, ..."""
    if data_dir is not None and not data_dir.exists():
        raise UserError(f"--data-dir {data_dir}: no such file or directory")
    result = run_doctor(data_dir)
    if as_json:
        render.print_json(result)
    else:
        _print_doctor(result)
    if result.worst == "fail":
        raise typer.Exit(1)


def _print_doctor(result: DoctorReport) -> None:
    console = render.console()
    if result.no_gpu_reason:
        console.print(
            f"No GPU on this machine: {result.no_gpu_reason}. Checking the rest.",
            style="yellow",
            markup=False,
            highlight=False,
        )
    table = Table(show_header=False, box=None, pad_edge=False, expand=False)
    table.add_column("status", no_wrap=True)
    table.add_column("check", no_wrap=True, style="bold")
    table.add_column("result", overflow="fold")
    for check in result.checks:
        text = Text(check.summary)
        if check.fix:
            text.append(f"\nfix: {check.fix}", style="dim")
        table.add_row(Text(check.status, style=STATUS_STYLE[check.status]), check.name, text)
    console.print(table)
    counts = {s: sum(c.status == s for c in result.checks) for s in STATUS_STYLE}
    console.print(
        f"{counts['pass']} pass, {counts['warn']} warn, {counts['fail']} fail, "
        f"{counts['skip']} skipped",
        highlight=False,
    )


def diagnose(
    run: str = typer.Argument(..., help="Run id, id prefix or name."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    save: bool = typer.Option(True, "--save/--no-save", help="Store findings with the run."),
) -> None:
    """Explain a run: findings with evidence, likely cause, fix and expected gain."""
    with RunStore.open() as store:
        result = diagnose_run(store, run, catalog=cli_catalog(), save=save)
    if as_json:
        render.print_json(
            {
                "run": result.run.id,
                "name": result.run.name,
                "findings": result.findings,
                "energy": result.energy,
            }
        )
        return
    console = render.console()
    energy = result.energy
    console.print(
        f"run {result.run.name} ({result.run.id}): {len(result.findings)} finding(s)",
        markup=False,
        highlight=False,
    )
    for f in result.findings:
        body = Text.assemble(
            (f.symptom + "\n", "bold"),
            ("evidence: ", "dim"),
            f.evidence,
            ("\ncause:    ", "dim"),
            f.cause,
            ("\nfix:      ", "dim"),
            f.fix,
        )
        if f.expected_gain:
            body.append_text(Text.assemble(("\ngain:     ", "dim"), f.expected_gain))
        console.print(
            Panel(
                body,
                title=f"{f.severity}: {f.rule}",
                title_align="left",
                border_style=SEVERITY_STYLE.get(f.severity, "white"),
            )
        )
    console.print(
        f"energy: GPU {render.fmt(energy.gpu_kwh, 3)} kWh, CPU {render.fmt(energy.cpu_kwh, 3)} "
        f"kWh{' (estimated)' if energy.cpu_estimated else ''}, PUE {energy.pue:.2f}, "
        f"{render.fmt(energy.kg_co2e, 3)} kg CO2e ({energy.carbon_source}); cost "
        f"{render.fmt(energy.cost_usd)} USD",
        markup=False,
        highlight=False,
    )


def report(
    runs: list[str] = typer.Argument(..., help="Run id(s), prefix(es) or name(s)."),
    compare: bool = typer.Option(False, "--compare", help="Overlay several runs in one report."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Output HTML file."),
) -> None:
    """Write a self-contained HTML report of a run (or `--compare RUN RUN ...`)."""
    if len(runs) > 1 and not compare:
        raise UserError("several runs given: add --compare to overlay them in one report")
    if compare and len(runs) < 2:
        raise UserError("--compare needs at least two runs")
    with RunStore.open() as store:
        path = write_report(store, runs, out, catalog=cli_catalog())
    typer.echo(str(path))
