"""Loading the catalog: bundled CSVs, then the user's, merged by key.

Sources, in order (a later row with the same key replaces an earlier one, other rows
extend the catalog):

1. the bundled files in `cloudtrain/catalog/data/*.csv`;
2. every `*.csv` in `paths.user_catalog_dir()` (`$CLOUDTRAIN_HOME/catalog`), by file name;
3. each `extra_paths` entry (`--catalog PATH`): a CSV file, or a directory of them.

A file's kind (gpus, offers, regions, grid_intensity, pue, exchange_rates,
achievable) is recognised from its header; keys are listed in `catalog/data/README.md`
and compare case-insensitively. Offers in another currency are converted to USD with the merged
exchange rates; an offer's GPU may be given by any name or alias of a known GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloudtrain import paths
from cloudtrain.catalog import cache
from cloudtrain.catalog import csvdata as cd
from cloudtrain.catalog.names import AliasClash, gpu_index, normalize_gpu_name
from cloudtrain.catalog.rates import ACHIEVABLE_COLUMNS
from cloudtrain.catalog.sources import catalog_sources, csv_files
from cloudtrain.catalog.types import (
    INTERRUPTION_BANDS,
    AchievableRate,
    Catalog,
    ExchangeRate,
    GPUSpec,
    GridIntensity,
    Offer,
    ProviderPUE,
    Region,
)
from cloudtrain.errors import DataError, did_you_mean

_SOURCE = (
    cd.Column("source", "source", cd.text, default=""),
    cd.Column("as_of", "as_of", cd.iso_date, default=""),
)


def _country(cell: str) -> str:
    code = cell.upper()
    if code == "WORLD" or (len(code) == 3 and code.isalpha()):
        return code
    raise cd.CellError(f"expected an ISO 3166-1 alpha-3 code like 'USA' (or WORLD), got '{cell}'")


def _currency(cell: str) -> str:
    code = cell.upper()
    if len(code) == 3 and code.isalpha():
        return code
    raise cd.CellError(f"expected an ISO 4217 code like 'USD' or 'CNY', got '{cell}'")


_TFLOPS = tuple(
    cd.Column(f"{dtype}_tflops", f"{dtype}_tflops", cd.positive)
    for dtype in ("fp32", "tf32", "bf16", "fp16", "fp8")
)

GPU_COLUMNS = (
    cd.Column("name", "name", cd.text, required=True),
    cd.Column("aliases", "aliases", cd.name_list, default=()),
    cd.Column("vendor", "vendor", cd.text, required=True),
    cd.Column("architecture", "architecture", cd.text, required=True),
    cd.Column("compute_capability", "compute_capability", cd.text),
    cd.Column("memory_gib", "memory_gib", cd.positive, required=True),
    cd.Column("memory_bandwidth_gbps", "memory_bandwidth_gbps", cd.positive, required=True),
    *_TFLOPS,
    cd.Column("link_kind", "link_kind", cd.one_of("nvlink", "infinity-fabric", "pcie")),
    cd.Column("link_gbps_per_direction", "link_gbps_per_direction", cd.positive),
    cd.Column("pcie_gen", "pcie_gen", cd.positive_int),
    cd.Column("tdp_w", "tdp_w", cd.positive, required=True),
    cd.Column("purchase_price_usd", "purchase_price_usd", cd.positive),
    *_SOURCE,
)

OFFER_COLUMNS = (
    cd.Column("provider", "provider", cd.text, required=True),
    cd.Column("region", "region", cd.text, required=True),
    cd.Column("zone", "zone", cd.text),
    cd.Column("instance_type", "instance_type", cd.text, required=True),
    cd.Column("gpu", "gpu", cd.text, required=True),
    cd.Column("gpu_count", "gpu_count", cd.positive_int, required=True),
    cd.Column("vcpus", "vcpus", cd.positive_int, required=True),
    cd.Column("ram_gib", "ram_gib", cd.positive, required=True),
    cd.Column("local_nvme_gb", "local_nvme_gb", cd.non_negative),
    cd.Column("network_gbps", "network_gbps", cd.positive),
    cd.Column("currency", "currency", _currency, default="USD"),
    # Prices are in `currency` here; _finish_offer converts them to USD.
    cd.Column("price_per_hour", "price_usd_per_hour", cd.non_negative, required=True),
    cd.Column("spot_per_hour", "spot_usd_per_hour", cd.non_negative),
    cd.Column("reserved_1y_per_hour", "reserved_usd_per_hour", cd.non_negative),
    cd.Column("interruption_band", "interruption_band", cd.one_of(*INTERRUPTION_BANDS)),
    *_SOURCE,
)

REGION_COLUMNS = (
    cd.Column("provider", "provider", cd.text, required=True),
    cd.Column("region", "region", cd.text, required=True),
    cd.Column("country", "country", _country, required=True),
    cd.Column("location", "location", cd.text, default=""),
    cd.Column("gco2e_per_kwh", "gco2e_per_kwh", cd.non_negative),
    *_SOURCE,
)

GRID_COLUMNS = (
    cd.Column("country", "country", _country, required=True),
    cd.Column("name", "name", cd.text, default=""),
    cd.Column("gco2e_per_kwh", "gco2e_per_kwh", cd.non_negative, required=True),
    *_SOURCE,
)

PUE_COLUMNS = (
    cd.Column("provider", "provider", cd.text, required=True),
    cd.Column("pue", "pue", cd.at_least_one, required=True),
    *_SOURCE,
)

RATE_COLUMNS = (
    cd.Column("currency", "currency", _currency, required=True),
    cd.Column("usd_per_unit", "usd_per_unit", cd.positive, required=True),
    *_SOURCE,
)


@dataclass(frozen=True)
class FileKind:
    """One kind of catalog file: its columns, how it is recognised, and its key."""

    name: str
    columns: tuple[cd.Column, ...]
    record: type
    signature: frozenset[str]
    """Columns whose presence in a header identifies this kind (checked in KINDS order)."""
    key_fields: tuple[str, ...]
    """Fields whose values, folded by `fold`, identify a row (a later row replaces)."""
    fold: Callable[[str], str] = str.casefold


KINDS = (
    FileKind(
        "offers",
        OFFER_COLUMNS,
        Offer,
        frozenset({"provider", "region", "instance_type", "gpu"}),
        ("provider", "region", "instance_type"),
    ),
    FileKind(
        "gpus", GPU_COLUMNS, GPUSpec, frozenset({"name", "vendor"}), ("name",), normalize_gpu_name
    ),
    FileKind(
        "regions",
        REGION_COLUMNS,
        Region,
        frozenset({"provider", "region", "country"}),
        ("provider", "region"),
    ),
    FileKind(
        "grid_intensity",
        GRID_COLUMNS,
        GridIntensity,
        frozenset({"country", "gco2e_per_kwh"}),
        ("country",),
        str.upper,
    ),
    FileKind("pue", PUE_COLUMNS, ProviderPUE, frozenset({"provider", "pue"}), ("provider",)),
    FileKind(
        "exchange_rates",
        RATE_COLUMNS,
        ExchangeRate,
        frozenset({"currency", "usd_per_unit"}),
        ("currency",),
        str.upper,
    ),
    FileKind(
        "achievable",
        ACHIEVABLE_COLUMNS,
        AchievableRate,
        frozenset({"kernel", "compute_fraction", "bandwidth_fraction"}),
        ("key", "kernel", "dtype", "layout"),
    ),
)
KIND_NAMES = tuple(kind.name for kind in KINDS)
_KIND = {kind.name: kind for kind in KINDS}


def detect_kind(table: cd.RawTable) -> FileKind:
    """The kind whose signature columns the header has; DataError if none."""
    header = set(table.header)
    for kind in KINDS:
        if kind.signature <= header:
            return kind
    if {"InstanceType", "AcceleratorName"} <= header:
        problem = "a SkyPilot vms.csv; import it with `cloudtrain catalog import-skypilot PATH`"
    else:
        expected = "; ".join(f"{k.name}: {', '.join(sorted(k.signature))}" for k in KINDS)
        problem = f"header matches no catalog file kind (expected columns of one of: {expected})"
    raise DataError(table.path, problem, line=table.header_line)


# ---------------------------------------------------------------- parsing


@dataclass
class _Merged:
    """Rows by key (a replaced row keeps its place), and where each came from."""

    rows: dict[Any, Any] = field(default_factory=dict)
    origin: dict[Any, tuple[str, int]] = field(default_factory=dict)
    """Kept for GPUs only (alias clashes are found after merging)."""

    def put_all(self, kind: FileKind, values: dict[str, list[Any]], table: cd.RawTable) -> None:
        """Add a table's rows, built from its parsed columns."""
        folded = [list(map(kind.fold, values[name])) for name in kind.key_fields]
        keys = folded[0] if len(folded) == 1 else list(zip(*folded, strict=True))
        if len(set(keys)) != len(keys):
            _duplicate(kind, keys, table)
        self.rows.update(zip(keys, _records(kind.record, values), strict=True))
        if kind.name == "gpus":
            self.origin.update(zip(keys, ((table.path, n) for n in table.lines), strict=True))


