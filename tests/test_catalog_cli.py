"""`cloudtrain gpus`, `offers`, `catalog summary` and `catalog import-skypilot`, end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.catalog import find_offers, load_catalog

SKYPILOT = Path(__file__).parent / "fixtures" / "skypilot" / "catalogs"


def assert_fits_100_columns(text: str) -> None:
    too_wide = [line for line in text.splitlines() if len(line) > 100]
    assert not too_wide, too_wide


def one_line_error(done, *fragments: str) -> None:
    assert done.code == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_gpus_table_and_json(run_cli):
    table = run_cli("gpus")
    assert table.code == 0, table.stderr
    assert_fits_100_columns(table.stdout)
    header = table.stdout.splitlines()[0].split()
    assert header[:5] == ["GPU", "arch", "GiB", "HBM", "GB/s"]
    assert "H100-SXM" in table.stdout and "NVLink 450" in table.stdout
    listed = json.loads(run_cli("gpus", "--json").stdout)
    bundled = load_catalog(include_user=False).gpus
    assert [g["name"] for g in listed] == [g.name for g in bundled]
    h100 = next(g for g in listed if g["name"] == "H100-SXM")
    assert h100["bf16_tflops"] == 989 and isinstance(h100["aliases"], list)


def test_offers_default_listing_is_cheapest_first_with_a_footer(run_cli):
    done = run_cli("offers")
    assert done.code == 0, done.stderr
    assert_fits_100_columns(done.stdout)
    total = len(load_catalog(include_user=False).offers)
    assert f"showing 25 of {total} offers; --limit 0 for all" in done.stdout
    rows = [line for line in done.stdout.splitlines() if line[:1].isalpha() and "x " in line]
    prices = [
        float(line.split()[-4].replace(",", "")) for line in rows if line.split()[0] != "provider"
    ]
    assert len(prices) == 25 and prices == sorted(prices)


def test_offers_filters_match_the_library(run_cli):
    args = ["--gpu", "A100,H100", "--gpu", "a100-80gb", "--provider", "aws", "--region", "us-*"]
    done = run_cli("offers", *args, "--limit", "0", "--json")
    assert done.code == 0, done.stderr
    listed = json.loads(done.stdout)
    expected = find_offers(
        load_catalog(include_user=False),
        gpu=["A100", "H100", "a100-80gb"],
        provider="aws",
        region="us-*",
    )
    assert [(o["region"], o["instance_type"]) for o in listed] == [
        (o.region, o.instance_type) for o in expected
    ]
    assert listed and all(o["provider"] == "aws" and o["region"].startswith("us-") for o in listed)
    assert {o["gpu"] for o in listed} <= {"A100-40GB", "H100-SXM", "A100-80GB"}


def test_offers_spot_sort_min_gpus_and_max_price(run_cli):
    done = run_cli(
        "offers", "--spot", "--sort", "gpu-price", "--min-gpus", "8", "--max-price", "30", "--json"
    )
    listed = json.loads(done.stdout)
    assert listed and all(o["gpu_count"] >= 8 and o["spot_usd_per_hour"] <= 30 for o in listed)
    per_gpu = [o["spot_usd_per_hour"] / o["gpu_count"] for o in listed]
    assert per_gpu == sorted(per_gpu)
    table = run_cli("offers", "--sort", "pflop-price", "--limit", "0", "--region", "*")
    assert table.code == 0 and "spot $/GPU-h" not in table.stdout
    assert_fits_100_columns(table.stdout)
    assert table.stdout.rstrip().splitlines()[-2].endswith("offers")


def test_user_errors_exit_2_with_one_line(run_cli, tmp_path: Path):
    one_line_error(run_cli("offers", "--gpu", "H10"), "unknown GPU 'H10'", "did you mean")
    one_line_error(run_cli("offers", "--provider", "lamda"), "did you mean lambda")
    one_line_error(run_cli("offers", "--sort", "cheapest"), "price, gpu-price, pflop-price")
    one_line_error(run_cli("offers", "--limit", "-1"), "--limit must be >= 0")
    bad = tmp_path / "mine.csv"
    bad.write_text(
        "provider,region,instance_type,gpu,gpu_count,vcpus,ram_gib,price_per_hour\n"
        "onprem,lab,box,H100,two,8,64,3.0\n"
    )
    one_line_error(
        run_cli("offers", "--catalog", str(bad)),
        f"{bad}:2: column 'gpu_count': expected a positive integer, got 'two'",
    )
    one_line_error(run_cli("gpus", "--catalog", str(tmp_path / "nope")), "no such file")


def test_catalog_path_extends_the_listing(run_cli, tmp_path: Path):
    mine = tmp_path / "onprem.csv"
    mine.write_text(
        "provider,region,instance_type,gpu,gpu_count,vcpus,ram_gib,price_per_hour,source,as_of\n"
        "onprem,lab-1,dgx-h100,NVIDIA H100 80GB HBM3,8,224,2048,0.1,our cluster,2025-07-01\n"
    )
    done = run_cli("offers", "--catalog", str(mine), "--limit", "1")
    assert done.stdout.splitlines()[2].split()[:4] == ["onprem", "lab-1", "dgx-h100", "8x"]


def test_summary_table_and_json(run_cli):
    done = run_cli("catalog", "summary")
    assert done.code == 0, done.stderr
    assert_fits_100_columns(done.stdout)
    assert done.stdout.startswith(f"{len(load_catalog(include_user=False).gpus)} GPUs, ")
    data = json.loads(run_cli("catalog", "summary", "--json").stdout)
    assert data["provider_count"] >= 6 and data["offer_count"] >= 60
    assert {"gpu", "cheapest_usd_per_gpu_hour", "provider"} <= set(data["gpus"][0])


def test_import_skypilot_then_list_the_imported_offers(run_cli, cloudtrain_home: Path):
    done = run_cli("catalog", "import-skypilot", str(SKYPILOT))
    assert done.code == 0, done.stderr
    assert_fits_100_columns(done.stdout)
    assert "read 120 rows; wrote 48 offers" in done.stdout
    assert "fractional accelerator count" in done.stdout and "GH200 (1)" in done.stdout
    assert (cloudtrain_home / "catalog" / "skypilot_gcp_offers.csv").is_file()
    data = json.loads(run_cli("catalog", "import-skypilot", str(SKYPILOT), "--json").stdout)
    assert data["offers_written"] == {"aws": 14, "azure": 10, "gcp": 12, "lambda": 12}
    assert data["unknown_accelerators"]["P100"] == 2
    listed = json.loads(run_cli("offers", "--provider", "gcp", "--gpu", "T4", "--json").stdout)
    assert "n1-standard-32+4xT4" in {o["instance_type"] for o in listed}
    one_line_error(
        run_cli("catalog", "import-skypilot", str(cloudtrain_home / "none")), "no SkyPilot catalog"
    )


def test_the_listing_path_does_not_import_torch():
    code = (
        "import sys\n"
        "from cloudtrain.cli.app import main\n"
        "try:\n"
        "    main(['offers', '--limit', '1', '--json'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "sys.stderr.write('torch' if 'torch' in sys.modules else 'no torch')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stderr == "no torch"


@pytest.mark.parametrize("command", [("gpus",), ("offers",), ("catalog", "summary")])
def test_listings_fit_100_columns_when_columns_is_set(run_cli, command):
    done = run_cli(*command, env={"COLUMNS": "100"})
    assert done.code == 0, done.stderr
    assert_fits_100_columns(done.stdout)
