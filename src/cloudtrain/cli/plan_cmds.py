"""Commands: `plan` (what to rent), `tco` (rent vs buy), `bench` (measure this machine)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer

from cloudtrain import paths
from cloudtrain.catalog import Catalog
from cloudtrain.cli import render
from cloudtrain.cli.config_cmds import cli_catalog, plan_settings
from cloudtrain.errors import UserError
from cloudtrain.plan import Constraints, Plan, Workload, load_workload_file, preset, tco
from cloudtrain.plan import plan as make_plan
from cloudtrain.plan.explain import duration, money

CATALOG_HELP = (
    "Extra catalog CSV file or directory, merged over the bundled and user rows "
    "(default: the catalog.paths setting)."
)
_UNITS_S = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}


class InfeasiblePlanError(UserError):
    """No candidate meets the constraints; the message says why and what to relax."""


def parse_duration_s(text: str) -> float:
    """'72h', '3d', '90m', '3600s' or a bare number of hours -> seconds."""
    match = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([a-z]*)\s*", text.lower())
    if not match or match.group(2) not in ("", *_UNITS_S):
        raise UserError(f"cannot read duration '{text}': use e.g. 72h, 3d, 90m")
    unit = match.group(2) or "h"
    return float(match.group(1)) * _UNITS_S[unit]


def _workload(
    path: Path | None, preset_name: str | None, changes: dict[str, Any]
) -> tuple[Workload, dict[str, Any]]:
    if path is None and preset_name is None:
        raise UserError("give a workload file or --preset NAME (e.g. --preset llama-7b)")
    table: dict[str, Any] = {}
    if path is not None:
        workload, table = load_workload_file(path)
        if preset_name is not None:
            raise UserError("give either a workload file or --preset, not both")
    else:
        workload = preset(preset_name or "")
    changes = {k: v for k, v in changes.items() if v is not None}
    if "tokens" in changes or "samples_per_epoch" in changes:
        changes.setdefault("tokens", None)
        changes.setdefault("samples_per_epoch", None)
    return (workload.replace(**changes) if changes else workload), table


def _model_workload(model: str, changes: dict[str, Any], channels_last: bool) -> Workload:
    """The workload of a traced model file; the flags give data amount and batch."""
    from cloudtrain.cli.model_file import parse_model_spec, profile_from_file
    from cloudtrain.plan import traced_workload

    spec = parse_model_spec(model)
    precision = changes.pop("precision", None) or "bf16"
    profile, example_batch = profile_from_file(
        spec, precision=precision, channels_last=channels_last
    )
    values = {k: v for k, v in changes.items() if v is not None}
    global_batch = values.pop("global_batch", None) or values.get("micro_batch")
    global_batch = global_batch or example_batch or 1
    data = {key: values.pop(key, None) for key in ("tokens", "samples_per_epoch")}
    epochs = values.pop("epochs", None) or 1.0
    return traced_workload(profile, global_batch=global_batch, epochs=epochs, **data, **values)


def _print_explanation(result: Plan) -> None:
    """Where the chosen estimate's step time goes, by op class and by op."""
    best = result.best
    out = render.console()
    if best is None or best.breakdown is None:
        out.print("No breakdown: this workload is priced by FLOPs at an efficiency "
                  "(trace the model with --model for one).")  # fmt: skip
        return
    data = best.breakdown
    rows = [
        [name, f"{entry['seconds'] * 1e3:,.2f}", f"{entry['share']:.0%}",
         ", ".join(dict.fromkeys(
             r["row"] for r in data["calibration"].values() if r["class"] == name))]
        for name, entry in data["by_class"].items()
    ]  # fmt: skip
    title = (
        f"Step of {best.micro_batch} x {best.accumulation_steps} samples on one {best.gpu}: "
        f"{best.compute_s * 1e3:,.1f} ms compute"
    )
    out.print(render.table(title, ["op class", "ms", "share", "rate used"], rows,
                           right_align=["ms", "share"]))  # fmt: skip
    top = [
        [op["op"], op["phase"], f"{op['count']:g}", f"{op['seconds'] * 1e3:,.2f}",
         f"{op['share']:.0%}", op["bound"], op["shape"][:40]]
        for op in data["top_ops"]
    ]  # fmt: skip
    out.print(render.table("Top ops (all micro-steps)",
                           ["op", "phase", "count", "ms", "share", "bound", "shapes"], top,
                           right_align=["count", "ms", "share"]))  # fmt: skip
    for note in data["notes"]:
        out.print(f"Note: {note}.", highlight=False)


