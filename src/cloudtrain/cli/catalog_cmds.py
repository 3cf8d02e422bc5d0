"""Commands over the catalog: `gpus`, `offers`, `catalog summary`, `catalog import-skypilot`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich import box
from rich.table import Table

from cloudtrain.catalog import (
    Catalog,
    CatalogSummary,
    ImportResult,
    Offer,
    catalog_summary,
    find_offers,
    import_skypilot,
    load_catalog,
    price_per_gpu_hour,
    price_per_pflop_hour,
)
from cloudtrain.catalog.query import bf16_by_gpu
from cloudtrain.cli import render
from cloudtrain.cli.config_cmds import cli_catalog
from cloudtrain.errors import UserError

SORT_FLAGS = {"price": "price", "gpu-price": "price_per_gpu", "pflop-price": "price_per_pflop"}
_LINK = {"nvlink": "NVLink", "infinity-fabric": "IF", "pcie": "PCIe"}

CATALOG_HELP = (
    "Extra catalog CSV file or directory, merged over the bundled and user rows "
    "(default: the catalog.paths setting)."
)
catalog_app = typer.Typer(
    help="The catalog: summary, and importing SkyPilot's price catalogs.", no_args_is_help=True
)


def _compact(out: Table) -> Table:
    """A table without borders, so that wide listings fit 100 columns."""
    out.box = box.SIMPLE_HEAD
    out.show_edge = False
    out.collapse_padding = True
    return out


def _print(out: Table, *footer: str) -> None:
    console = render.console()
    console.print(out)
    for line in footer:
        console.print(line, highlight=False, markup=False)


# ---------------------------------------------------------------- gpus


def _link(kind: str | None, gbps: float | None) -> str:
    if kind is None:
        return "-"
    name = _LINK.get(kind, kind)
    return name if gbps is None else f"{name} {gbps:g}"


def gpus(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    catalog_paths: list[Path] | None = typer.Option(None, "--catalog", help=CATALOG_HELP),
) -> None:
    """List the GPUs the catalog knows (dense peak TFLOPS, never sparsity figures)."""
    specs = cli_catalog(catalog_paths).gpus
    if as_json:
        render.print_json(specs)
        return
    columns = ["GPU", "arch", "GiB", "HBM GB/s", "FP32", "TF32", "BF16", "FP8", "link GB/s"]
    columns += ["TDP W", "price $"]
    rows = [
        (g.name, g.architecture, _num(g.memory_gib), _num(g.memory_bandwidth_gbps),
         _num(g.fp32_tflops), _num(g.tf32_tflops), _num(g.bf16_tflops), _num(g.fp8_tflops),
         _link(g.link_kind, g.link_gbps_per_direction), _num(g.tdp_w), _num(g.purchase_price_usd))
        for g in specs
    ]  # fmt: skip
    numeric = set(columns) - {"GPU", "arch", "link GB/s"}
    out = _compact(render.table(None, columns, rows, right_align=numeric))
    _print(out, "TFLOPS: dense peaks per GPU (no sparsity); '-' = no such unit or unpublished.")


def _num(value: float | None) -> str:
    """A compact number: '-' for None, no needless decimals, thousands separated."""
    if value is None:
        return "-"
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:,.1f}" if value >= 100 else f"{value:,.3g}"


# ---------------------------------------------------------------- offers


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}" if value >= 10 else f"{value:.3f}"


def _offer_rows(catalog: Catalog, offers: list[Offer], spot: bool) -> list[tuple[str, ...]]:
    bf16 = bf16_by_gpu(catalog)
    return [
        (o.provider, o.region, o.instance_type, f"{o.gpu_count}x {o.gpu}", str(o.vcpus),
         _money(o.price_usd_per_hour), _money(o.spot_usd_per_hour),
         _money(price_per_gpu_hour(o, spot)),
         _money(price_per_pflop_hour(o, bf16.get(o.gpu), spot)))
        for o in offers
    ]  # fmt: skip


def _offer_table(catalog: Catalog, offers: list[Offer], spot: bool) -> Table:
    """Offers in 100 columns: only the instance and GPU names wrap, when they must."""
    basis = "spot " if spot else ""
    columns = ["provider", "region", "instance", "GPUs", "vCPU", "$/h", "spot"]
    columns += [f"{basis}$/GPU-h", f"{basis}$/PF-h"]
    rows = _offer_rows(catalog, offers, spot)
    out = _compact(render.table(None, columns, rows, right_align=columns[4:]))
    for column in out.columns:
        column.no_wrap = column.header != "instance"
    return out


def offers(
    gpu: list[str] | None = typer.Option(None, "--gpu", help="GPU name or alias (repeat, or a,b)."),
    provider: list[str] | None = typer.Option(
        None, "--provider", help="Provider (repeat, or a,b)."
    ),
    region: list[str] | None = typer.Option(
        None, "--region", help="Region glob like 'us-*' (repeat)."
    ),
    spot: bool = typer.Option(False, "--spot", help="Compare spot prices (only offers with spot)."),
    min_gpus: int | None = typer.Option(None, "--min-gpus", help="At least this many GPUs."),
    max_price: float | None = typer.Option(
        None, "--max-price", help="Highest $/h (spot with --spot)."
    ),
    sort: str = typer.Option("price", "--sort", help="price | gpu-price | pflop-price"),
    limit: int = typer.Option(25, "--limit", help="Rows to show; 0 = all."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    catalog_paths: list[Path] | None = typer.Option(None, "--catalog", help=CATALOG_HELP),
) -> None:
    """Instance offers, filtered and cheapest first (prices in USD per hour)."""
    if sort not in SORT_FLAGS:
        raise UserError(f"unknown --sort '{sort}'; choose one of {', '.join(SORT_FLAGS)}")
    if limit < 0:
        raise UserError(f"--limit must be >= 0 (0 = all), got {limit}")
    catalog = cli_catalog(catalog_paths)
    found = find_offers(
        catalog,
        gpu=render.split_list(gpu),
        provider=render.split_list(provider),
        region=render.split_list(region),
        spot_only=spot, min_gpus=min_gpus, max_price_usd_per_hour=max_price,
        sort=SORT_FLAGS[sort],
    )  # fmt: skip
    shown = found[:limit] if limit else found
    if as_json:
        render.print_json(shown)
        return
    out = _offer_table(catalog, shown, spot)
    if len(shown) < len(found):
        footer = f"showing {len(shown)} of {len(found)} offers; --limit 0 for all"
    else:
        footer = f"{len(found)} offer{'s' if len(found) != 1 else ''}"
    _print(out, footer, "USD per hour; $/PF-h: per dense bf16 PFLOP/s of the instance")


# ---------------------------------------------------------------- catalog group


@catalog_app.command("summary")
def summary(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    catalog_paths: list[Path] | None = typer.Option(None, "--catalog", help=CATALOG_HELP),
) -> None:
    """What the catalog holds, and the cheapest on-demand and spot $/GPU-hour per GPU."""
    result = catalog_summary(cli_catalog(catalog_paths))
    if as_json:
        render.print_json(result)
        return
    _print_summary(result)


def _print_summary(result: CatalogSummary) -> None:
    head = (
        f"{result.gpu_count} GPUs, {result.offer_count} offers ({result.spot_offer_count} with "
        f"spot) from {result.provider_count} providers in {result.region_count} regions: "
        f"{', '.join(result.providers)}"
    )
    columns = ["GPU", "offers", "$/GPU-h", "cheapest at", "spot $/GPU-h"]
    rows = [
        (g.gpu, str(g.offer_count), _money(g.cheapest_usd_per_gpu_hour),
         f"{g.provider} {g.region} {g.instance_type}" if g.provider else "-",
         _money(g.cheapest_spot_usd_per_gpu_hour))
        for g in result.gpus
    ]  # fmt: skip
    render.console().print(head, highlight=False, markup=False)
    aligned = ["offers", "$/GPU-h", "spot $/GPU-h"]
    _print(_compact(render.table(None, columns, rows, right_align=aligned)))


@catalog_app.command("import-skypilot")
def import_skypilot_cmd(
    path: Path | None = typer.Argument(
        None, help="vms.csv, a cloud/version folder, or catalogs root (default ~/.sky/catalogs)."
    ),
    cloud: str | None = typer.Option(
        None, "--cloud", help="Cloud of a single vms.csv (default: its folder)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a summary."),
) -> None:
    """Import SkyPilot's vms.csv price catalogs as offers in the user catalog."""
    result = import_skypilot(path, cloud=cloud)
    merged = load_catalog()  # checks what was written, and leaves the parsed catalog cached
    if as_json:
        render.print_json(result)
        return
    _print_import(result)
    render.console().print(f"the catalog now holds {len(merged.offers)} offers", highlight=False)


def _print_import(result: ImportResult) -> None:
    columns = ["cloud", "rows read", "offers", "skipped", "written to"]
    rows = [
        (c.cloud, str(c.rows_read), str(c.offers_written), str(sum(c.skipped.values())),
         c.output_file)
        for c in result.clouds
    ]  # fmt: skip
    out = _compact(render.table(None, columns, rows, right_align=columns[1:4]))
    lines = [f"read {result.rows_read} rows; wrote {sum(result.offers_written.values())} offers"]
    if result.skipped:
        lines.append("skipped: " + ", ".join(f"{n} {why}" for why, n in result.skipped.items()))
    if result.unknown_accelerators:
        names = ", ".join(f"{name} ({n})" for name, n in result.unknown_accelerators.items())
        lines.append(f"unknown accelerators (add a GPU alias to import them): {names}")
    _print(out, *lines)


def register(app: typer.Typer) -> None:
    """Add this group's commands to the app."""
    app.command("gpus")(gpus)
    app.command("offers")(offers)
    app.add_typer(catalog_app, name="catalog")
