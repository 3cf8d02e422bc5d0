"""The catalog: GPU specs, cloud instance offers, carbon intensity and PUE.

Versioned CSV data ships in `catalog/data/` (every row with a source and an as-of
date); the user's own rows in `$CLOUDTRAIN_HOME/catalog/*.csv` or `--catalog PATH`
replace or extend it. Pure data and lookups: nothing here imports torch.

    from cloudtrain.catalog import load_catalog, find_offers
    catalog = load_catalog()
    catalog.gpu("H100").bf16_tflops
    catalog.resolve_gpu("NVIDIA A100-SXM4-80GB")        # GPUSpec, or None if unknown
    find_offers(catalog, gpu="A100", region="us-*", sort="price_per_gpu")[:5]
"""

from __future__ import annotations

from cloudtrain.catalog.loader import KIND_NAMES, load_catalog
from cloudtrain.catalog.lookup import DEFAULT_PUE
from cloudtrain.catalog.names import normalize_gpu_name
from cloudtrain.catalog.query import (
    PRICINGS,
    SORTS,
    CatalogSummary,
    GPUPrices,
    catalog_summary,
    find_offer,
    find_offers,
    hourly_price,
    offer_price,
    offer_ref,
    price_per_gpu_hour,
    price_per_pflop_hour,
)
from cloudtrain.catalog.skypilot import CloudImport, ImportResult, import_skypilot
from cloudtrain.catalog.types import (
    Catalog,
    ExchangeRate,
    GPUSpec,
    GridIntensity,
    Offer,
    ProviderPUE,
    Region,
)

__all__ = [
    "DEFAULT_PUE",
    "KIND_NAMES",
    "PRICINGS",
    "SORTS",
    "Catalog",
    "CatalogSummary",
    "CloudImport",
    "ExchangeRate",
    "GPUPrices",
    "GPUSpec",
    "GridIntensity",
    "ImportResult",
    "Offer",
    "ProviderPUE",
    "Region",
    "catalog_summary",
    "find_offer",
    "find_offers",
    "hourly_price",
    "import_skypilot",
    "load_catalog",
    "normalize_gpu_name",
    "offer_price",
    "offer_ref",
    "price_per_gpu_hour",
    "price_per_pflop_hour",
    "resolve_gpu",
]


def resolve_gpu(device_name: str, catalog: Catalog | None = None) -> GPUSpec | None:
    """The GPU spec a device string names (torch/nvidia-smi), or None if the catalog has none.

    Without `catalog`, uses the bundled and user catalog (loaded once per user catalog state).
    """
    from cloudtrain.catalog.loader import default_catalog

    return (catalog or default_catalog()).resolve_gpu(device_name)