def _constraints(table: dict[str, Any], flags: dict[str, Any]) -> Constraints:
    """Flags over the workload file's [constraints] table."""
    values: dict[str, Any] = dict(table)
    for key in ("deadline",):
        if isinstance(values.get(key), str):
            values["deadline_s"] = parse_duration_s(values.pop(key))
    for key, value in flags.items():
        if value not in (None, (), []):
            values[key] = tuple(value) if isinstance(value, list) else value
    for key in ("gpus", "providers", "regions", "countries", "pricings"):
        if isinstance(values.get(key), list):
            values[key] = tuple(values[key])
    try:
        return Constraints(**values)
    except TypeError as error:
        raise UserError(f"constraints: {error}") from None


def _measured_matmul() -> dict[str, dict[str, float]]:
    """Matmul fractions of the latest bench per GPU type in the store (if any)."""
    if not paths.store_path().exists():
        return {}
    from cloudtrain.monitor.bench import latest_matmul_fractions
    from cloudtrain.store import RunStore

    with RunStore.open() as store:
        return latest_matmul_fractions(store)


def _measured_rates() -> list[Any]:
    """Achievable-rate rows (AchievableRate) the latest bench per GPU type measured, for
    the roofline of a traced model; none when there is no store."""
    if not paths.store_path().exists():
        return []
    from cloudtrain.monitor.bench import latest_rates
    from cloudtrain.store import RunStore

    with RunStore.open() as store:
        return latest_rates(store)


def _measured_runs(workload: Workload, ref: str | None) -> list[Any]:
    """Recorded runs of the traced model: the one named, or all in the store."""
    from cloudtrain.plan.learned import measured_run, runs_in_store

    profile = workload.profile
    if profile is None or (ref is None and not paths.store_path().exists()):
        return []
    from cloudtrain.store import RunStore

    with RunStore.open() as store:
        if ref is None:
            return runs_in_store(store, profile.fingerprint)
        run = store.get_run(ref)
        found = measured_run(run, store.steps(run.id))
    if found is None:
        raise UserError(
            f"run {ref} has no model fingerprint, GPU or timed steps to learn from "
            "(runs of cloudtrain's Trainer on a GPU record them)"
        )
    if found.fingerprint != profile.fingerprint:
        raise UserError(
            f"run {ref} trained another model or input shape (fingerprint "
            f"{found.fingerprint}, --model has {profile.fingerprint})"
        )
    return [found]


def _pricings(spot: bool | None, reserved: bool | None) -> tuple[str, ...] | None:
    """None when neither flag was given (the file's or the library's default applies)."""
    if spot is None and reserved is None:
        return None
    pricings = ["on_demand"]
    if spot is not False:
        pricings.append("spot")
    if reserved is not False:
        pricings.append("reserved")
    return tuple(pricings)


_PAY = {"on_demand": "on-dem", "spot": "spot", "reserved": "1y-rsv"}


def _plan_rows(shown: Plan) -> list[list[str]]:
    rows = []
    for number, e in enumerate(shown.estimates, 1):
        layout = f"{e.micro_batch}x{e.accumulation_steps}"
        layout += " fsdp" if e.sharding == "fsdp" else ""
        layout += " ckpt" if e.activation_checkpointing else ""
        rows.append(
            [
                f"{number}{'*' if e.on_frontier else ''}",
                f"{e.provider} {e.region}\n{e.instance_type}",
                f"{e.nodes}x{e.gpus_per_node} {e.gpu}"
                if e.nodes > 1
                else f"{e.gpus_per_node}x {e.gpu}",
                f"spot {e.expected_interruptions:.2g}" if e.pricing == "spot" else _PAY[e.pricing],
                layout,
                f"{e.mfu:.0%}",
                duration(e.total_s),
                money(e.cost, shown.currency),
                f"{e.co2e_kg:,.0f}" if e.co2e_kg >= 10 else f"{e.co2e_kg:.2g}",
            ]
        )
    return rows


