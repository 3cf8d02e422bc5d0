"""Catalog loaders: typed rows, merging the user's CSVs, exact error places, the cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cloudtrain.catalog import cache, load_catalog
from cloudtrain.catalog.csvdata import read_table
from cloudtrain.catalog.loader import KIND_NAMES, build_catalog, detect_kind
from cloudtrain.catalog.types import Offer
from cloudtrain.errors import DataError, UserError

GPU_HEADER = (
    "name,aliases,vendor,architecture,compute_capability,memory_gib,memory_bandwidth_gbps,"
    "fp32_tflops,tf32_tflops,bf16_tflops,fp16_tflops,fp8_tflops,link_kind,"
    "link_gbps_per_direction,pcie_gen,tdp_w,purchase_price_usd,source,as_of"
)
GPUS = "\n".join(
    [
        "# two GPUs for tests",
        GPU_HEADER,
        "# Turing: no BF16, no TF32",
        "T4,Tesla T4|NVIDIA T4,nvidia,turing,7.5,16,320,8.1,,,65,,pcie,15.75,3,70,,"
        "T4 datasheet,2025-06-01",
        "",
        "H100-SXM,NVIDIA H100 80GB HBM3|H100,nvidia,hopper,9.0,80,3350,67,494.5,989,989,1979,"
        "nvlink,450,5,700,30000,H100 datasheet,2025-06-01",
        "",
    ]
)
OFFER_HEADER = (
    "provider,region,zone,instance_type,gpu,gpu_count,vcpus,ram_gib,local_nvme_gb,network_gbps,"
    "currency,price_per_hour,spot_per_hour,reserved_1y_per_hour,interruption_band,source,as_of"
)
OFFERS = f"""{OFFER_HEADER}
aws,us-east-1,,g4dn.xlarge,T4,1,4,16,125,25,USD,0.526,0.2209,0.331,<5%,AWS pricing,2025-06-01
aws,us-east-1,,p5.48xlarge,H100,8,192,2048,30400,3200,USD,55.04,19.66,,10-15%,AWS pricing,2025-06-01
alibaba,cn-beijing,,ecs.gn6i-c4g1.xlarge,Tesla T4,1,4,15,,4,CNY,10.0,3.0,,,Alibaba,2025-06-01
"""
RATES = """currency,usd_per_unit,source,as_of
CNY,0.138,central bank reference rate,2025-06-01
"""
REGIONS = """provider,region,country,location,gco2e_per_kwh,source,as_of
aws,us-east-1,USA,N. Virginia,,AWS regions,2025-06-01
gcp,europe-west4,NLD,Eemshaven,282,GCP carbon data,2025-06-01
"""
GRID = """country,name,gco2e_per_kwh,source,as_of
USA,United States,369,OWID 2023,2025-06-01
WORLD,World,475,OWID 2023,2025-06-01
"""
PUE = """provider,pue,source,as_of
gcp,1.10,GCP environmental report,2025-06-01
"""


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text)
    return path


@pytest.fixture
def small(tmp_path: Path) -> Path:
    """A complete small catalog directory."""
    folder = tmp_path / "small"
    for name, text in [
        ("gpus.csv", GPUS),
        ("offers.csv", OFFERS),
        ("exchange_rates.csv", RATES),
        ("regions.csv", REGIONS),
        ("grid.csv", GRID),
        ("pue.csv", PUE),
    ]:
        write(folder, name, text)
    return folder


def load_only(*paths: Path):
    """A catalog from these files alone (no bundled data, no user directory)."""
    return build_catalog(read_table(p) for path in paths for p in sorted(Path(path).glob("*.csv")))


# ---------------------------------------------------------------- typed rows


def test_gpu_rows_are_typed_with_none_for_empty_cells(small: Path):
    catalog = load_only(small)
    t4, h100 = catalog.gpus
    assert t4.name == "T4" and t4.aliases == ("Tesla T4", "NVIDIA T4")
    assert t4.bf16_tflops is None and t4.tf32_tflops is None and t4.fp8_tflops is None
    assert t4.fp16_tflops == 65.0 and t4.pcie_gen == 3 and t4.purchase_price_usd is None
    assert h100.bf16_tflops == 989.0 and h100.purchase_price_usd == 30000.0
    assert h100.source == "H100 datasheet" and h100.as_of == "2025-06-01"


def test_offer_rows_resolve_gpu_aliases_and_convert_currency(small: Path):
    offers = {o.instance_type: o for o in load_only(small).offers}
    p5 = offers["p5.48xlarge"]
    assert p5.gpu == "H100-SXM" and p5.gpu_count == 8 and p5.interruption_band == "10-15%"
    assert p5.reserved_usd_per_hour is None and p5.zone is None
    alibaba = offers["ecs.gn6i-c4g1.xlarge"]
    assert alibaba.gpu == "T4"
    assert alibaba.currency == "CNY"
    assert alibaba.price_usd_per_hour == pytest.approx(1.38)
    assert alibaba.spot_usd_per_hour == pytest.approx(0.414)
    assert alibaba.local_nvme_gb is None


def test_regions_grid_and_pue_rows(small: Path):
    catalog = load_only(small)
    assert catalog.regions[0].gco2e_per_kwh is None and catalog.regions[1].gco2e_per_kwh == 282
    assert [g.country for g in catalog.grid] == ["USA", "WORLD"]
    assert catalog.pue[0].pue == pytest.approx(1.10)
    assert catalog.exchange_rates[0].usd_per_unit == pytest.approx(0.138)


def test_kind_is_recognised_from_the_header_not_the_file_name(tmp_path: Path):
    path = write(tmp_path, "my_prices.csv", RATES)
    assert detect_kind(read_table(path)).name == "exchange_rates"
    path = write(tmp_path, "whatever.csv", REGIONS)
    assert detect_kind(read_table(path)).name == "regions"


def test_optional_columns_may_be_left_out_of_user_files(small: Path, tmp_path: Path):
    lean = write(
        tmp_path / "lean",
        "onprem.csv",
        "provider,region,instance_type,gpu,gpu_count,vcpus,ram_gib,price_per_hour\n"
        "onprem,lab-1,dgx-a,H100,8,224,2048,12.5\n",
    )
    offer = load_only(small, lean.parent).offers[-1]
    assert offer == Offer("onprem", "lab-1", "dgx-a", "H100-SXM", 8, 224, 2048.0, 12.5)


def test_bundled_catalog_loads_with_every_kind():
    catalog = load_catalog(include_user=False)
    assert len(catalog.gpus) >= 15 and len(catalog.offers) >= 60
    assert catalog.regions and catalog.grid and catalog.pue and catalog.exchange_rates
    assert {g.name for g in catalog.gpus} >= {o.gpu for o in catalog.offers}
    assert all(o.price_usd_per_hour >= 0 for o in catalog.offers)
    assert KIND_NAMES == (
        "offers",
        "gpus",
        "regions",
        "grid_intensity",
        "pue",
        "exchange_rates",
        "achievable",
    )
    assert catalog.rates


# ---------------------------------------------------------------- overrides


def test_user_directory_rows_replace_by_key_and_extend(cloudtrain_home: Path):
    bundled = load_catalog(include_user=False)
    target = next(o for o in bundled.offers if o.provider == "aws")
    user = cloudtrain_home / "catalog"
    write(
        user,
        "negotiated.csv",
        f"{OFFER_HEADER}\n"
        f"AWS,{target.region.upper()},,{target.instance_type},{target.gpu},{target.gpu_count},"
        f"{target.vcpus},{target.ram_gib},,,USD,0.01,,,,our contract,2025-07-01\n"
        f"onprem,lab-1,,dgx-h100,H100,8,224,2048,,,USD,9.5,,,,our cluster,2025-07-01\n",
    )
    merged = load_catalog()
    assert len(merged.offers) == len(bundled.offers) + 1
    replaced = [o for o in merged.offers if o.instance_type == target.instance_type]
    replaced = [o for o in replaced if o.region.lower() == target.region.lower()]
    assert [o.price_usd_per_hour for o in replaced if o.provider.lower() == "aws"] == [0.01]
    assert any(o.provider == "onprem" for o in merged.offers)
    assert len(load_catalog(include_user=False).offers) == len(bundled.offers)


def test_catalog_path_overrides_user_rows_and_adds_gpus(cloudtrain_home: Path, tmp_path: Path):
    write(
        cloudtrain_home / "catalog",
        "a.csv",
        f"{OFFER_HEADER}\nonprem,lab-1,,box,T4,1,4,16,,,USD,1.0,,,,user dir,2025-07-01\n",
    )
    extra = write(
        tmp_path / "extra",
        "mine.csv",
        f"{OFFER_HEADER}\nonprem,lab-1,,box,NewGPU,2,8,32,,,USD,2.0,,,,flag,2025-07-01\n",
    )
    write(
        tmp_path / "extra",
        "new_gpu.csv",
        f"{GPU_HEADER}\nNewGPU,Lab GPU 9000,acme,future,,64,2000,50,,400,400,,pcie,63,5,500,,"
        "vendor sheet,2025-07-01\n",
    )
    catalog = load_catalog(extra_paths=[extra.parent])
    box = [o for o in catalog.offers if o.instance_type == "box"]
    assert len(box) == 1 and box[0].gpu == "NewGPU" and box[0].price_usd_per_hour == 2.0
    assert catalog.gpu("lab gpu 9000").name == "NewGPU"
    with pytest.raises(DataError, match=r"mine.csv:2: column 'gpu': unknown GPU 'NewGPU'"):
        load_catalog(extra_paths=[extra])  # the file alone: its GPU is not known


def test_catalog_path_that_does_not_exist_is_a_user_error(tmp_path: Path):
    with pytest.raises(UserError, match="no such file or directory"):
        load_catalog(extra_paths=[tmp_path / "missing.csv"])


# ---------------------------------------------------------------- bad data


def bad_offer(tmp_path: Path, row: str, header: str = OFFER_HEADER) -> DataError:
    good = "aws,us-east-1,,g4dn.xlarge,T4,1,4,16,,,USD,0.526,,,,x,2025-06-01"
    path = write(tmp_path / "bad", "offers.csv", f"# comment\n{header}\n{good}\n\n{row}\n")
    gpus = write(tmp_path / "bad_gpus", "gpus.csv", GPUS)
    with pytest.raises(DataError) as caught:
        build_catalog([read_table(gpus), read_table(path)])
    return caught.value


@pytest.mark.parametrize(
    ("row", "column", "problem"),
    [
        (
            "aws,us-east-1,,g4dn.2xlarge,T4,x,8,32,,,USD,0.75,,,,x,2025-06-01",
            "gpu_count",
            "expected a positive integer, got 'x'",
        ),
        (
            "aws,us-east-1,,g4dn.2xlarge,T4,0,8,32,,,USD,0.75,,,,x,2025-06-01",
            "gpu_count",
            "expected a positive integer, got '0'",
        ),
        (
            "aws,us-east-1,,g4dn.2xlarge,T4,1,8,32,,,USD,-1,,,,x,2025-06-01",
            "price_per_hour",
            "expected a number >= 0, got '-1'",
        ),
        (
            "aws,us-east-1,,g4dn.2xlarge,T4,1,8,32,,,USD,,,,,x,2025-06-01",
            "price_per_hour",
            "value is missing",
        ),
        (
            "aws,us-east-1,,g4dn.2xlarge,T4,1,8,32,,,USD,0.75,,,often,x,2025-06-01",
            "interruption_band",
            "expected one of <5%, 5-10%, 10-15%, 15-20%, >20%, got 'often'",
        ),
        (
            "aws,us-east-1,,g4dn.2xlarge,T4,1,8,32,,,USD,0.75,,,,x,1 June 2025",
            "as_of",
            "expected an ISO date YYYY-MM-DD, got '1 June 2025'",
        ),
        (
            "aws,us-east-1,,g4dn.2xlarge,H10,1,8,32,,,USD,0.75,,,,x,2025-06-01",
            "gpu",
            "unknown GPU 'H10'; did you mean",
        ),
        (
            "aws,us-east-1,,g4dn.2xlarge,T4,1,8,32,,,EUR,0.75,,,,x,2025-06-01",
            "currency",
            "no exchange rate for 'EUR'",
        ),
    ],
)
def test_bad_cell_names_file_line_and_column(tmp_path: Path, row: str, column: str, problem: str):
    error = bad_offer(tmp_path, row)
    assert error.line == 5 and error.column == column
    assert str(error).startswith(f"{tmp_path / 'bad' / 'offers.csv'}:5: column '{column}': ")
    assert problem in str(error)
    assert "\n" not in str(error)


def test_unknown_gpu_suggests_the_close_name(tmp_path: Path):
    error = bad_offer(tmp_path, "aws,us-east-1,,p5,H100-SMX,8,192,2048,,,USD,55,,,,x,2025-06-01")
    assert "did you mean H100-SXM?" in str(error)


def test_wrong_cell_count_and_unknown_column(tmp_path: Path):
    error = bad_offer(tmp_path, "aws,us-east-1,,g4dn.2xlarge,T4,1")
    assert error.line == 5 and "expected 17 cells as in the header, got 6" in str(error)
    error = bad_offer(tmp_path, "x", header=OFFER_HEADER.replace("spot_per_hour", "spot_price"))
    assert error.line == 2 and "unknown column 'spot_price'" in str(error)
    assert "for offers.csv; did you mean" in str(error) and "spot_per_hour?" in str(error)


def test_the_earliest_bad_cell_is_reported(tmp_path: Path):
    rows = [
        "aws,r,,a,T4,1,4,16,,,USD,0.5,,,,x,bad-date",
        "aws,r,,b,T4,x,4,16,,,USD,0.5,,,,x,2025-06-01",
    ]
    error = bad_offer(tmp_path, "\n".join(rows))
    assert (error.line, error.column) == (5, "as_of")


def test_duplicate_key_in_one_file_is_an_error(tmp_path: Path):
    row = "aws,us-east-1,,g4dn.xlarge,T4,1,4,16,,,USD,0.6,,,,x,2025-06-01"
    error = bad_offer(tmp_path, row)
    assert error.line == 5 and "same provider, region, instance_type as line 3" in str(error)


def test_unrecognised_header_and_alias_clash(tmp_path: Path):
    path = write(tmp_path, "notes.csv", "what,ever\n1,2\n")
    with pytest.raises(DataError, match=r"notes.csv:1: header matches no catalog file kind"):
        load_only(tmp_path)
    path.unlink()
    clash = GPUS + "T4-clone,T4,nvidia,turing,7.5,16,320,8.1,,,65,,pcie,15.75,3,70,,x,2025-06-01\n"
    write(tmp_path, "gpus.csv", clash)
    with pytest.raises(DataError, match=r"gpus.csv:7: column 'aliases': 'T4' names both"):
        load_only(tmp_path)


# ---------------------------------------------------------------- cache


def test_large_catalogs_are_cached_until_a_source_changes(
    tmp_path: Path, cloudtrain_home: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(cache, "MIN_BYTES", 1)
    extra = write(tmp_path / "x", "offers.csv", f"{OFFER_HEADER}\n" + OFFERS.split("\n", 1)[1])
    write(tmp_path / "x", "rates.csv", RATES)
    first = load_catalog(extra_paths=[extra.parent])
    assert len(list((cloudtrain_home / "cache").glob("catalog-*.pickle"))) == 1
    again = load_catalog(extra_paths=[extra.parent])
    assert again == first and again is not first
    text = extra.read_text().replace("55.04", "50.00")
    extra.write_text(text)
    os.utime(extra, ns=(extra.stat().st_atime_ns, extra.stat().st_mtime_ns + 10**9))
    changed = load_catalog(extra_paths=[extra.parent])
    p5 = [o for o in changed.offers if (o.region, o.instance_type) == ("us-east-1", "p5.48xlarge")]
    assert [o.price_usd_per_hour for o in p5] == [50.0]
    for stale in (cloudtrain_home / "cache").glob("catalog-*.pickle"):
        stale.write_bytes(b"not a pickle")
    assert load_catalog(extra_paths=[extra.parent]) == changed


def test_blanks_around_cells_are_ignored(small: Path, tmp_path: Path):
    spaced = write(
        tmp_path / "spaced",
        "offers.csv",
        "provider, region ,instance_type,gpu,gpu_count,vcpus,ram_gib,price_per_hour\n"
        "onprem , lab-1,  box , T4 , 2 ,8,32, 1.5 \n",
    )
    offer = load_only(small, spaced.parent).offers[-1]
    assert (offer.provider, offer.region, offer.instance_type, offer.gpu) == (
        "onprem",
        "lab-1",
        "box",
        "T4",
    )
    assert (offer.gpu_count, offer.price_usd_per_hour) == (2, 1.5)


def test_a_skypilot_file_in_the_catalog_directory_says_how_to_import_it(cloudtrain_home: Path):
    vms = Path(__file__).parent / "fixtures" / "skypilot" / "catalogs" / "v7" / "aws" / "vms.csv"
    write(cloudtrain_home / "catalog", "vms.csv", vms.read_text())
    with pytest.raises(DataError, match=r"vms.csv:1: a SkyPilot vms.csv; import it with"):
        load_catalog()
