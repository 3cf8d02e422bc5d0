"""Rent or buy: total cost of owning GPUs vs renting them for the hours actually used.

Buy  = purchase + operations x years + energy
       energy = (idle kW + utilization x (load kW - idle kW)) x hours x PUE x price/kWh
Rent = on-demand or spot: price/h x utilization x hours (pay per use);
       reserved: price/h x hours (the commitment is owed even when idle).
Break-even utilization u*: Buy(u*) = pay-per-use Rent(u*), linear in u:

    u* = (purchase + ops x years + hours x e x idle kW) / (hours x (price/h - e x (load - idle) kW))

with e = PUE x price/kWh. Above u*, owning is cheaper; u* > 1 means renting is cheaper
at any utilization.
"""

from __future__ import annotations

from dataclasses import dataclass

from cloudtrain.catalog.types import Catalog
from cloudtrain.errors import UserError
from cloudtrain.plan.assumptions import Assumptions
from cloudtrain.plan.pricing import hourly_usd

HOURS_PER_YEAR = 8760.0
SERVER_FACTOR = 1.25
"""Purchase of a server = GPUs' price x this (chassis, CPUs, memory, NICs, storage)."""
OPS_SHARE_PER_YEAR = 0.125
"""Operations per year (space, cooling beyond PUE, staff, support) as a share of the
purchase when not given: $15,000 on a $120,000 server, the seed example's ratio."""
SERVER_PRICE_PER_GPU_FALLBACK_USD = {"A100-40GB": 15_000.0, "A100-80GB": 15_000.0}
"""Server price per GPU (server share included) where the catalog has no GPU price: an
8x A100 server costs about $120,000 (seed 000 of the user's brief)."""
IDLE_GPU_POWER_FRACTION = 0.1
"""Idle GPU draw as a share of TDP (an H200 idles at 77 W of 700 W)."""
IDLE_HOST_SHARE = 0.5


@dataclass(frozen=True)
class RentOption:
    pricing: str
    """'on_demand', 'spot', 'reserved' or 'given' (--rent-usd-per-hour)."""
    usd_per_hour: float
    """For all `count` GPUs."""
    source: str
    """The offer the price comes from, or 'given'."""
    total_usd: float
    """Over the whole period at the given utilization."""


@dataclass(frozen=True)
class TCO:
    """Rent-vs-buy comparison for `count` GPUs over `years` at `utilization`."""

    gpu: str
    count: int
    utilization: float
    years: float
    kwh_price_usd: float
    pue: float
    purchase_usd: float
    purchase_source: str
    ops_usd_per_year: float
    load_kw: float
    idle_kw: float
    energy_usd: float
    buy_total_usd: float
    rent: list[RentOption]
    """Cheapest first."""
    break_even_utilization: float | None
    """Utilization above which buying is cheaper than the cheapest pay-per-use rent;
    None when renting is cheaper at any utilization (u* > 1) or there is no rent price."""
    verdict: str


