"""Fit the achievable rates (catalog/data/achievable.csv) to measured training steps.

One set of rates per GPU key — never per model: the compute and bandwidth shares and
launch overheads of each kernel kind are chosen to minimise the mean absolute log
error of the roofline over the cases of that GPU (`planner_cases.py`), by coordinate
descent over multiplicative steps. `--holdout` fits on half the models (every other
name) and reports the error on the other half, which is the honest figure for models
the fit has not seen.

    .venv/bin/python benchmarks/fit_rates.py [--gpu RTX-3090] [--holdout] [--write]

`--write` prints the fitted rows in achievable.csv's format: only those some case
exercises (a row no measured op looks up keeps the default).
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import planner_cases
from _common import write_result
from cloudtrain.catalog import load_catalog
from cloudtrain.catalog.rates import RateTable, rate_table
from cloudtrain.catalog.types import AchievableRate
from cloudtrain.plan.roofline import Roofline, StepOptions

KEYS = {"RTX-3090": "8.6", "H200": "hopper"}
"""The rate key each GPU's cases are fitted under (its compute capability or architecture)."""
PARAMETERS = {
    # (kernel, dtype, layout): the fields fitted. 16-bit matmuls (bf16, fp16) run on the
    # same tensor cores at the same peak: one row, dtype 'any', serves both.
    ("matmul", "any", "any"): ("compute_fraction", "overhead_us"),
    ("matmul", "tf32", "any"): ("compute_fraction",),
    ("matmul", "fp32", "any"): ("compute_fraction",),
    ("conv", "any", "nchw"): ("compute_fraction", "overhead_us"),
    ("conv", "any", "nhwc"): ("compute_fraction", "overhead_us"),
    ("conv", "tf32", "nchw"): ("compute_fraction",),
    ("conv", "fp32", "nchw"): ("compute_fraction",),
    ("conv_grouped", "any", "nchw"): ("compute_fraction", "bandwidth_fraction"),
    ("conv_grouped", "any", "nhwc"): ("compute_fraction", "bandwidth_fraction"),
    ("conv_depthwise", "any", "nchw"): ("bandwidth_fraction", "overhead_us"),
    ("conv_depthwise", "any", "nhwc"): ("bandwidth_fraction", "overhead_us"),
    ("attention", "any", "any"): ("compute_fraction",),
    ("elementwise", "any", "any"): ("bandwidth_fraction", "overhead_us"),
    ("reduction", "any", "any"): ("bandwidth_fraction", "overhead_us"),
    ("data_movement", "any", "any"): ("bandwidth_fraction",),
    ("optimizer", "any", "any"): ("bandwidth_fraction", "overhead_us"),
    ("host", "any", "any"): ("overhead_us",),
}
STEPS = (0.7, 0.85, 1.2, 1.4)


def start_rows(table: RateTable, key: str, gpu) -> dict[tuple, AchievableRate]:
    today = dt.date.today().isoformat()
    rows = {}
    for (kernel, dtype, layout), _ in PARAMETERS.items():
        base = table.lookup(gpu, kernel, dtype if dtype != "any" else "bf16", layout)
        rows[(kernel, dtype, layout)] = replace(
            base, key=key, kernel=kernel, dtype=dtype, layout=layout,
            source="fitted by benchmarks/fit_rates.py", as_of=today,
        )  # fmt: skip
    return rows


class Fit:
    def __init__(self, cases, profiles, gpu, base: RateTable) -> None:
        self.cases, self.profiles, self.gpu, self.base = cases, profiles, gpu, base

    def roofline(self, case, table: RateTable) -> Roofline:
        options = StepOptions(
            compile=case.compile, optimizer=case.optimizer, optimizer_impl=case.optimizer_impl,
            tf32_matmul=case.tf32, tf32_conv=case.tf32,
        )  # fmt: skip
        return Roofline(self.profiles[id(case)], table, options)

    def errors(self, rows: dict[tuple, AchievableRate], cases=None) -> list[float]:
        table = self.base.with_rows(rows.values())
        out = []
        for case in cases or self.cases:
            predicted = self.roofline(case, table).step(self.gpu, case.batch).step_s
            out.append(math.log(predicted / case.measured_step_s))
        return out

    def exercised(self, rows: dict[tuple, AchievableRate]) -> list[AchievableRate]:
        """The fitted rows some case's ops look up (the others were never tested)."""
        table = self.base.with_rows(rows.values())
        used = {
            entry["row"]
            for case in self.cases
            for entry in self.roofline(case, table).rates_used(self.gpu).values()
        }
        return [row for row in rows.values() if row.row in used]

    def loss(self, rows) -> float:
        return statistics.fmean(abs(e) for e in self.errors(rows))

    def run(self, rows: dict[tuple, AchievableRate], sweeps: int) -> dict[tuple, AchievableRate]:
        best = self.loss(rows)
        for sweep in range(sweeps):
            for name, fields in PARAMETERS.items():
                for field in fields:
                    for step in STEPS:
                        trial = dict(rows)
                        value = getattr(rows[name], field) * step
                        if field != "overhead_us":
                            value = min(1.0, value)
                        trial[name] = replace(rows[name], **{field: round(value, 4)})
                        loss = self.loss(trial)
                        if loss < best - 1e-6:
                            best, rows = loss, trial
            print(f"  sweep {sweep + 1}: mean |log error| {best:.4f}", file=sys.stderr)
        return rows


