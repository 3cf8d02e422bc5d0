"""Run reports: one self-contained HTML file per run (or several runs overlaid) with the
summary, energy and carbon, plots over time, the event timeline and the findings.

    from cloudtrain.report import write_report
    with RunStore.open() as store:
        path = write_report(store, ["my-run"])                    # or ["run-a", "run-b"]
"""

from cloudtrain.report.data import Plot, RunReport, Series, build_plots, gather
from cloudtrain.report.html import render_html, write_report

__all__ = ["Plot", "RunReport", "Series", "build_plots", "gather", "render_html", "write_report"]