def _duplicate(kind: FileKind, keys: list[Any], table: cd.RawTable) -> None:
    first: dict[Any, int] = {}
    for key, line in zip(keys, table.lines, strict=True):
        if key in first:
            fields = ", ".join(kind.key_fields)
            problem = f"duplicate row: same {fields} as line {first[key]}"
            raise DataError(table.path, problem, line=line)
        first[key] = line


def _records(record: type, values: dict[str, list[Any]]) -> list[Any]:
    """Build one record per row from column lists (positional, in field order: fast)."""
    names = [f.name for f in dataclasses.fields(record)]
    return list(map(record, *(values[name] for name in names)))


def _merge(tables: list[cd.RawTable], kind: FileKind) -> _Merged:
    merged = _Merged()
    for table in tables:
        merged.put_all(kind, cd.parse_table(table, kind.columns, kind.name), table)
    return merged


def _check_aliases(gpus: _Merged) -> dict[str, GPUSpec]:
    try:
        return gpu_index(gpus.rows.values())
    except AliasClash as clash:
        key = normalize_gpu_name(clash.second.name)
        path, line = gpus.origin[key]
        raise DataError(path, str(clash), line=line, column="aliases") from None


class _OfferColumns:
    """Resolves offers' GPU names and converts their prices to USD, column by column."""

    def __init__(self, index: dict[str, GPUSpec], rates: dict[str, float]) -> None:
        self.index = index
        self.rates = rates
        self.choices = sorted({spec.name for spec in index.values()})

    def _gpu(self, raw: str) -> str:
        spec = self.index.get(normalize_gpu_name(raw))
        if spec is None:
            hint = did_you_mean(raw, self.choices)
            raise cd.CellError(f"unknown GPU '{raw}'{hint}", column="gpu")
        return spec.name

    def _rate(self, currency: str) -> float:
        rate = self.rates.get(currency)
        if rate is None:
            hint = did_you_mean(currency, self.rates)
            problem = f"no exchange rate for '{currency}'{hint} (add it to exchange_rates.csv)"
            raise cd.CellError(problem, column="currency")
        return rate

    def finish(self, table: cd.RawTable, values: dict[str, list[Any]]) -> dict[str, list[Any]]:
        """Offers of one table; DataError (file:line: column) on an unknown GPU or currency."""
        names: dict[str, str] = {}
        rates: dict[str, float] = {"USD": 1.0}
        for column, known, resolve in (("gpu", names, self._gpu), ("currency", rates, self._rate)):
            for raw in dict.fromkeys(values[column]):  # distinct values, first seen first
                if raw not in known:
                    try:
                        known[raw] = resolve(raw)
                    except cd.CellError as error:
                        line = table.lines[values[column].index(raw)]
                        raise DataError(
                            table.path, error.problem, line=line, column=column
                        ) from None
        values["gpu"] = list(map(names.__getitem__, values["gpu"]))
        if len(rates) > 1:
            factors = [rates[currency] for currency in values["currency"]]
            for price in ("price_usd_per_hour", "spot_usd_per_hour", "reserved_usd_per_hour"):
                values[price] = [
                    None if v is None else v if f == 1.0 else round(v * f, 6)
                    for v, f in zip(values[price], factors, strict=True)
                ]
        return values


