"""Invariants of the bundled catalog CSVs, checked with the csv module alone (not the loader).

They fail when a data edit breaks the schema in catalog/data/README.md or a cross-file
reference: an offer naming an unknown GPU or region, a region in a country without a grid
intensity, a spot price above on-demand, a sparsity figure that makes BF16 exceed FP8, an
alias shared by two GPUs, and so on.
"""

from __future__ import annotations

import csv
import datetime as dt
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

DATA_DIR = Path(__file__).resolve().parents[1] / "src" / "cloudtrain" / "catalog" / "data"

HEADERS = {
    "gpus.csv": (
        "name,aliases,vendor,architecture,compute_capability,memory_gib,memory_bandwidth_gbps,"
        "fp32_tflops,tf32_tflops,bf16_tflops,fp16_tflops,fp8_tflops,link_kind,"
        "link_gbps_per_direction,pcie_gen,tdp_w,purchase_price_usd,source,as_of"
    ),
    "offers.csv": (
        "provider,region,zone,instance_type,gpu,gpu_count,vcpus,ram_gib,local_nvme_gb,network_gbps,"
        "currency,price_per_hour,spot_per_hour,reserved_1y_per_hour,interruption_band,source,as_of"
    ),
    "regions.csv": "provider,region,country,location,gco2e_per_kwh,source,as_of",
    "grid_intensity.csv": "country,name,gco2e_per_kwh,source,as_of",
    "pue.csv": "provider,pue,source,as_of",
    "exchange_rates.csv": "currency,usd_per_unit,source,as_of",
}

# Columns that must parse as numbers when not empty, and those that must be present.
FLOAT_COLUMNS = {
    "gpus.csv": [
        "compute_capability",
        "memory_gib",
        "memory_bandwidth_gbps",
        "fp32_tflops",
        "tf32_tflops",
        "bf16_tflops",
        "fp16_tflops",
        "fp8_tflops",
        "link_gbps_per_direction",
        "tdp_w",
        "purchase_price_usd",
    ],
    "offers.csv": [
        "ram_gib",
        "local_nvme_gb",
        "network_gbps",
        "price_per_hour",
        "spot_per_hour",
        "reserved_1y_per_hour",
    ],
    "regions.csv": ["gco2e_per_kwh"],
    "grid_intensity.csv": ["gco2e_per_kwh"],
    "pue.csv": ["pue"],
    "exchange_rates.csv": ["usd_per_unit"],
}
INT_COLUMNS = {"gpus.csv": ["pcie_gen"], "offers.csv": ["gpu_count", "vcpus"]}
REQUIRED = {
    "gpus.csv": ["name", "vendor", "architecture", "memory_gib", "memory_bandwidth_gbps", "tdp_w"],
    "offers.csv": [
        "provider",
        "region",
        "instance_type",
        "gpu",
        "gpu_count",
        "vcpus",
        "ram_gib",
        "currency",
        "price_per_hour",
    ],
    "regions.csv": ["provider", "region", "country"],
    "grid_intensity.csv": ["country", "name", "gco2e_per_kwh"],
    "pue.csv": ["provider", "pue"],
    "exchange_rates.csv": ["currency", "usd_per_unit"],
}
KEYS = {
    "gpus.csv": ("name",),
    "offers.csv": ("provider", "region", "instance_type"),
    "regions.csv": ("provider", "region"),
    "grid_intensity.csv": ("country",),
    "pue.csv": ("provider",),
    "exchange_rates.csv": ("currency",),
}

REQUIRED_GPUS = [
    "T4",
    "A10G",
    "L4",
    "L40S",
    "RTX-A6000",
    "RTX-4090",
    "V100-16GB",
    "V100-32GB",
    "A30",
    "A100-40GB",
    "A100-80GB",
    "H100-SXM",
    "H100-PCIe",
    "H200",
    "B200",
    "MI250X",
    "MI300X",
]

