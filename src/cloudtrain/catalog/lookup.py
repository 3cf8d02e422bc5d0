"""Lookups over a loaded Catalog: GPUs by name or device string, regions, carbon, PUE.

`Catalog`'s methods (`gpu`, `resolve_gpu`, `region`, `country_of`,
`carbon_intensity`, `pue_for`) call into this module; the dictionaries behind them
are built once per catalog on first use (and rebuilt if its lists are replaced or
change length; treat a loaded catalog as read-only).
"""

from __future__ import annotations

from dataclasses import dataclass

from cloudtrain.catalog.names import gpu_index, normalize_gpu_name
from cloudtrain.catalog.types import Catalog, GPUSpec, GridIntensity, Region
from cloudtrain.errors import UnknownNameError

DEFAULT_PUE = 1.58
"""PUE used for a provider without a row in pue.csv (and without a 'default' row there):
the industry-wide average annual PUE reported by the Uptime Institute Global Data
Center Survey 2023 (1.58). Hyperscalers report much lower figures, so listing your
provider in pue.csv matters."""


@dataclass(frozen=True)
class CatalogIndex:
    gpus: dict[str, GPUSpec]
    """Normalised name/alias -> spec."""
    regions: dict[tuple[str, str], Region]
    """(provider, region), case-folded -> region."""
    grid: dict[str, GridIntensity]
    pue: dict[str, float]
    """Case-folded provider -> PUE."""
    signature: tuple[int, ...]


def _signature(catalog: Catalog) -> tuple[int, ...]:
    lists = (catalog.gpus, catalog.regions, catalog.grid, catalog.pue)
    return tuple(n for items in lists for n in (id(items), len(items)))


def index_of(catalog: Catalog) -> CatalogIndex:
    """The lookup dictionaries of `catalog`, built on first use."""
    signature = _signature(catalog)
    cached = catalog.__dict__.get("_lookup_index")
    if cached is not None and cached.signature == signature:
        return cached
    index = CatalogIndex(
        gpus=gpu_index(catalog.gpus),
        regions={(r.provider.casefold(), r.region.casefold()): r for r in catalog.regions},
        grid={g.country.upper(): g for g in catalog.grid},
        pue={p.provider.casefold(): p.pue for p in catalog.pue},
        signature=signature,
    )
    catalog.__dict__["_lookup_index"] = index
    return index


def resolve_gpu(catalog: Catalog, device_name: str) -> GPUSpec | None:
    """The spec whose name or alias equals `device_name` after normalisation; None if none.

    Takes the strings `torch.cuda.get_device_name()` and `nvidia-smi` print, e.g.
    'NVIDIA A100-SXM4-80GB'. No prefix or fuzzy matching: an unknown device is None.
    """
    return index_of(catalog).gpus.get(normalize_gpu_name(device_name))


def gpu(catalog: Catalog, name: str) -> GPUSpec:
    """The spec named `name` (or one of its aliases); UnknownNameError with did-you-mean."""
    spec = resolve_gpu(catalog, name)
    if spec is None:
        aliases = {alias: g.name for g in catalog.gpus for alias in g.aliases}
        raise UnknownNameError("GPU", name, [g.name for g in catalog.gpus], aliases=aliases)
    return spec


def region(catalog: Catalog, provider: str, name: str) -> Region | None:
    """The region row of `provider`'s region `name` (case-insensitive); None if not listed."""
    return index_of(catalog).regions.get((provider.casefold(), name.casefold()))


def country_of(catalog: Catalog, provider: str, name: str) -> str | None:
    """ISO alpha-3 country of a provider's region; None if the region is not listed."""
    found = region(catalog, provider, name)
    return found.country if found else None


def grid_intensity(catalog: Catalog, country: str) -> float | None:
    """gCO2e/kWh of a country's grid ('WORLD' for the world average); None if not listed."""
    row = index_of(catalog).grid.get(country.upper())
    return row.gco2e_per_kwh if row else None


def carbon_intensity(catalog: Catalog, provider: str, name: str) -> float | None:
    """gCO2e/kWh for a region: its own figure if published, else its country's grid.

    None when the region is not listed or its country has no grid figure; callers that
    want a fallback can use `grid_intensity(catalog, 'WORLD')`.
    """
    found = region(catalog, provider, name)
    if found is None:
        return None
    if found.gco2e_per_kwh is not None:
        return found.gco2e_per_kwh
    return grid_intensity(catalog, found.country)


def pue_for(catalog: Catalog, provider: str) -> float:
    """The provider's PUE from pue.csv, else its 'default' row, else DEFAULT_PUE."""
    table = index_of(catalog).pue
    found = table.get(provider.casefold())
    if found is None:
        found = table.get("default", DEFAULT_PUE)
    return found