def _print_plan(result: Plan, top: int) -> None:
    shown = result.top(top)
    out = render.console()
    w = result.workload
    amount = f"{w.total_tokens:.3g} tokens" if w.total_tokens else f"{w.total_samples:.3g} samples"
    title = f"{w.name}: {amount}, batch {w.global_batch}, {w.precision}, {w.optimizer}"
    columns = ["#", "offer", "GPUs", "pay", "micro x acc", "MFU", "time", "cost", "kgCO2e"]
    table = render.table(title, columns, _plan_rows(shown), right_align=columns[5:])
    out.print(table)
    removed = ", ".join(f"{k} {v:,}" for k, v in result.removed.items()) or "none"
    out.print(
        f"* on the cost/time Pareto frontier ({len(result.frontier)} plans). "
        f"{len(result.estimates):,} of {result.candidates:,} candidates fit; removed: {removed}.",
        soft_wrap=False,
    )
    best = result.best
    if best is not None:
        out.print(f"Why: {result.why}.")
        needs = " + ".join(
            {"fsdp": "FSDP", "checkpointing": "checkpointing"}[r] for r in best.requires
        )
        fit = f"needs {needs} to fit" if needs else "fits without FSDP or checkpointing"
        out.print(
            f"Efficiency {best.efficiency:.2f} of {best.dtype} peak, {best.efficiency_source}; "
            f"step {best.step_s:.3g} s ({best.bottleneck}-bound); "
            f"{best.memory_gib_per_gpu:.0f} GiB per GPU, {fit}. "
            "'spot N': N interruptions expected; `--json` lists every assumption.",
            highlight=False,
        )
        where = f" on each of the {best.nodes} nodes" if best.nodes > 1 else ""
        out.print(f"Run it{where}:\n  {run_hint(best)}", highlight=False, soft_wrap=True)


def run_hint(best: Any) -> str:
    """The `cloudtrain run` line for a plan's estimate (the same on every node)."""
    pricing = best.pricing.replace("_", "-")
    line = f"cloudtrain run --offer {best.provider}/{best.region}/{best.instance_type}"
    line += f" --pricing {pricing} --nproc {best.gpus_per_node}"
    if best.nodes > 1:
        line += f" --nnodes {best.nodes} --rdzv HOST:29400"
    return line + " -- train.py"