# Exact strings torch.cuda.get_device_name() / nvidia-smi / rocm-smi print, and SkyPilot accelerator
# names, with the row each must resolve to.
DEVICE_NAMES = {
    "Tesla T4": "T4",
    "NVIDIA A10G": "A10G",
    "NVIDIA A10": "A10",
    "NVIDIA L4": "L4",
    "NVIDIA L40S": "L40S",
    "NVIDIA RTX A6000": "RTX-A6000",
    "NVIDIA GeForce RTX 4090": "RTX-4090",
    "Tesla V100-SXM2-16GB": "V100-16GB",
    "Tesla V100-SXM2-32GB": "V100-32GB",
    "Tesla V100-PCIE-16GB": "V100-PCIe-16GB",
    "NVIDIA A30": "A30",
    "NVIDIA A100-SXM4-40GB": "A100-40GB",
    "NVIDIA A100-PCIE-40GB": "A100-40GB-PCIe",
    "NVIDIA A100-SXM4-80GB": "A100-80GB",
    "NVIDIA A100 80GB PCIe": "A100-80GB-PCIe",
    "NVIDIA H100 80GB HBM3": "H100-SXM",
    "NVIDIA H100 PCIe": "H100-PCIe",
    "NVIDIA H100 NVL": "H100-NVL",
    "NVIDIA H200": "H200",
    "NVIDIA B200": "B200",
    "AMD Instinct MI250X": "MI250X",
    "AMD Instinct MI300X": "MI300X",
}
SKYPILOT_NAMES = {
    "T4": "T4",
    "A10G": "A10G",
    "L4": "L4",
    "L40S": "L40S",
    "A6000": "RTX-A6000",
    "RTX4090": "RTX-4090",
    "V100": "V100-16GB",
    "V100-32GB": "V100-32GB",
    "A30": "A30",
    "A100": "A100-40GB",
    "A100-80GB": "A100-80GB",
    "H100": "H100-SXM",
    "H200": "H200",
    "B200": "B200",
    "MI300X": "MI300X",
}

INTERRUPTION_BANDS = {"<5%", "5-10%", "10-15%", "15-20%", ">20%"}
LINK_KINDS = {"nvlink", "infinity-fabric", "pcie"}
# facts.md figures the carbon model is calibrated against.
FACTS_GRID = {"USA": 369, "DEU": 381, "FRA": 56, "NOR": 30, "CHN": 582, "IND": 713, "WORLD": 475}


@cache
def read(filename: str) -> tuple[list[str], list[dict[str, str]]]:
    """Header and rows of a data file, skipping `#` comment lines and blank lines."""
    with (DATA_DIR / filename).open(encoding="utf-8", newline="") as handle:
        lines = [line for line in handle if line.strip() and not line.lstrip().startswith("#")]
    reader = csv.DictReader(lines)
    rows = list(reader)
    return list(reader.fieldnames or []), rows


def num(value: str) -> float | None:
    return float(value) if value.strip() else None


def gpus_by_name() -> dict[str, dict[str, str]]:
    return {row["name"]: row for row in read("gpus.csv")[1]}


@pytest.mark.parametrize("filename", sorted(HEADERS))
def test_header_matches_schema(filename: str) -> None:
    header, _ = read(filename)
    assert header == HEADERS[filename].split(",")


@pytest.mark.parametrize("filename", sorted(HEADERS))
def test_every_row_is_complete_sourced_and_dated(filename: str) -> None:
    header, rows = read(filename)
    assert rows, f"{filename} has no rows"
    today = dt.date.today()
    for line, row in enumerate(rows, start=2):
        where = f"{filename} data row {line} ({row.get(header[0])})"
        assert None not in row and all(v is not None for v in row.values()), (
            f"{where}: wrong column count"
        )
        assert row["source"].strip(), f"{where}: empty source"
        try:
            as_of = dt.date.fromisoformat(row["as_of"])
        except ValueError:
            pytest.fail(f"{where}: as_of {row['as_of']!r} is not an ISO date")
        assert dt.date(2015, 1, 1) <= as_of <= today, f"{where}: implausible as_of {as_of}"
        for column in REQUIRED[filename]:
            assert row[column].strip(), f"{where}: {column} is empty"
        for column in FLOAT_COLUMNS[filename]:
            value = num(row[column])
            assert value is None or value >= 0, f"{where}: {column} is negative"
        for column in INT_COLUMNS.get(filename, []):
            if row[column].strip():
                assert int(row[column]) > 0, f"{where}: {column} must be a positive integer"


