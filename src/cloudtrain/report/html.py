"""The HTML run report: one self-contained file (inline CSS, SVG drawn by an inline script,
data as JSON in the page), nothing fetched from the network.

Every string that comes from a user or a run (names, paths, config values, commands, event
messages, stack dumps) is escaped with `html.escape` in markup, and the embedded JSON has
`<`, `>` and `&` escaped so it cannot close its <script> element."""

from __future__ import annotations

import datetime as dt
import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cloudtrain import __version__
from cloudtrain.catalog import Catalog, load_catalog
from cloudtrain.report.assets import CSS, JS
from cloudtrain.report.data import RunReport, build_plots, gather, summary_rows
from cloudtrain.store import Event, Finding, RunStore

CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"
"""The page may load nothing from anywhere: a report opened from a mail or a share stays
offline even if a value slipped through escaping."""


def esc(value: Any) -> str:
    """Text for HTML (element content and quoted attributes)."""
    return html.escape("" if value is None else str(value), quote=True)


def script_json(value: Any) -> str:
    """JSON safe inside <script>: no '</script>', no '<!--', no HTML entities."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False, default=str)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _when(unix_s: float | None) -> str:
    if unix_s is None:
        return "-"
    return dt.datetime.fromtimestamp(unix_s, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def summary_table(reports: Sequence[RunReport]) -> str:
    rows = [summary_rows(r) for r in reports]
    head = "".join(f"<th>{esc(r.run.name)}</th>" for r in reports) if len(reports) > 1 else ""
    lines = [f"<tr><th></th>{head}</tr>"] if head else []
    for i, (label, _) in enumerate(rows[0]):
        cells = "".join(f"<td>{esc(row[i][1])}</td>" for row in rows)
        lines.append(f"<tr><th>{esc(label)}</th>{cells}</tr>")
    started = "".join(f"<td>{esc(_when(r.run.started_at))}</td>" for r in reports)
    lines.insert(2 if head else 1, f"<tr><th>started</th>{started}</tr>")
    return f'<table class="summary">{"".join(lines)}</table>'


def config_table(report: RunReport) -> str:
    items = sorted(report.run.config.items())
    if not items:
        return '<p class="ok">no config recorded</p>'
    rows = "".join(
        f"<tr><th>{esc(k)}</th><td>{esc(json.dumps(v, default=str) if isinstance(v, (dict, list)) else v)}</td></tr>"  # noqa: E501
        for k, v in items
    )
    return (
        f"<details><summary>config of {esc(report.run.name)} ({len(items)} keys)</summary>"
        f"<table>{rows}</table></details>"
    )


def plot_grid(plots_html_ids: Sequence[tuple[str, str, str]]) -> str:
    cells = []
    for key, title, unit in plots_html_ids:
        suffix = f" ({esc(unit)})" if unit else ""
        cells.append(f'<div class="plot" id="plot-{esc(key)}"><h3>{esc(title)}{suffix}</h3></div>')
    return f'<div class="grid">{"".join(cells)}</div>'


def finding_card(finding: Finding) -> str:
    fields = [
        ("evidence", finding.evidence),
        ("likely cause", finding.cause),
        ("fix", finding.fix),
        ("expected gain", finding.expected_gain),
    ]
    rows = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in fields if v)
    severity = finding.severity if finding.severity in ("critical", "warn", "info") else "info"
    return (
        f'<div class="finding {severity}" data-rule="{esc(finding.rule)}">'
        f'<span class="sev">{esc(finding.severity)}</span> <b>{esc(finding.rule)}</b>: '
        f"{esc(finding.symptom)}<dl>{rows}</dl></div>"
    )


def findings_section(reports: Sequence[RunReport]) -> str:
    parts = []
    for r in reports:
        title = f"<h3>{esc(r.run.name)}</h3>" if len(reports) > 1 else ""
        cards = "".join(finding_card(f) for f in r.findings) or (
            '<p class="ok">no findings recorded (run <code>cloudtrain diagnose</code> first, or '
            "nothing to report)</p>"
        )
        parts.append(title + cards)
    return "".join(parts)


def _event_row(report: RunReport, event: Event) -> str:
    minutes = (event.time_unix_s - report.start_s) / 60.0
    stacks = event.data.get("stacks") if isinstance(event.data, dict) else None
    extra = (
        f"<details><summary>stack dump</summary><pre>{esc(stacks)}</pre></details>"
        if (stacks)
        else ""
    )
    return (
        f"<tr><td>{minutes:,.1f}</td><td>{esc(event.kind)}</td>"
        f"<td>{esc(event.message)}{extra}</td></tr>"
    )


def events_table(reports: Sequence[RunReport]) -> str:
    rows = []
    for r in reports:
        if len(reports) > 1 and r.events:
            rows.append(f'<tr><th colspan="3">{esc(r.run.name)}</th></tr>')
        rows.extend(_event_row(r, e) for e in r.events)
    if not rows:
        return '<p class="ok">no events recorded</p>'
    return f"<table><tr><th>min</th><th>kind</th><th>message</th></tr>{''.join(rows)}</table>"


def page_data(reports: Sequence[RunReport]) -> tuple[dict[str, Any], list]:
    plots = build_plots(reports)
    timeline = []
    for r in reports:
        duration = r.energy.duration_s
        timeline.append(
            {
                "label": r.run.name,
                "duration_min": None if duration is None else duration / 60.0,
                "events": [
                    {
                        "t_min": (e.time_unix_s - r.start_s) / 60.0,
                        "kind": e.kind,
                        "message": e.message[:300],
                    }
                    for e in r.events
                ],
            }
        )
    return {
        "plots": [
            {
                "key": p.key,
                "title": p.title,
                "unit": p.unit,
                "series": [{"label": s.label, "x": s.x_min, "y": s.y} for s in p.series],
            }
            for p in plots
        ],
        "timeline": timeline,
    }, plots


def render_html(reports: Sequence[RunReport]) -> str:
    """The whole page for one run, or several overlaid."""
    data, plots = page_data(reports)
    names = ", ".join(r.run.name for r in reports)
    title = f"cloudtrain report: {names}" if len(reports) == 1 else f"cloudtrain compare: {names}"
    configs = "".join(config_table(r) for r in reports)
    generated = _when(dt.datetime.now(dt.timezone.utc).timestamp())
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<title>{esc(title)}</title><style>{CSS}</style></head>
<body>
<h1>{esc(title)}</h1>
<div class="sub">generated {esc(generated)} by cloudtrain {esc(__version__)}</div>
<h2>Summary</h2>{summary_table(reports)}{configs}
<h2>Findings</h2>{findings_section(reports)}
<h2>Over time</h2><div class="sub">x axis: minutes since the run started; hover a plot
for values</div>{plot_grid([(p.key, p.title, p.unit) for p in plots])}
<h2>Timeline</h2><div class="timeline" id="timeline"></div>{events_table(reports)}
<noscript><p>Plots need JavaScript; the tables above have the figures.</p></noscript>
<script type="application/json" id="report-data">{script_json(data)}</script>
<script>{JS}</script>
</body></html>
"""


def write_report(
    store: RunStore,
    refs: Sequence[str],
    out: str | Path | None = None,
    *,
    catalog: Catalog | None = None,
) -> Path:
    """Write the report of `refs` (one run, or several to compare) and return its path;
    default `cloudtrain-report-<name>.html` in the current directory."""
    catalog = catalog if catalog is not None else load_catalog()
    reports = [gather(store, ref, catalog) for ref in refs]
    if out is None:
        stem = "-vs-".join(r.run.id for r in reports)
        out = Path(f"cloudtrain-report-{stem}.html")
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(reports), encoding="utf-8")
    return path
