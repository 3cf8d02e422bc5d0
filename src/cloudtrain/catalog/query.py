"""Choosing offers: filters and sort orders as pure functions over a Catalog."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cloudtrain.catalog.types import Catalog, Offer
from cloudtrain.errors import UnknownNameError, UserError

SORTS = ("price", "price_per_gpu", "price_per_pflop")
"""price: instance $/h; price_per_gpu: $/GPU-h; price_per_pflop: $/h per dense bf16
PFLOP/s of the instance (gpu_count * bf16_tflops / 1000)."""


PRICINGS = ("on_demand", "spot", "reserved")
"""How an instance can be paid for: on demand, on the spot market, a 1-year reservation."""


def offer_price(offer: Offer, pricing: str) -> float | None:
    """USD per hour of the whole instance under `pricing` (one of PRICINGS); None when
    the catalog has no such price for it."""
    if pricing == "on_demand":
        return offer.price_usd_per_hour
    if pricing == "spot":
        return offer.spot_usd_per_hour
    if pricing == "reserved":
        return offer.reserved_usd_per_hour
    raise UnknownNameError("pricing", pricing, PRICINGS)


def hourly_price(offer: Offer, spot: bool = False) -> float | None:
    """The instance's $/h: spot if `spot` (None without a spot price), else on-demand."""
    return offer.spot_usd_per_hour if spot else offer.price_usd_per_hour


def price_per_gpu_hour(offer: Offer, spot: bool = False) -> float | None:
    """$/h of one of the instance's GPUs; None without a spot price when `spot`."""
    price = hourly_price(offer, spot)
    return None if price is None else price / offer.gpu_count


def price_per_pflop_hour(
    offer: Offer, bf16_tflops: float | None, spot: bool = False
) -> float | None:
    """$/h per dense bf16 PFLOP/s of the whole instance; None if the GPU has no bf16 figure."""
    price = hourly_price(offer, spot)
    if price is None or not bf16_tflops:
        return None
    return price / (offer.gpu_count * bf16_tflops / 1000.0)


def bf16_by_gpu(catalog: Catalog) -> dict[str, float | None]:
    """Canonical GPU name -> dense bf16 TFLOP/s (None where the GPU has none)."""
    return {spec.name: spec.bf16_tflops for spec in catalog.gpus}