@pytest.mark.parametrize("filename", sorted(KEYS))
def test_keys_are_unique(filename: str) -> None:
    _, rows = read(filename)
    keys = Counter(tuple(row[k] for k in KEYS[filename]) for row in rows)
    assert [key for key, count in keys.items() if count > 1] == []


def test_required_gpus_present() -> None:
    assert set(REQUIRED_GPUS) - set(gpus_by_name()) == set()


def test_gpu_fields_are_sane() -> None:
    for name, row in gpus_by_name().items():
        assert row["link_kind"] in LINK_KINDS, name
        assert row["vendor"] in {"nvidia", "amd"}, name
        if row["vendor"] == "nvidia":
            assert row["compute_capability"], f"{name}: NVIDIA GPUs have a compute capability"
        assert num(row["fp32_tflops"]) is not None, f"{name}: every GPU has an FP32 rate"
        assert num(row["bf16_tflops"]) or num(row["fp16_tflops"]), f"{name}: no 16-bit rate"


def test_peaks_are_dense_and_ordered() -> None:
    """Mixing a sparsity figure into one column breaks these orderings."""
    for name, row in gpus_by_name().items():
        fp32, tf32 = num(row["fp32_tflops"]), num(row["tf32_tflops"])
        bf16, fp16, fp8 = num(row["bf16_tflops"]), num(row["fp16_tflops"]), num(row["fp8_tflops"])
        if fp32 is not None and tf32 is not None:
            assert fp32 <= tf32, name
        if tf32 is not None and bf16 is not None:
            assert tf32 <= bf16, name
        if bf16 is not None and fp16 is not None:
            assert bf16 == fp16, (
                f"{name}: dense BF16 and FP16 tensor rates are equal on these parts"
            )
        if bf16 is not None and fp8 is not None:
            assert bf16 <= fp8, name


def test_known_dense_peaks() -> None:
    gpus = gpus_by_name()
    assert num(gpus["H100-SXM"]["bf16_tflops"]) == 989
    assert num(gpus["H100-SXM"]["fp8_tflops"]) == 1979
    assert num(gpus["A100-80GB"]["bf16_tflops"]) == 312
    assert num(gpus["RTX-4090"]["bf16_tflops"]) == 165.2
    assert num(gpus["V100-16GB"]["bf16_tflops"]) is None
    assert num(gpus["T4"]["fp8_tflops"]) is None


def test_variants_differ_where_they_should() -> None:
    gpus = gpus_by_name()
    sxm, pcie = gpus["A100-80GB"], gpus["A100-80GB-PCIe"]
    assert (num(sxm["tdp_w"]), num(pcie["tdp_w"])) == (400, 300)
    assert num(pcie["memory_bandwidth_gbps"]) == 1935
    assert pcie["link_kind"] == "pcie" and sxm["link_kind"] == "nvlink"


def test_aliases_are_unique_and_never_another_rows_name() -> None:
    gpus = gpus_by_name()
    owner: dict[str, str] = {name.lower(): name for name in gpus}
    for name, row in gpus.items():
        for alias in filter(None, (a.strip() for a in row["aliases"].split("|"))):
            key = alias.lower()
            assert owner.get(key, name) == name, f"alias {alias!r} on {name} and {owner.get(key)}"
            owner[key] = name