def plan_command(
    workload_file: Path = typer.Argument(None, help="Workload TOML file.", show_default=False),
    preset_name: str = typer.Option(None, "--preset", help="Start from a preset (llama-7b, ...)."),
    tokens: float = typer.Option(None, "--tokens", help="Tokens to train on (e.g. 20e9)."),
    samples: float = typer.Option(None, "--samples", help="Samples per epoch."),
    epochs: float = typer.Option(None, "--epochs", help="Epochs over --samples."),
    global_batch: int = typer.Option(None, "--global-batch", help="Samples per step."),
    precision: str = typer.Option(None, "--precision", help="fp32, tf32, bf16, fp16, fp8."),
    optimizer: str = typer.Option(None, "--optimizer", help="adamw, sgd, adafactor, ..."),
    sharding: str = typer.Option(None, "--sharding", help="ddp or fsdp (default: chosen)."),
    deadline: str = typer.Option(None, "--deadline", help="Latest finish, e.g. 72h, 3d."),
    budget: float = typer.Option(None, "--budget", help="Highest cost, in --currency."),
    objective: str = typer.Option(None, "--objective", help="cost (default), time or carbon."),
    spot: bool = typer.Option(None, "--spot/--no-spot", help="Consider spot (default: yes)."),
    reserved: bool = typer.Option(
        None, "--reserved/--no-reserved", help="Consider 1-year rates (default: yes)."
    ),
    gpu: list[str] = typer.Option(None, "--gpu", help="Allowed GPU (repeatable)."),
    provider: list[str] = typer.Option(None, "--provider", help="Allowed provider (repeatable)."),
    region: list[str] = typer.Option(None, "--region", help="Allowed region glob (repeatable)."),
    country: list[str] = typer.Option(None, "--country", help="Allowed country, ISO alpha-3."),
    min_gpu_memory: float = typer.Option(None, "--min-gpu-memory", help="GiB per GPU."),
    max_band: str = typer.Option(None, "--max-band", help="Highest spot band, e.g. '5-10%'."),
    max_nodes: int = typer.Option(None, "--max-nodes", help="Node counts tried: 1..N (8)."),
    max_gpus: int = typer.Option(None, "--max-gpus", help="Most GPUs in total."),
    efficiency: float = typer.Option(None, "--efficiency", help="End-to-end share of peak."),
    top: int = typer.Option(None, "--top", help="Estimates shown; 0: all (default: 10)."),
    as_json: bool = typer.Option(False, "--json", help="Print the Plan as JSON."),
    currency: str = typer.Option(None, "--currency", help="USD (default) or CNY, ..."),
    catalog_paths: list[Path] = typer.Option(None, "--catalog", help=CATALOG_HELP),
    model: str = typer.Option(
        None, "--model", help="FILE.py:FUNC returning (model, batch[, loss_fn]): trace it."
    ),
    micro_batch: int = typer.Option(None, "--micro-batch", help="Fix the micro-batch per GPU."),
    compile_: bool = typer.Option(None, "--compile/--no-compile", help="Under torch.compile."),
    channels_last: bool = typer.Option(
        False, "--channels-last", help="Trace with channels_last (NHWC) inputs and weights."
    ),
    fused_optimizer: bool = typer.Option(
        None, "--fused-optimizer/--no-fused-optimizer", help="Fused (or foreach) optimizer."
    ),
    explain: bool = typer.Option(
        False, "--explain", help="Show where the step time goes on the chosen GPU."
    ),
    from_run: str = typer.Option(
        None, "--from-run", help="Correct by this recorded run of the model (default: any)."
    ),
) -> None:
    """Rank what to rent for a training job: time, cost, energy, CO2, spot risk."""
    changes = {
        "tokens": tokens, "samples_per_epoch": samples, "epochs": epochs,
        "global_batch": global_batch, "precision": precision, "optimizer": optimizer,
        "sharding": sharding, "micro_batch": micro_batch, "compile": compile_,
        "optimizer_impl": None if fused_optimizer is None else (
            "fused" if fused_optimizer else "foreach"
        ),
    }  # fmt: skip
    if model is not None:
        if workload_file is not None or preset_name is not None:
            raise UserError("give --model, a workload file or --preset: only one")
        workload, table = _model_workload(model, changes, channels_last), {}
    else:
        workload, table = _workload(workload_file, preset_name, changes)
    flags = {
        "deadline_s": parse_duration_s(deadline) if deadline else None,
        "budget": budget, "currency": currency.upper() if currency else None,
        "gpus": render.split_list(gpu) or None,
        "providers": render.split_list(provider) or None,
        "regions": render.split_list(region) or None,
        "countries": [c.upper() for c in render.split_list(country)],
        "min_gpu_memory_gib": min_gpu_memory,
        "max_interruption_band": max_band, "max_nodes": max_nodes, "max_gpus": max_gpus,
        "pricings": _pricings(spot, reserved), "objective": objective,
    }  # fmt: skip
    configured = plan_settings()  # [plan]: under the workload file and the flags
    defaults = {"currency": configured.currency, "objective": configured.objective}
    constraints = _constraints({**defaults, **table}, flags)
    top = configured.top if top is None else top
    catalog = cli_catalog(catalog_paths)
    overrides = {"*": efficiency} if efficiency is not None else None
    if efficiency is not None and not 0.0 < efficiency <= 1.0:
        raise UserError("--efficiency must be in (0, 1]: a share of the dense peak")
    if from_run is not None and workload.profile is None:
        raise UserError("--from-run corrects a traced model: give --model FILE.py:FUNC too")
    result = make_plan(
        workload, constraints, catalog,
        efficiency_overrides=overrides, measured_matmul=_measured_matmul(),
        measured_rates=_measured_rates(), measured_runs=_measured_runs(workload, from_run),
    )  # fmt: skip
    if result.why_empty is not None:
        raise InfeasiblePlanError(result.why_empty)
    if as_json:
        shown = render.to_jsonable(result.top(top))
        if workload.profile is not None:
            shown["workload"]["profile"] = workload.profile.summary()
        best = result.best
        render.print_json({**shown, "run_command": run_hint(best) if best else None})
    else:
        _print_plan(result, top)
        if explain:
            _print_explanation(result)


