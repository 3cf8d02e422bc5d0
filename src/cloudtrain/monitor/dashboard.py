"""The live dashboard of `cloudtrain watch`: draws snapshots (never NVML) with rich, so it
works over SSH in any terminal."""

from __future__ import annotations

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from cloudtrain.monitor.session import RunProgress
from cloudtrain.monitor.snapshots import GPUSnapshot, HostSnapshot, Snapshot

BAR_CELLS = 10
SHORT_REASONS = {
    "power cap": "pwr cap",
    "software thermal": "sw therm",
    "hardware thermal": "hw therm",
    "hardware slowdown": "hw slow",
    "power brake": "brake",
}


def bar(pct: float | None, cells: int = BAR_CELLS) -> Text:
    """A small bar for 0..100 (green, yellow from 60, red from 90); '-' when unknown."""
    if pct is None:
        return Text("-")
    pct = max(0.0, min(100.0, pct))
    filled = round(pct / 100 * cells)
    style = "red" if pct >= 90 else "yellow" if pct >= 60 else "green"
    return (
        Text("█" * filled, style=style)
        + Text("·" * (cells - filled), style="dim")
        + Text(f" {pct:3.0f}%")
    )


def _num(value: float | None, fmt: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{unit}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
        if seconds >= 3600
        else (f"{seconds // 60}m{seconds % 60:02d}s")
    )


def gpu_table(gpus: tuple[GPUSnapshot, ...]) -> Table:
    names = sorted({g.name for g in gpus})
    title = f"GPUs: {len(gpus)} x {names[0]}" if len(names) == 1 else "GPUs"
    table = Table(title=title, title_justify="left", header_style="bold", pad_edge=False)
    for column in ("#", "util", "mem GiB", "power W", "temp", "SM MHz", "throttle", "kJ"):
        table.add_column(column, no_wrap=True)
    if len(names) > 1:
        table.add_column("name", no_wrap=True)
    for g in gpus:
        memory = f"{_num(g.memory_used_gib, '.1f')}/{_num(g.memory_total_gib, '.0f')}"
        power = f"{_num(g.power_w, '.0f')}/{_num(g.power_limit_w, '.0f')}"
        clocks = f"{_num(g.sm_clock_mhz, '.0f')}/{_num(g.sm_clock_max_mhz, '.0f')}"
        reasons = [SHORT_REASONS.get(r, r) for r in g.throttling]
        throttle = Text(",".join(reasons) or "-", style="red" if reasons else "")
        energy = _num(None if g.energy_j is None else g.energy_j / 1000, ".1f")
        cells = [
            str(g.index),
            bar(g.util_pct, 6),
            memory,
            power,
            _num(g.temperature_c, ".0f", "C"),
            clocks,
            throttle,
            energy,
        ]
        table.add_row(*cells, *([g.name] if len(names) > 1 else []))
    return table


def host_panel(host: HostSnapshot) -> Panel:
    cores = Text()
    for i, pct in enumerate(host.cpu_per_core_pct[:64]):
        style = "red" if pct >= 90 else "yellow" if pct >= 60 else "green"
        cores.append("▁▂▃▄▅▆▇█"[min(7, int(pct / 12.5))], style=style)
        if i % 32 == 31:
            cores.append("\n")
    lines = [
        Text.assemble("CPU ", bar(host.cpu_pct), f"  {host.cpu_count} cores  ", cores),
        Text(
            f"RAM {host.ram_used_gib:.1f}/{host.ram_total_gib:.1f} GiB   disk r/w "
            f"{_num(host.disk_read_mib_per_s, '.1f')}/{_num(host.disk_write_mib_per_s, '.1f')}"
            f" MiB/s   net rx/tx {_num(host.net_rx_mib_per_s, '.1f')}/"
            f"{_num(host.net_tx_mib_per_s, '.1f')} MiB/s"
        ),
    ]
    if host.process is not None:
        p = host.process
        state = "running" if p.running else "exited"
        lines.append(
            Text(
                f"process {p.pid} {p.name} ({state}): CPU "
                f"{_num(p.cpu_pct, '.0f', '%')} of one core, {p.rss_gib:.1f} GiB, "
                f"{p.num_procs} procs, {p.num_threads} threads"
            )
        )
    return Panel(Group(*lines), title=f"host {host.hostname}", title_align="left")


def run_panel(progress: RunProgress) -> Panel:
    steps = f"{progress.step if progress.step is not None else '-'}"
    if progress.max_steps:
        steps += f"/{progress.max_steps}"
    rows = [
        f"step {steps}   {_num(progress.steps_per_s, '.2f', ' steps/s')}   "
        f"{_num(progress.samples_per_s, ',.0f', ' samples/s')}   "
        f"{_num(progress.tokens_per_s, ',.0f', ' tokens/s')}",
        f"MFU {_num(None if progress.mfu is None else progress.mfu * 100, '.1f', '%')}   "
        f"loss {_num(progress.loss, '.4f')}   elapsed {_duration(progress.elapsed_s)}   "
        f"ETA {_duration(progress.eta_s)}",
        f"cost {_num(progress.cost_usd, ',.2f', ' USD')}   GPU energy "
        f"{_num(progress.gpu_energy_kwh, '.3f', ' kWh')}   "
        f"{_num(progress.kg_co2e, '.3f', ' kg CO2e')}",
    ]
    return Panel(
        "\n".join(rows), title=f"run {progress.name} ({progress.status})", title_align="left"
    )


def render(snapshot: Snapshot, progress: RunProgress | None = None) -> Group:
    parts: list = []
    if snapshot.gpus:
        parts.append(gpu_table(snapshot.gpus))
    else:
        parts.append(
            Text(f"No GPU: {snapshot.nvml_unavailable_reason or 'none listed'}", style="yellow")
        )
    parts.append(host_panel(snapshot.host))
    if progress is not None:
        parts.append(run_panel(progress))
    return Group(*parts)