def _merge_offers(tables: list[cd.RawTable], columns: _OfferColumns) -> _Merged:
    merged = _Merged()
    kind = _KIND["offers"]
    for table in tables:
        values = columns.finish(table, cd.parse_table(table, OFFER_COLUMNS, "offers"))
        merged.put_all(kind, values, table)
    return merged


def build_catalog(tables: Iterable[cd.RawTable], kinds: Iterable[str] = KIND_NAMES) -> Catalog:
    """Merge already-read tables into a Catalog; only `kinds` are parsed (others stay empty)."""
    wanted = set(kinds)
    by_kind: dict[str, list[cd.RawTable]] = {name: [] for name in KIND_NAMES}
    for table in tables:
        by_kind[detect_kind(table).name].append(table)
    gpus = _merge(by_kind["gpus"], _KIND["gpus"])
    index = _check_aliases(gpus)
    catalog = Catalog(gpus=list(gpus.rows.values()))
    rates = _merge(by_kind["exchange_rates"], _KIND["exchange_rates"])
    catalog.exchange_rates = list(rates.rows.values())
    if "offers" in wanted:
        usd_per_unit = {"USD": 1.0, **{r.currency: r.usd_per_unit for r in catalog.exchange_rates}}
        offers = _merge_offers(by_kind["offers"], _OfferColumns(index, usd_per_unit))
        catalog.offers = list(offers.rows.values())
    pairs = (("regions", "regions"), ("grid_intensity", "grid"), ("pue", "pue"))
    for name, attribute in (*pairs, ("achievable", "rates")):
        if name in wanted:
            setattr(catalog, attribute, list(_merge(by_kind[name], _KIND[name]).rows.values()))
    return catalog