def default_rows(rates: list[AchievableRate]) -> list[AchievableRate]:
    """Rows for GPUs without fitted ones: per (kernel, dtype, layout), the geometric mean
    of each field over the fitted architecture keys that have that row."""
    fitted = [r for r in rates if r.key in KEYS.values()]  # not one machine's own rows
    groups: dict[tuple[str, str, str], list[AchievableRate]] = {}
    for row in fitted:
        groups.setdefault((row.kernel, row.dtype, row.layout), []).append(row)
    for kernel in {row.kernel for row in fitted}:  # every kernel kind gets an any/any row
        if (kernel, "any", "any") not in groups:
            groups[kernel, "any", "any"] = [r for r in fitted if r.kernel == kernel]
    today = dt.date.today().isoformat()
    out = []
    for (kernel, dtype, layout), rows in groups.items():
        keys = " and ".join(sorted({r.key for r in rows}))
        means = {
            field: round(statistics.geometric_mean([max(getattr(r, field), 1e-6) for r in rows]), 4)
            for field in ("compute_fraction", "bandwidth_fraction", "overhead_us")
        }
        out.append(AchievableRate(
            "default", kernel, dtype, layout, **means,
            source=f"geometric mean of the fitted {keys} rows (benchmarks/fit_rates.py --defaults)",
            as_of=today,
        ))  # fmt: skip
    return out


def csv_line(r: AchievableRate) -> str:
    cells = (
        r.key,
        r.kernel,
        r.dtype,
        r.layout,
        f"{r.compute_fraction:.4g}",
        f"{r.bandwidth_fraction:.4g}",
        f"{r.overhead_us:.4g}",
        f'"{r.source}"',
        r.as_of,
    )
    return ",".join(cells)  # fmt: skip


def describe(errors: list[float]) -> dict[str, float]:
    ratios = [abs(math.exp(e) - 1.0) for e in errors]
    return {"cases": len(ratios), "median_abs_error": statistics.median(ratios),
            "max_abs_error": max(ratios)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpu", action="append", help="fit these GPUs' cases (default: all)")
    parser.add_argument("--holdout", action="store_true", help="fit on half the models")
    parser.add_argument("--write", action="store_true", help="print the fitted CSV rows")
    parser.add_argument("--sweeps", type=int, default=3, help="coordinate-descent sweeps")
    parser.add_argument(
        "--defaults", action="store_true", help="print 'default' rows from the fitted rows"
    )
    args = parser.parse_args()
    catalog = load_catalog(include_user=False)
    if args.defaults:
        for row in default_rows(catalog.rates):
            print(csv_line(row))
        return
    base = rate_table(catalog.rates)
    results = {}
    for gpu_name in args.gpu or list(KEYS):
        gpu = catalog.gpu(gpu_name)
        cases = [c for c in planner_cases.all_cases() if c.gpu == gpu.name]
        profiles = {id(c): planner_cases.profile_case(c) for c in cases}
        names = sorted({c.model for c in cases})
        seen = set(names[::2]) if args.holdout else set(names)
        train = [c for c in cases if c.model in seen]
        test = [c for c in cases if c.model not in seen]
        fit = Fit(train, profiles, gpu, base)
        rows = fit.run(start_rows(base, KEYS[gpu.name], gpu), args.sweeps)
        results[gpu.name] = {"fitted": describe(fit.errors(rows))}
        if test:
            results[gpu.name]["held_out"] = describe(fit.errors(rows, test))
        print(gpu.name, results[gpu.name])
        if args.write:
            for r in fit.exercised(rows):
                print(csv_line(r))
    write_result("fit_rates", {"holdout": args.holdout, "results": results})


if __name__ == "__main__":
    main()
