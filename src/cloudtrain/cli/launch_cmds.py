"""Commands: `run` (supervised torchrun), `spot simulate`, `autoscale simulate`, `export ...`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from cloudtrain.cli import render
from cloudtrain.cli.config_cmds import run_settings
from cloudtrain.errors import UserError

spot_app = typer.Typer(
    help="Spot policies: replay a spot trace under a policy.", no_args_is_help=True
)
autoscale_app = typer.Typer(help="Autoscaling a GPU pool for a job queue.", no_args_is_help=True)
export_app = typer.Typer(
    help="Export a job to SkyPilot or Kubernetes, or a model to ONNX.", no_args_is_help=True
)
_PASSTHROUGH = {"allow_interspersed_args": False}
"""Options go before the script; everything from the script on is passed to it."""


# ---------------------------------------------------------------- run


def run(
    command: list[str] = typer.Argument(..., help="Training script and its arguments, after --."),
    nproc: str = typer.Option(
        "1", "--nproc", help="Workers on this node, or 'auto' (one per GPU)."
    ),
    nnodes: str | None = typer.Option(None, "--nnodes", help="Nodes, N or MIN:MAX (elastic)."),
    rdzv: str | None = typer.Option(None, "--rdzv", help="Rendezvous HOST:PORT for --nnodes."),
    max_restarts: int | None = typer.Option(
        None, "--max-restarts", help="Restarts after failures (default: 3)."
    ),
    budget: float | None = typer.Option(None, "--budget", help="Stop before spend passes USD."),
    price: float | None = typer.Option(None, "--price", help="USD per hour of this machine."),
    offer: str | None = typer.Option(
        None,
        "--offer",
        help="The catalog offer this machine is, PROVIDER/REGION/INSTANCE: its price "
        "(per --pricing) and, on spot, its interruption band's MTBF.",
    ),
    pricing: str = typer.Option(
        "on-demand", "--pricing", help="With --offer: on-demand, spot or reserved."
    ),
    grace_s: float | None = typer.Option(
        None, "--grace-s", help="Seconds workers get to checkpoint (default: 30)."
    ),
    backoff_s: float = typer.Option(5.0, "--backoff-s", help="First restart delay (doubles)."),
    checkpoint_dir: str = typer.Option(
        "checkpoints", "--checkpoint-dir", help="Passed as CLOUDTRAIN_CHECKPOINT_DIR."
    ),
    name: str | None = typer.Option(None, "--name", help="Run name in the store."),
    mtbf_hours: float | None = typer.Option(
        None, "--mtbf-hours", help="Expected hours between interruptions (CLOUDTRAIN_MTBF_S)."
    ),
    band: str | None = typer.Option(
        None,
        "--interruption-band",
        help="AWS spot interruption band (<5%, 5-10%, ..., >20%): the MTBF from it.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
) -> None:
    """Run a training script under torchrun with restarts, resume, budget and preemption.

    Exit codes: 0 done, 1 failed after all restarts, 2 usage error, 3 stopped by the
    budget (resumable), 75 stopped by SIGTERM/SIGINT after checkpointing (resumable).
    The last line on stderr says how it ended; after a stop, with the command that
    resumes the run. Price, budget, restarts and grace not given as flags come from
    the settings (`run` section; see `cloudtrain config show`).
    """
    from cloudtrain.launch.supervisor import (
        RunSpec,
        max_nodes,
        mtbf_s_from_band,
        summary_line,
        supervise,
    )

    if mtbf_hours is not None and band is not None:
        raise UserError("give --mtbf-hours or --interruption-band, not both")
    offer_facts: dict[str, Any] | None = None
    if offer is not None:
        if price is not None:
            raise UserError("give --price or --offer, not both")
        price, offer_band, offer_facts = _offer_terms(offer, pricing)
        if mtbf_hours is None and band is None:
            band = offer_band
    mtbf_s = mtbf_hours * 3600.0 if mtbf_hours is not None else None
    if band is not None:
        mtbf_s = mtbf_s_from_band(band, max_nodes(nnodes))

    configured = run_settings(
        price_usd_per_hour=price, budget_usd=budget, max_restarts=max_restarts, grace_s=grace_s
    )
    spec = RunSpec(
        command=tuple(command),
        nproc="auto" if nproc == "auto" else _positive_int(nproc, "--nproc"),
        nnodes=nnodes,
        rdzv_endpoint=rdzv,
        max_restarts=configured.max_restarts,
        budget_usd=configured.budget_usd,
        price_usd_per_hour=configured.price_usd_per_hour,
        grace_s=configured.grace_s,
        backoff_s=backoff_s,
        checkpoint_dir=checkpoint_dir,
        name=name,
        mtbf_s=mtbf_s,
        offer=offer_facts,
    )
    outcome = supervise(spec)
    if as_json:
        render.print_json(outcome)
    typer.echo(f"cloudtrain run: {summary_line(outcome, spec.budget_usd)}", err=True)
    raise typer.Exit(outcome.exit_code)


def _offer_terms(ref: str, pricing: str) -> tuple[float, str | None, dict[str, Any]]:
    """(USD per hour of one node, interruption band on spot or None, what the run
    records of the offer) of a catalog offer."""
    from cloudtrain.catalog import PRICINGS, find_offer, offer_price, offer_ref
    from cloudtrain.cli.config_cmds import cli_catalog
    from cloudtrain.errors import UnknownNameError

    key = pricing.replace("-", "_")  # the catalog's spelling: on_demand
    if key not in PRICINGS:
        raise UnknownNameError("--pricing", pricing, [p.replace("_", "-") for p in PRICINGS])
    chosen = find_offer(cli_catalog(), ref)
    price = offer_price(chosen, key)
    if price is None:
        raise UserError(f"{offer_ref(chosen)} has no {pricing} price in the catalog; use --price")
    band = chosen.interruption_band if pricing == "spot" else None
    note = f", interruption band {band}" if band else ""
    typer.echo(
        f"cloudtrain run: {offer_ref(chosen)} {pricing} at {price:.4g} USD/h per node{note}",
        err=True,
    )
    facts = {
        "provider": chosen.provider,
        "region": chosen.region,
        "instance_type": chosen.instance_type,
        "pricing": key,
        "gpu": chosen.gpu,
        "gpu_count": chosen.gpu_count,
    }
    return price, band, facts


def _positive_int(text: str, flag: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise UserError(f"{flag} must be a positive integer or 'auto', got '{text}'") from None


# ---------------------------------------------------------------- spot simulate


@spot_app.command("simulate")
def spot_simulate(
    trace: Path | None = typer.Option(
        None, "--trace", help="Trace CSV: timestamp,available,price."
    ),
    synthetic: float | None = typer.Option(
        None, "--synthetic", help="Synthetic trace with this many preemptions per spot-hour."
    ),
    job_hours: float = typer.Option(..., "--job-hours", help="Compute the job needs, hours."),
    deadline: float = typer.Option(..., "--deadline", help="Deadline, hours from the start."),
    policy: str = typer.Option(
        "all", "--policy", help="greedy, uniform-progress, on-demand, spot-only, or 'all'."
    ),
    restart_minutes: float = typer.Option(6.0, "--restart-minutes", help="Cost of each start."),
    on_demand_price: float = typer.Option(
        1.0, "--on-demand-price", help="On-demand USD/h of the instance (1.0: relative costs)."
    ),
    outage_hours: float = typer.Option(1.0, "--outage-hours", help="Synthetic: mean outage."),
    spot_discount: float = typer.Option(0.7, "--spot-discount", help="Synthetic: spot discount."),
    seed: int = typer.Option(0, "--seed", help="Synthetic: random seed."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Replay a spot trace: cost, finish time, deadline met, spot/on-demand hours, preemptions."""
    from cloudtrain.launch.spot_policy import POLICIES, make_policy
    from cloudtrain.launch.spot_sim import SpotJob, compare_policies
    from cloudtrain.launch.spot_trace import load_trace, synthetic_trace

    if (trace is None) == (synthetic is None):
        raise UserError("give exactly one of --trace FILE or --synthetic RATE")
    job = SpotJob(job_hours, deadline, restart_minutes, on_demand_price)
    if trace is not None:
        spot_trace = load_trace(trace)
    else:
        spot_trace = synthetic_trace(
            synthetic or 0.0, hours=deadline + job_hours, seed=seed,
            mean_outage_hours=outage_hours, on_demand_price_usd_per_hour=on_demand_price,
            spot_discount=spot_discount,
        )  # fmt: skip
    names = list(POLICIES) if policy == "all" else [p for p in policy.split(",") if p]
    results = compare_policies([make_policy(n) for n in names], spot_trace, job)
    if as_json:
        render.print_json({"trace": spot_trace.source, "results": results})
        return
    rows = [
        (r.policy, f"{r.cost_usd:.2f}", _pct(r.savings_fraction), render.fmt(r.finish_hours),
         "yes" if r.deadline_met else "NO", f"{r.spot_hours:.2f}", f"{r.on_demand_hours:.2f}",
         r.preemptions)
        for r in results
    ]  # fmt: skip
    cols = ["policy", "cost $", "saved", "finish h", "deadline", "spot h", "on-demand h", "preempt"]
    title = (
        f"{job_hours:g} h job, deadline {deadline:g} h, restart {restart_minutes:g} min, "
        f"trace {spot_trace.source} (spot {spot_trace.availability:.0%} of the time)"
    )
    render.console().print(render.table(title, cols, rows, right_align=cols[1:]))


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