def tco_command(
    gpu: str = typer.Option(..., "--gpu", help="GPU name, e.g. A100-80GB."),
    count: int = typer.Option(8, "--count", help="GPUs."),
    utilization: float = typer.Option(0.6, "--utilization", help="Share of hours in use."),
    years: float = typer.Option(3.0, "--years", help="Period compared."),
    kwh_price: float = typer.Option(0.12, "--kwh-price", help="USD per kWh."),
    purchase_usd: float = typer.Option(None, "--purchase-usd", help="Server price (USD)."),
    ops_usd_per_year: float = typer.Option(None, "--ops-usd-per-year", help="Running costs."),
    rent_usd_per_hour: float = typer.Option(None, "--rent-usd-per-hour", help="Rent for all."),
    pue: float = typer.Option(None, "--pue", help="PUE of your machine room."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    catalog_paths: list[Path] = typer.Option(None, "--catalog", help=CATALOG_HELP),
) -> None:
    """Rent or buy: total cost over the years at a utilization, and the break-even."""
    catalog: Catalog = cli_catalog(catalog_paths)
    result = tco(
        catalog, gpu, count, utilization, years, kwh_price_usd=kwh_price,
        purchase_usd=purchase_usd, ops_usd_per_year=ops_usd_per_year,
        rent_usd_per_hour=rent_usd_per_hour, pue=pue,
    )  # fmt: skip
    if as_json:
        render.print_json(result)
        return
    out = render.console()
    title = (
        f"{result.count}x {result.gpu}, {result.years:g} years at "
        f"{result.utilization:.0%} utilization"
    )
    rows: list[list[Any]] = [
        [
            "buy",
            f"${result.purchase_usd:,.0f} + ${result.ops_usd_per_year:,.0f}/yr + "
            f"power ${result.energy_usd:,.0f}",
            "-",
            f"${result.buy_total_usd:,.0f}",
        ]
    ]
    for option in result.rent:
        rows.append(
            [
                f"rent {_PAY.get(option.pricing, option.pricing)}",
                option.source,
                f"${option.usd_per_hour:,.2f}",
                f"${option.total_usd:,.0f}",
            ]
        )
    out.print(
        render.table(
            title, ["option", "basis", "per hour", "total"], rows, right_align=["per hour", "total"]
        )
    )
    out.print(f"{result.verdict}.", highlight=False)
    out.print(
        f"Power at load {result.load_kw:.1f} kW, idle {result.idle_kw:.1f} kW, "
        f"PUE {result.pue:.2f}, ${result.kwh_price_usd:.2f}/kWh; "
        f"purchase: {result.purchase_source}.",
        highlight=False,
    )


def _num(value: float) -> str:
    """Three significant digits, thousands separated: 0.0421, 7.3, 1,441."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _bench_rows(result: Any) -> list[list[str]]:
    def _share_cell(fraction: float | None) -> str:
        return f"{fraction:.0%}" if fraction is not None else "-"

    rows: list[list[str]] = []
    for dtype, by_shape in result.matmul_tflops.items():
        squares = ", ".join(f"{n}: {_num(v)}" for n, v in by_shape.items() if "x" not in n)
        others = ", ".join(f"{n}: {_num(v)}" for n, v in by_shape.items() if "x" in n)
        notes = "\n".join(
            part for part in (squares and f"n = {squares}", others and f"MxKxN {others}") if part
        )
        best = f"{_num(result.matmul_best_tflops[dtype])} TFLOP/s"
        rows.append(
            [f"matmul {dtype}", best, _share_cell(result.matmul_fraction.get(dtype)), notes]
        )
    memory = result.memory_fraction
    rows.append(["device memory copy", f"{result.memory_gb_per_s:,.1f} GB/s",
                 _share_cell(memory), "read + write"])  # fmt: skip
    shares, dtype = result.kernel_fraction, result.kernel_dtype
    for layout, tflops in result.conv_tflops.items():
        name = "channels_last" if layout == "nhwc" else "NCHW"
        rows.append([f"conv 3x3 {name}", f"{_num(tflops)} TFLOP/s",
                     _share_cell(shares.get(f"conv {layout}")),
                     f"{result.conv_shape or '?'} {dtype}, fwd + bwd"])  # fmt: skip
    kernels = (
        ("depthwise conv 3x3", result.depthwise_gb_per_s, "conv_depthwise",
         f"{result.depthwise_shape or '?'} {dtype}, fwd + bwd"),
        ("elementwise x*y+z", result.elementwise_gb_per_s, "elementwise",
         f"{dtype}, 3 reads + 1 write"),
        ("layer norm", result.reduction_gb_per_s, "reduction", f"{dtype}, rows of 4096"),
    )  # fmt: skip
    for label, value, kind, notes in kernels:
        if value is not None:
            rows.append([label, f"{_num(value)} GB/s", _share_cell(shares.get(kind)), notes])
    if result.launch_us is not None:
        where = "GPU time, queued" if result.device == "cuda" else "eager, on the CPU"
        rows.append(["launch latency", f"{result.launch_us:.3g} µs", "-",
                     f"per tiny kernel ({where})"])  # fmt: skip
    if result.host_op_us is not None:
        rows.append(["host dispatch", f"{result.host_op_us:.3g} µs/op", "-",
                     "CPU time of one eager op"])  # fmt: skip
    for direction in ("h2d", "d2h"):
        for kind in ("pinned", "pageable"):
            value = getattr(result, f"{direction}_{kind}_gb_per_s")
            if value is not None:
                share = result.pcie_fraction if (direction, kind) == ("h2d", "pinned") else None
                rows.append([f"{direction} {kind}", f"{value:,.1f} GB/s", _share_cell(share),
                             "of PCIe x16"])  # fmt: skip
    cache = "page cache dropped" if result.disk_cache_dropped else "may be cached"
    rows.append(["disk read", f"{result.disk_read_gb_per_s:,.2f} GB/s", "-",
                 f"{result.disk_dir} ({cache})"])  # fmt: skip
    rows.append(["CPU image pipeline", f"{result.cpu_images_per_s_per_core:,.0f} /s/core", "-",
                 f"synthetic stand-in, {result.cpu_cores} cores"])  # fmt: skip
    for rate in result.rates:
        label = f"rate {rate['kernel']} {rate['dtype']}/{rate['layout']}"
        if rate["kernel"] == "host":
            value, notes = f"{rate['overhead_us']:.3g} µs/op", "for plans: host time per op"
        else:
            value = f"{rate['compute_fraction']:.0%} / {rate['bandwidth_fraction']:.0%}"
            notes = f"for plans: compute / bw, +{rate['overhead_us']:.3g} µs"
        rows.append([label, value, "-", notes])
    return rows


def bench_command(
    quick: bool = typer.Option(False, "--quick", help="Small sizes: a few seconds."),
    data_dir: Path = typer.Option(None, "--data-dir", help="Directory to read (default: tmp)."),
    save: bool = typer.Option(True, "--save/--no-save", help="Record the result in the store."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    catalog_paths: list[Path] = typer.Option(None, "--catalog", help=CATALOG_HELP),
) -> None:
    """Measure this machine: matmul, conv, memory-bound kernels, launch latency, memory,
    PCIe, disk, CPU; % of the spec; achievable rates for later plans on this GPU."""
    from rich.progress import Progress

    from cloudtrain.monitor.bench import run_bench, save_bench

    if data_dir is not None and not data_dir.is_dir():
        raise UserError(f"--data-dir {data_dir} is not a directory")
    catalog = cli_catalog(catalog_paths)
    progress_console = render.console()
    progress_console.stderr = True
    with Progress(console=progress_console, transient=True) as progress:
        task = progress.add_task("bench", total=None)

        def on_progress(label: str, done: int, total: int) -> None:
            progress.update(task, description=label, completed=done, total=total)

        result = run_bench(quick=quick, data_dir=data_dir, catalog=catalog, on_progress=on_progress)
    run_id = None
    if save:
        from cloudtrain.store import RunStore

        with RunStore.open() as store:
            run_id = save_bench(result, store)
    if as_json:
        render.print_json({**result.as_dict(), "run_id": run_id})
        return
    out = render.console()
    kind = (result.gpu or "not in the catalog") if result.device == "cuda" else "CPU"
    title = f"{result.device_name} ({kind})"
    out.print(render.table(title, ["measure", "value", "% of spec", "notes"], _bench_rows(result)))
    for anomaly in result.anomalies:
        out.print(f"[yellow]! {anomaly}[/yellow]")
    saved = f"; saved as run {run_id}" if run_id else ""
    out.print(f"{result.seconds:.1f} s{saved}.", highlight=False)
    if run_id and result.rates:
        out.print(
            f"{len(result.rates)} achievable rates saved for {result.gpu}: `cloudtrain plan "
            "--model` prices traced ops on it with them.",
            highlight=False,
        )


def register(app: typer.Typer) -> None:
    """Add this group's commands to the app."""
    app.command("plan")(plan_command)
    app.command("tco")(tco_command)
    app.command("bench")(bench_command)