def tco(
    catalog: Catalog,
    gpu: str,
    count: int,
    utilization: float,
    years: float,
    *,
    kwh_price_usd: float = 0.12,
    purchase_usd: float | None = None,
    ops_usd_per_year: float | None = None,
    rent_usd_per_hour: float | None = None,
    pue: float | None = None,
    assumptions: Assumptions | None = None,
) -> TCO:
    """Compare renting and buying `count` x `gpu` (see the module docstring)."""
    if not 0.0 < utilization <= 1.0 or years <= 0 or count < 1:
        raise UserError("utilization must be in (0, 1], years > 0 and count >= 1")
    a = assumptions or Assumptions()
    spec = catalog.gpu(gpu)
    purchase, purchase_source = _purchase(spec.purchase_price_usd, count, purchase_usd, spec.name)

    ops = purchase * OPS_SHARE_PER_YEAR if ops_usd_per_year is None else ops_usd_per_year
    pue_value = catalog.pue_for("onprem") if pue is None else pue
    load_kw = count * (spec.tdp_w * a.gpu_power_fraction + a.host_power_w_per_gpu) / 1000.0
    idle_kw = count * (
        spec.tdp_w * IDLE_GPU_POWER_FRACTION + a.host_power_w_per_gpu * IDLE_HOST_SHARE
    )
    idle_kw /= 1000.0
    hours = HOURS_PER_YEAR * years
    per_kwh = pue_value * kwh_price_usd
    energy = (idle_kw + utilization * (load_kw - idle_kw)) * hours * per_kwh
    buy = purchase + ops * years + energy
    rent = _rent_options(catalog, spec.name, count, utilization, hours, rent_usd_per_hour)
    per_use = [r for r in rent if r.pricing != "reserved"]
    break_even = None
    if per_use:
        rate = min(r.usd_per_hour for r in per_use)
        denominator = hours * (rate - per_kwh * (load_kw - idle_kw))
        fixed = purchase + ops * years + hours * per_kwh * idle_kw
        if denominator > 0 and fixed / denominator <= 1.0:
            break_even = fixed / denominator
    verdict = _verdict(buy, rent, break_even, utilization)
    return TCO(
        spec.name, count, utilization, years, kwh_price_usd, pue_value, purchase,
        purchase_source, ops, load_kw, idle_kw, energy, buy, rent, break_even, verdict,
    )  # fmt: skip


def _purchase(
    gpu_price: float | None, count: int, given: float | None, name: str
) -> tuple[float, str]:
    if given is not None:
        return given, "given"
    fallback = SERVER_PRICE_PER_GPU_FALLBACK_USD.get(name)
    if gpu_price is None and fallback is not None:
        return fallback * count, f"{count} x ${fallback:,.0f} (8x A100 server ~ $120,000, seed 000)"
    if gpu_price is None:
        raise UserError(f"the catalog has no purchase price for {name}; pass --purchase-usd")
    return (
        gpu_price * count * SERVER_FACTOR,
        f"catalog: {count} x ${gpu_price:,.0f} x {SERVER_FACTOR} (server)",
    )


def _rent_options(
    catalog: Catalog,
    gpu: str,
    count: int,
    utilization: float,
    hours: float,
    given: float | None,
) -> list[RentOption]:
    """The cheapest per-GPU offer for each pricing, scaled to `count` GPUs."""
    if given is not None:
        return [RentOption("given", given, "given", given * utilization * hours)]
    options: list[RentOption] = []
    offers = [o for o in catalog.offers if o.gpu == gpu]
    for pricing, attribute in (
        ("on_demand", "price_usd_per_hour"),
        ("spot", "spot_usd_per_hour"),
        ("reserved", "reserved_usd_per_hour"),
    ):
        priced = [o for o in offers if getattr(o, attribute) is not None]
        if not priced:
            continue
        best = min(priced, key=lambda o: hourly_usd(o, pricing) / o.gpu_count)
        per_hour = hourly_usd(best, pricing) / best.gpu_count * count
        used = hours if pricing == "reserved" else hours * utilization
        label = f"{best.provider} {best.region} {best.instance_type}"
        options.append(RentOption(pricing, per_hour, label, per_hour * used))
    return sorted(options, key=lambda r: r.total_usd)


def _verdict(
    buy: float, rent: list[RentOption], break_even: float | None, utilization: float
) -> str:
    if not rent:
        return f"buying costs ${buy:,.0f}; no rent price for this GPU in the catalog"
    cheapest = rent[0]
    if cheapest.total_usd <= buy:
        text = (
            f"rent ({cheapest.pricing}) is cheaper: ${cheapest.total_usd:,.0f} vs ${buy:,.0f} "
            f"to buy ({1 - cheapest.total_usd / buy:.0%} less)"
        )
    else:
        text = (
            f"buying is cheaper: ${buy:,.0f} vs ${cheapest.total_usd:,.0f} to rent "
            f"({cheapest.pricing}, {1 - buy / cheapest.total_usd:.0%} less)"
        )
    if break_even is None:
        return text + "; renting per use wins at any utilization"
    return text + f"; buying pays off above {break_even:.0%} utilization"