@pytest.mark.parametrize(
    ("printed", "expected"), sorted({**DEVICE_NAMES, **SKYPILOT_NAMES}.items())
)
def test_device_and_skypilot_names_are_aliases_of_the_right_row(
    printed: str, expected: str
) -> None:
    row = gpus_by_name()[expected]
    aliases = {a.strip() for a in row["aliases"].split("|")} | {row["name"]}
    assert printed in aliases


def test_offer_references_resolve() -> None:
    gpus = set(gpus_by_name())
    regions = {(r["provider"], r["region"]) for r in read("regions.csv")[1]}
    currencies = {r["currency"] for r in read("exchange_rates.csv")[1]}
    pue = {r["provider"] for r in read("pue.csv")[1]}
    for row in read("offers.csv")[1]:
        where = f"offer {row['provider']}/{row['region']}/{row['instance_type']}"
        assert row["gpu"] in gpus, f"{where}: unknown GPU {row['gpu']}"
        assert (row["provider"], row["region"]) in regions, f"{where}: region not in regions.csv"
        assert row["currency"] in currencies, f"{where}: no exchange rate for {row['currency']}"
        assert row["provider"] in pue, f"{where}: provider has no PUE"
        assert row["interruption_band"] in INTERRUPTION_BANDS | {""}, where


def test_offer_prices_are_ordered() -> None:
    for row in read("offers.csv")[1]:
        where = f"offer {row['provider']}/{row['region']}/{row['instance_type']}"
        on_demand = float(row["price_per_hour"])
        assert on_demand > 0, where
        spot, reserved = num(row["spot_per_hour"]), num(row["reserved_1y_per_hour"])
        assert spot is None or 0 < spot < on_demand, f"{where}: spot {spot} vs {on_demand}"
        assert reserved is None or 0 < reserved < on_demand, f"{where}: reserved {reserved}"


def test_offer_coverage() -> None:
    rows = read("offers.csv")[1]
    assert len(rows) >= 60
    regions_per_provider: dict[str, set[str]] = {}
    for row in rows:
        regions_per_provider.setdefault(row["provider"], set()).add(row["region"])
    assert len(regions_per_provider) >= 6
    assert {"aws", "gcp", "azure", "lambda", "runpod", "alibaba"} <= set(regions_per_provider)
    thin = {p: r for p, r in regions_per_provider.items() if len(r) < 2}
    assert thin == {}, f"providers with fewer than 2 regions: {thin}"
    assert {r["currency"] for r in rows if r["provider"] == "alibaba"} == {"CNY"}
    assert all(r["spot_per_hour"] == "" for r in rows if r["provider"] == "lambda")


def test_every_used_region_has_a_row_and_every_region_a_country() -> None:
    used = {(r["provider"], r["region"]) for r in read("offers.csv")[1]}
    regions = read("regions.csv")[1]
    assert used <= {(r["provider"], r["region"]) for r in regions}
    countries = {r["country"] for r in read("grid_intensity.csv")[1]}
    for row in regions:
        assert row["country"] in countries, f"{row['provider']}/{row['region']}: {row['country']}"


def test_grid_intensity_matches_reference_figures() -> None:
    grid = {r["country"]: float(r["gco2e_per_kwh"]) for r in read("grid_intensity.csv")[1]}
    assert {country: grid.get(country) for country in FACTS_GRID} == FACTS_GRID
    assert all(len(c) == 3 and c.isupper() for c in grid if c != "WORLD")


def test_pue_and_exchange_rates_are_plausible() -> None:
    pue = {r["provider"]: float(r["pue"]) for r in read("pue.csv")[1]}
    assert "onprem" in pue
    assert all(1.0 <= value <= 2.5 for value in pue.values())
    rates = {r["currency"]: float(r["usd_per_unit"]) for r in read("exchange_rates.csv")[1]}
    assert rates["USD"] == 1.0
    assert 0.1 < rates["CNY"] < 0.2