def _as_list(value: str | Iterable[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


def _gpu_names(catalog: Catalog, names: list[str]) -> set[str]:
    return {catalog.gpu(name).name for name in names}


def _providers(catalog: Catalog, names: list[str]) -> set[str]:
    known = {offer.provider.casefold(): offer.provider for offer in catalog.offers}
    chosen = set()
    for name in names:
        if name.casefold() not in known:
            raise UnknownNameError("provider", name, known.values())
        chosen.add(name.casefold())
    return chosen


def _region_matcher(patterns: list[str]) -> Callable[[str], bool]:
    if any(not pattern.strip() for pattern in patterns):
        raise UserError("--region: empty pattern; give a region name or a glob like 'us-*'")
    joined = "|".join(fnmatch.translate(pattern.casefold()) for pattern in patterns)
    match = re.compile(joined).match
    return lambda region: match(region.casefold()) is not None


def _sort_key(sort: str, catalog: Catalog, spot: bool) -> Callable[[Offer], tuple]:
    if sort not in SORTS:
        raise UserError(f"unknown sort '{sort}'; choose one of {', '.join(SORTS)}")
    bf16 = bf16_by_gpu(catalog)

    def metric(offer: Offer) -> float | None:
        if sort == "price":
            return hourly_price(offer, spot)
        if sort == "price_per_gpu":
            return price_per_gpu_hour(offer, spot)
        return price_per_pflop_hour(offer, bf16.get(offer.gpu), spot)

    def key(offer: Offer) -> tuple:
        value = metric(offer)
        return (value is None, value or 0.0, offer.provider, offer.region, offer.instance_type)

    return key


def find_offers(
    catalog: Catalog,
    gpu: str | Iterable[str] | None = None,
    provider: str | Iterable[str] | None = None,
    region: str | Iterable[str] | None = None,
    spot_only: bool = False,
    min_gpus: int | None = None,
    max_price_usd_per_hour: float | None = None,
    sort: str = "price",
) -> list[Offer]:
    """Offers that pass every given filter, cheapest first by `sort` (one of SORTS).

    gpu: GPU names or aliases (any of them); provider: provider names (any, case-
    insensitive); region: fnmatch globs like 'us-*' (any, case-insensitive);
    spot_only: only offers with a spot price, and spot prices are the ones compared
    and sorted; min_gpus: at least this many GPUs; max_price_usd_per_hour: on the
    compared price. Offers whose sort value is missing (no bf16 figure) come last; ties
    break by provider, region, instance type. Unknown GPU or provider names raise
    UnknownNameError (a UserError) with did-you-mean.
    """
    gpus = _gpu_names(catalog, _as_list(gpu))
    providers = _providers(catalog, _as_list(provider))
    patterns = _as_list(region)
    in_region = _region_matcher(patterns) if patterns else None
    key = _sort_key(sort, catalog, spot_only)
    if min_gpus is not None and min_gpus < 1:
        raise UserError(f"--min-gpus must be at least 1, got {min_gpus}")
    if max_price_usd_per_hour is not None and max_price_usd_per_hour < 0:
        raise UserError(f"--max-price must be >= 0, got {max_price_usd_per_hour}")
    chosen = []
    for offer in catalog.offers:
        if gpus and offer.gpu not in gpus:
            continue
        if providers and offer.provider.casefold() not in providers:
            continue
        if min_gpus is not None and offer.gpu_count < min_gpus:
            continue
        price = offer.spot_usd_per_hour if spot_only else offer.price_usd_per_hour
        if price is None:
            continue
        if max_price_usd_per_hour is not None and price > max_price_usd_per_hour:
            continue
        if in_region is not None and not in_region(offer.region):
            continue
        chosen.append(offer)
    chosen.sort(key=key)
    return chosen


# ---------------------------------------------------------------- summary


@dataclass(frozen=True)
class GPUPrices:
    """The cheapest offers of one GPU, per GPU-hour."""

    gpu: str
    offer_count: int
    cheapest_usd_per_gpu_hour: float | None
    """Lowest on-demand $/GPU-h; None: no offer of this GPU in the catalog."""
    provider: str | None
    region: str | None
    instance_type: str | None
    """Where the cheapest on-demand price is; None without offers."""
    cheapest_spot_usd_per_gpu_hour: float | None
    """Lowest spot $/GPU-h; None: no offer of this GPU has a spot price."""


@dataclass(frozen=True)
class CatalogSummary:
    """What the loaded catalog holds."""

    gpu_count: int
    offer_count: int
    spot_offer_count: int
    provider_count: int
    region_count: int
    """Distinct (provider, region) pairs that have at least one offer."""
    providers: tuple[str, ...]
    gpus: tuple[GPUPrices, ...]
    """One entry per GPU in catalog order, including GPUs without offers."""


def _gpu_prices(name: str, offers: list[Offer]) -> GPUPrices:
    if not offers:
        return GPUPrices(name, 0, None, None, None, None, None)
    best = min(offers, key=lambda o: (o.price_usd_per_gpu_hour, o.provider, o.region))
    spots = [o.spot_usd_per_hour / o.gpu_count for o in offers if o.spot_usd_per_hour is not None]
    return GPUPrices(
        gpu=name,
        offer_count=len(offers),
        cheapest_usd_per_gpu_hour=best.price_usd_per_gpu_hour,
        provider=best.provider,
        region=best.region,
        instance_type=best.instance_type,
        cheapest_spot_usd_per_gpu_hour=min(spots) if spots else None,
    )


def catalog_summary(catalog: Catalog) -> CatalogSummary:
    """Counts of GPUs, offers, providers and regions, and each GPU's cheapest $/GPU-h."""
    by_gpu: dict[str, list[Offer]] = {spec.name: [] for spec in catalog.gpus}
    for offer in catalog.offers:
        by_gpu.setdefault(offer.gpu, []).append(offer)
    providers = sorted({offer.provider for offer in catalog.offers})
    regions = {(offer.provider, offer.region) for offer in catalog.offers}
    return CatalogSummary(
        gpu_count=len(catalog.gpus),
        offer_count=len(catalog.offers),
        spot_offer_count=sum(1 for o in catalog.offers if o.spot_usd_per_hour is not None),
        provider_count=len(providers),
        region_count=len(regions),
        providers=tuple(providers),
        gpus=tuple(_gpu_prices(name, offers) for name, offers in by_gpu.items()),
    )


def offer_ref(offer: Offer) -> str:
    """How commands name one offer: PROVIDER/REGION/INSTANCE_TYPE."""
    return f"{offer.provider}/{offer.region}/{offer.instance_type}"


def find_offer(catalog: Catalog, ref: str) -> Offer:
    """The offer named by `ref`: PROVIDER/REGION/INSTANCE_TYPE (as `offer_ref` writes
    it), or PROVIDER/INSTANCE_TYPE when the instance is offered in one region only.
    Case-insensitive. A ref that names nothing, or several regions, raises a UserError
    that says what to write instead."""
    parts = [p.strip() for p in ref.split("/")]
    if len(parts) not in (2, 3) or not all(parts):
        raise UserError(
            f"offer '{ref}' should be PROVIDER/REGION/INSTANCE (e.g. aws/us-east-1/p5.48xlarge)"
        )
    provider = next(iter(_providers(catalog, parts[:1])))
    instance = parts[-1].lower()
    mine = [o for o in catalog.offers if o.provider.casefold() == provider]
    same_type = [o for o in mine if o.instance_type.lower() == instance]
    if not same_type:
        types = {o.instance_type for o in mine}
        raise UnknownNameError(f"{parts[0]} instance type", parts[-1], types)
    if len(parts) == 3:
        matches = [o for o in same_type if o.region.lower() == parts[1].lower()]
        if not matches:
            regions = {o.region for o in same_type}
            raise UnknownNameError(f"region for {parts[0]} {parts[-1]}", parts[1], regions)
        return matches[0]
    if len(same_type) > 1:
        refs = ", ".join(offer_ref(o) for o in same_type[:6])
        raise UserError(
            f"offer '{ref}' is in {len(same_type)} regions; name one: {refs}"
            + (", ..." if len(same_type) > 6 else "")
        )
    return same_type[0]