def load_catalog(
    extra_paths: Iterable[str | Path] = (),
    include_user: bool = True,
    *,
    kinds: Iterable[str] = KIND_NAMES,
    use_cache: bool = True,
) -> Catalog:
    """The bundled catalog merged with the user's CSVs and then `extra_paths`.

    `include_user=False` skips `$CLOUDTRAIN_HOME/catalog`. `kinds` limits parsing to
    some file kinds (GPUs and exchange rates are always parsed: offers need them).
    Large catalogs are cached between runs (see `catalog.cache`) unless `use_cache`
    is False. Raises DataError (file:line: column) on malformed data.
    """
    wanted = set(kinds)
    chosen = tuple(name for name in KIND_NAMES if name in wanted)
    sources = catalog_sources(extra_paths, include_user)
    key = cache.key_for(sources, chosen) if use_cache else None
    if key is not None:
        cached = cache.load(key)
        if cached is not None:
            return cached
    catalog = build_catalog((source.read() for source in sources), chosen)
    if key is not None:
        cache.store(key, catalog)
    return catalog


_default: dict[tuple, Catalog] = {}


def _user_state() -> tuple:
    user_dir = paths.user_catalog_dir()
    if not user_dir.is_dir():
        return (str(user_dir),)
    files = csv_files(user_dir)
    return (str(user_dir), *((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files))


def default_catalog() -> Catalog:
    """`load_catalog()` cached in memory until the user's catalog directory changes."""
    state = _user_state()
    found = _default.get(state)
    if found is None:
        _default.clear()
        found = _default[state] = load_catalog()
    return found