# ---------------------------------------------------------------- autoscale simulate


@autoscale_app.command("simulate")
def autoscale_simulate(
    jobs: Path | None = typer.Option(
        None, "--jobs", help="Job trace CSV: submit_hours,gpus,duration_hours[,name]."
    ),
    synthetic: int | None = typer.Option(None, "--synthetic", help="Draw this many bursty jobs."),
    min_gpus: int = typer.Option(0, "--min-gpus"),
    max_gpus: int = typer.Option(32, "--max-gpus"),
    fixed_gpus: int | None = typer.Option(None, "--fixed-gpus", help="Fixed pool (default max)."),
    price: float = typer.Option(1.0, "--price", help="USD per GPU-hour."),
    provision_minutes: float = typer.Option(3.0, "--provision-minutes"),
    seed: int = typer.Option(0, "--seed"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Compare a fixed pool, the plain 0.8/0.3 rule and the robust autoscaler on a job trace."""
    from cloudtrain.launch.autoscale import (
        AutoscaleConfig,
        AutoscalePolicy,
        FixedPool,
        ThresholdPolicy,
        load_jobs,
        synthetic_jobs,
    )  # fmt: skip
    from cloudtrain.launch.autoscale_sim import simulate_pool

    if (jobs is None) == (synthetic is None):
        raise UserError("give exactly one of --jobs FILE or --synthetic COUNT")
    job_list = load_jobs(jobs) if jobs is not None else synthetic_jobs(count=synthetic, seed=seed)
    config = AutoscaleConfig(min_gpus=min_gpus, max_gpus=max_gpus)
    fixed = max_gpus if fixed_gpus is None else fixed_gpus
    runs = [
        (FixedPool(), fixed, fixed),
        (ThresholdPolicy(config), min_gpus, max_gpus),
        (AutoscalePolicy(config), min_gpus, max_gpus),
    ]
    results = [
        simulate_pool(policy, job_list, initial_gpus=start, max_gpus=cap,
                      price_usd_per_gpu_hour=price, provision_minutes=provision_minutes)
        for policy, start, cap in runs
    ]  # fmt: skip
    if as_json:
        render.print_json({"jobs": len(job_list), "results": results})
        return
    cols = ["policy", "GPU-h", "cost $", "util", "mean wait h", "max wait h", "actions", "peak"]
    rows = [
        (f"{r.policy} ({fixed})" if r.policy == "fixed" else r.policy, f"{r.gpu_hours:.1f}",
         f"{r.cost_usd:.2f}", f"{r.utilization:.0%}", f"{r.mean_wait_hours:.3f}",
         f"{r.max_wait_hours:.2f}", r.scaling_actions, r.peak_gpus)
        for r in results
    ]  # fmt: skip
    title = f"{len(job_list)} jobs, pool {min_gpus}-{max_gpus} GPUs, ${price:g}/GPU-h"
    render.console().print(render.table(title, cols, rows, right_align=cols[1:]))


# ---------------------------------------------------------------- export


def _write(text: str, out: Path | None) -> None:
    if out is None:
        sys.stdout.write(text)
        return
    out.write_text(text)
    typer.echo(f"wrote {out}", err=True)


@export_app.command("skypilot", context_settings=_PASSTHROUGH)
def export_skypilot(
    command: list[str] = typer.Argument(..., help="Training script and its arguments, after --."),
    gpu: str = typer.Option(..., "--gpu", help="GPU name (catalog or SkyPilot), e.g. H100."),
    count: int = typer.Option(1, "--count", help="GPUs per node."),
    nodes: int = typer.Option(1, "--nodes"),
    infra: str | None = typer.Option(
        None, "--infra", "--provider", help="aws, gcp/us-central1, k8s"
    ),
    spot: bool = typer.Option(False, "--spot", help="Spot first, on-demand as the fallback."),
    disk_gb: int | None = typer.Option(None, "--disk-gb"),
    max_restarts: int = typer.Option(3, "--max-restarts", help="max_restarts_on_errors."),
    strategy: str = typer.Option("EAGER_NEXT_REGION", "--recovery", help="or FAILOVER."),
    bucket: str | None = typer.Option(
        None, "--bucket", help="Checkpoint bucket: s3://... or name."
    ),
    setup: str | None = typer.Option(None, "--setup", help="Setup commands (e.g. pip install)."),
    name: str = typer.Option("cloudtrain", "--name"),
    check: bool = typer.Option(
        True, "--check/--no-check", help="Parse with SkyPilot if installed."
    ),
    out: Path | None = typer.Option(None, "-o", "--out", help="Write here instead of stdout."),
) -> None:
    """Write a SkyPilot task YAML (launch with `sky jobs launch FILE`)."""
    from cloudtrain.launch import skypilot

    spec = skypilot.SkyPilotSpec(
        command=tuple(command), gpu=gpu, gpus_per_node=count, nodes=nodes, infra=infra,
        spot=spot, disk_gb=disk_gb, max_restarts=max_restarts, recovery_strategy=strategy,
        bucket=bucket, setup=setup, name=name,
    )  # fmt: skip
    task = skypilot.build_task(spec)
    if check and skypilot.skypilot_available():
        version = skypilot.check_with_skypilot(task)
        typer.echo(f"checked with SkyPilot {version}", err=True)
    elif check:
        typer.echo("SkyPilot not installed (pip install skypilot): checked names only", err=True)
    _write(skypilot.to_yaml(task), out)


@export_app.command("k8s", context_settings=_PASSTHROUGH)
def export_k8s(
    command: list[str] = typer.Argument(..., help="Training script and its arguments, after --."),
    image: str = typer.Option(..., "--image", help="Container image with PyTorch and the code."),
    count: int = typer.Option(1, "--count", help="GPUs per node."),
    nodes: int = typer.Option(1, "--nodes"),
    min_nodes: int | None = typer.Option(None, "--min-nodes", help="--legacy elastic minimum."),
    max_restarts: int = typer.Option(3, "--max-restarts"),
    shm_gib: float | None = typer.Option(None, "--shm-gib", help="/dev/shm size limit."),
    pvc: str | None = typer.Option(None, "--checkpoint-pvc", help="PVC mounted at /checkpoints."),
    legacy: bool = typer.Option(False, "--legacy", help="PyTorchJob (kubeflow.org/v1) instead."),
    name: str = typer.Option("cloudtrain", "--name"),
    namespace: str | None = typer.Option(None, "--namespace"),
    out: Path | None = typer.Option(None, "-o", "--out", help="Write here instead of stdout."),
) -> None:
    """Write a Kubeflow Trainer v2 TrainJob (or, with --legacy, a PyTorchJob)."""
    from cloudtrain.launch import k8s

    spec = k8s.K8sSpec(
        command=tuple(command), image=image, name=name, nodes=nodes, min_nodes=min_nodes,
        gpus_per_node=count, max_restarts=max_restarts, shm_gib=shm_gib, checkpoint_pvc=pvc,
        namespace=namespace,
    )  # fmt: skip
    manifest = k8s.pytorch_job(spec) if legacy else k8s.train_job(spec)
    _write(k8s.to_yaml(manifest), out)


@export_app.command("onnx")
def export_onnx_cmd(
    checkpoint: Path = typer.Argument(..., help="Checkpoint dir, step dir or .pt state dict."),
    model: str = typer.Option(..., "--model", help="Factory: path/model.py:build or pkg.mod:fn."),
    input_shape: str = typer.Option(..., "--input-shape", help="e.g. 1,3,32,32"),
    input_dtype: str = typer.Option("float32", "--input-dtype", help="float32 or int64."),
    input_high: int = typer.Option(1000, "--input-high", help="int64 inputs: upper bound."),
    out: Path = typer.Option(Path("model.onnx"), "-o", "--out"),
    opset: int = typer.Option(17, "--opset"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Export a checkpoint's model to ONNX, checked in onnxruntime against PyTorch."""
    from cloudtrain.launch.onnx_export import export_onnx

    try:
        shape = tuple(int(s) for s in input_shape.split(","))
    except ValueError:
        raise UserError(f"--input-shape '{input_shape}' must be integers like 1,3,32,32") from None
    result = export_onnx(
        checkpoint, model, shape, out, input_dtype=input_dtype, input_high=input_high, opset=opset
    )
    if as_json:
        render.print_json(result)
    else:
        typer.echo(
            f"wrote {result.path} ({result.exporter} exporter, opset {result.opset}); "
            f"onnxruntime matches PyTorch, max |diff| {result.max_abs_diff:.2e}"
        )


def register(app: typer.Typer) -> None:
    """Add this group's commands to the app."""
    app.command("run", context_settings=_PASSTHROUGH)(run)
    app.add_typer(spot_app, name="spot")
    app.add_typer(autoscale_app, name="autoscale")
    app.add_typer(export_app, name="export")
