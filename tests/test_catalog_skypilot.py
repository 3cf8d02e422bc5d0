"""The SkyPilot catalog importer, on hand-written vms.csv files in SkyPilot's format."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cloudtrain.catalog import Catalog, Offer, find_offers, import_skypilot, load_catalog
from cloudtrain.catalog.skypilot import (
    SKIP_FRACTIONAL,
    SKIP_NO_ACCELERATOR,
    SKIP_NO_HOST,
    SKIP_NO_PRICE,
    SKIP_NOT_ATTACHABLE,
    SKIP_UNKNOWN,
    find_skypilot_files,
)
from cloudtrain.errors import DataError, UserError

CATALOGS = Path(__file__).parent / "fixtures" / "skypilot" / "catalogs"
V7 = CATALOGS / "v7"


@pytest.fixture(scope="module")
def gpus_only() -> Catalog:
    """The bundled GPUs without any offers: accelerator names map through aliases alone."""
    return Catalog(gpus=load_catalog(include_user=False, kinds=("gpus",)).gpus)


def imported(cloud: str, tmp_path: Path, catalog: Catalog) -> dict[tuple[str, str], Offer]:
    result = import_skypilot(V7 / cloud, dest_dir=tmp_path, catalog=catalog)
    (written,) = result.clouds
    offers = load_catalog(extra_paths=[written.output_file], include_user=False).offers
    source = f"SkyPilot catalog {V7 / cloud / 'vms.csv'}"
    return {(o.region, o.instance_type): o for o in offers if o.source == source}


def test_newest_version_and_every_cloud_are_found():
    found = find_skypilot_files(CATALOGS)
    assert [(cloud, path.parent.parent.name) for cloud, path in found] == [
        ("aws", "v7"),
        ("azure", "v7"),
        ("gcp", "v7"),
        ("lambda", "v7"),
    ]
    assert find_skypilot_files(V7 / "gcp") == [("gcp", V7 / "gcp" / "vms.csv")]
    assert find_skypilot_files(V7 / "gcp" / "vms.csv") == [("gcp", V7 / "gcp" / "vms.csv")]


def test_default_location_is_the_newest_sky_catalog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cloudtrain_home: Path, gpus_only: Catalog
):
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(UserError, match=r"no SkyPilot catalog at .*catalogs"):
        import_skypilot(catalog=gpus_only)
    shutil.copytree(CATALOGS, tmp_path / ".sky" / "catalogs")
    result = import_skypilot(catalog=gpus_only)
    assert set(result.offers_written) == {"aws", "azure", "gcp", "lambda"}
    written = sorted(p.name for p in (cloudtrain_home / "catalog").iterdir())
    assert written == [f"skypilot_{c}_offers.csv" for c in ("aws", "azure", "gcp", "lambda")]
    source = (cloudtrain_home / "catalog" / "skypilot_aws_offers.csv").read_text()
    assert "SkyPilot catalog ~/.sky/catalogs/v7/aws/vms.csv" in source


def test_aws_zones_collapse_to_the_lowest_prices(tmp_path: Path, gpus_only: Catalog):
    offers = imported("aws", tmp_path, gpus_only)
    g4dn = offers[("us-east-1", "g4dn.xlarge")]
    assert (g4dn.gpu, g4dn.gpu_count, g4dn.vcpus, g4dn.ram_gib) == ("T4", 1, 4, 16.0)
    assert g4dn.price_usd_per_hour == 0.526 and g4dn.spot_usd_per_hour == 0.1965
    assert g4dn.zone is None  # three zones
    assert offers[("us-east-1", "g4dn.12xlarge")].spot_usd_per_hour == 1.6152  # one zone had none
    assert offers[("us-east-1", "p4de.24xlarge")].spot_usd_per_hour is None  # empty SpotPrice
    assert offers[("us-east-1", "p4de.24xlarge")].zone == "use1-az2"
    assert offers[("us-east-1", "p3dn.24xlarge")].gpu == "V100-32GB"
    assert offers[("us-east-1", "p5.48xlarge")].gpu == "H100-SXM"
    assert offers[("eu-central-1", "p4d.24xlarge")].gpu == "A100-40GB"
    assert not any(key[1] == "m5.large" for key in offers)
    assert g4dn.source == f"SkyPilot catalog {V7 / 'aws' / 'vms.csv'}"
    assert g4dn.currency == "USD" and len(g4dn.as_of) == 10


def test_aws_skips_are_counted_by_reason_and_unknown_names_listed(tmp_path, gpus_only):
    (aws,) = import_skypilot(V7 / "aws", dest_dir=tmp_path, catalog=gpus_only).clouds
    assert aws.rows_read == 31 and aws.offers_written == 14
    assert aws.skipped == {SKIP_NO_ACCELERATOR: 3, SKIP_UNKNOWN: 3}
    assert aws.unknown_accelerators == {"K80": 1, "M60": 1, "Inferentia": 1}


def test_gcp_prices_gpus_on_n1_hosts_and_bundled_machine_types(tmp_path, gpus_only):
    offers = imported("gcp", tmp_path, gpus_only)
    t4 = offers[("us-central1", "n1-standard-8+1xT4")]
    assert (t4.gpu, t4.gpu_count, t4.vcpus, t4.ram_gib) == ("T4", 1, 8, 30.0)
    assert t4.price_usd_per_hour == pytest.approx(0.379998 + 0.35)
    assert t4.spot_usd_per_hour == pytest.approx(0.080101 + 0.11)
    four = offers[("us-central1", "n1-standard-32+4xT4")]
    assert four.vcpus == 32 and four.price_usd_per_hour == pytest.approx(1.519992 + 1.4)
    v100 = offers[("us-central1", "n1-standard-64+8xV100")]
    assert v100.zone == "us-central1-a"  # zone b has the GPUs but no n1-standard-64
    eu_v100 = offers[("europe-west4", "n1-standard-8+1xV100")]
    assert eu_v100.spot_usd_per_hour is None  # the GPU row has no spot price
    a2 = offers[("us-central1", "a2-highgpu-8g")]
    assert (a2.gpu, a2.gpu_count, a2.price_usd_per_hour) == ("A100-40GB", 8, 29.387076)
    assert offers[("us-central1", "g2-standard-4")].gpu == "L4"
    assert offers[("us-central1", "a3-highgpu-8g")].spot_usd_per_hour is None
    assert not any("L4" in key[1] and key[1].startswith("n1") for key in offers)


def test_gcp_skips(tmp_path, gpus_only):
    (gcp,) = import_skypilot(V7 / "gcp", dest_dir=tmp_path, catalog=gpus_only).clouds
    assert gcp.skipped == {
        SKIP_NO_HOST: 1,  # V100 x8 in us-central1-b
        SKIP_NOT_ATTACHABLE: 3,  # L4 GPU rows: L4 comes with g2 machines
        SKIP_UNKNOWN: 3,  # P100 x2 zones, tpu-v3-8
        SKIP_NO_ACCELERATOR: 8,  # e2 hosts, and n1-highmem-8: n1-standard-8 comes first
    }
    assert gcp.unknown_accelerators == {"P100": 2, "tpu-v3-8": 1}
    # used: 13 n1 hosts, 16 GPU rows on them, 15 a2/a3/g2 rows
    assert gcp.rows_read == sum(gcp.skipped.values()) + 13 + 16 + 15


def test_lambda_column_order_no_spot_and_missing_price(tmp_path, gpus_only):
    offers = imported("lambda", tmp_path, gpus_only)
    assert len(offers) == 12
    assert all(o.spot_usd_per_hour is None for o in offers.values())
    assert offers[("us-east-1", "gpu_1x_h100_pcie")].gpu == "H100-PCIe"
    assert offers[("us-east-1", "gpu_8x_h100_sxm5")].gpu == "H100-SXM"
    a6000 = offers[("europe-central-1", "gpu_1x_a6000")]
    assert (a6000.gpu, a6000.vcpus, a6000.ram_gib, a6000.price_usd_per_hour) == (
        "RTX-A6000",
        14,
        100.0,
        0.8,
    )
    (lam,) = import_skypilot(V7 / "lambda", dest_dir=tmp_path, catalog=gpus_only).clouds
    assert lam.skipped == {SKIP_NO_PRICE: 1, SKIP_UNKNOWN: 1}
    assert lam.unknown_accelerators == {"GH200": 1}


def test_azure_fractional_gpus_are_skipped(tmp_path, gpus_only):
    offers = imported("azure", tmp_path, gpus_only)
    assert not any("NV6ads" in key[1] or "NV18ads" in key[1] for key in offers)
    assert offers[("eastus", "Standard_NV36ads_A10_v5")].gpu == "A10"
    assert offers[("eastus", "Standard_NC24s_v3")].spot_usd_per_hour is None
    assert offers[("westeurope", "Standard_NC24ads_A100_v4")].zone is None
    (azure,) = import_skypilot(V7 / "azure", dest_dir=tmp_path, catalog=gpus_only).clouds
    assert azure.skipped == {SKIP_FRACTIONAL: 3, SKIP_NO_ACCELERATOR: 2, SKIP_UNKNOWN: 1}
    assert azure.gpus_refined == 0


def test_known_instance_types_keep_the_catalogs_gpu_model(tmp_path: Path):
    bundled = load_catalog(include_user=False)
    listed = {(o.provider, o.instance_type): o.gpu for o in bundled.offers}
    offers = imported("azure", tmp_path, bundled)
    nc_a100 = offers[("eastus", "Standard_NC24ads_A100_v4")]
    assert nc_a100.gpu == listed["azure", "Standard_NC24ads_A100_v4"] == "A100-80GB-PCIe"
    (azure,) = import_skypilot(V7 / "azure", dest_dir=tmp_path, catalog=bundled).clouds
    assert azure.gpus_refined >= 2  # both NC24ads_A100_v4 regions; SkyPilot says 'A100-80GB'


def test_imported_offers_replace_bundled_rows_and_extend(cloudtrain_home: Path):
    bundled = load_catalog(include_user=False)
    result = import_skypilot(V7)
    assert result.rows_read == 31 + 16 + 59 + 14
    merged = load_catalog()
    p4d = find_offers(merged, gpu="A100", provider="aws", region="us-west-2")
    assert [o.price_usd_per_hour for o in p4d if o.instance_type == "p4d.24xlarge"] == [21.9576]
    assert all(o.source.startswith("SkyPilot") for o in p4d if o.instance_type == "p4d.24xlarge")
    assert len(merged.offers) > len(bundled.offers)
    keys = [o.key for o in merged.offers]
    assert len(keys) == len(set(keys))


def test_single_file_with_explicit_cloud(tmp_path: Path, gpus_only: Catalog):
    copy = tmp_path / "downloads" / "prices.csv"
    copy.parent.mkdir()
    shutil.copy(V7 / "lambda" / "vms.csv", copy)
    result = import_skypilot(copy, cloud="lambda", dest_dir=tmp_path / "out", catalog=gpus_only)
    assert result.offers_written == {"lambda": 12}
    assert (tmp_path / "out" / "skypilot_lambda_offers.csv").is_file()
    with pytest.raises(UserError, match=r"--cloud applies to a single vms.csv"):
        import_skypilot(V7, cloud="aws", dest_dir=tmp_path, catalog=gpus_only)


def test_bad_number_and_missing_column_name_the_place(tmp_path: Path, gpus_only: Catalog):
    folder = tmp_path / "aws"
    folder.mkdir()
    lines = (V7 / "aws" / "vms.csv").read_text().splitlines()
    lines[4] = lines[4].replace(",0.526,", ",n/a,")
    (folder / "vms.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"vms.csv:5: column 'Price': expected a number, got 'n/a'"):
        import_skypilot(folder, dest_dir=tmp_path, catalog=gpus_only)
    (folder / "vms.csv").write_text("InstanceType,Price,Region\np3.2xlarge,3.06,us-east-1\n")
    with pytest.raises(DataError, match=r"vms.csv:1: missing column 'AcceleratorName'"):
        import_skypilot(folder, dest_dir=tmp_path, catalog=gpus_only)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"no vms.csv under"):
        import_skypilot(tmp_path / "empty", catalog=gpus_only)
