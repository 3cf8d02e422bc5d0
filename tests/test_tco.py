"""Rent vs buy, including the seed example: 8x A100 bought for about $120,000 plus
$15,000 a year, against about $3.2 an hour on demand."""

from __future__ import annotations

import json

import pytest

from cloudtrain.catalog.types import Catalog, GPUSpec, Offer
from cloudtrain.errors import UserError
from cloudtrain.plan import tco

A100 = GPUSpec("A100-80GB", "nvidia", "ampere", 80, 2039, 400, bf16_tflops=312)
H100 = GPUSpec("H100-SXM", "nvidia", "hopper", 80, 3350, 700, bf16_tflops=989,
               purchase_price_usd=30_000)  # fmt: skip
CATALOG = Catalog(
    gpus=[A100, H100],
    offers=[
        Offer("aws", "us-east-1", "p4de", "A100-80GB", 8, 96, 1152, 40.96,
              spot_usd_per_hour=16.0, reserved_usd_per_hour=24.0),
        Offer("runpod", "US", "1x-a100", "A100-80GB", 1, 16, 117, 1.89, spot_usd_per_hour=0.79),
        Offer("lambda", "us-east-1", "8x-h100", "H100-SXM", 8, 208, 1800, 23.92),
    ],
)  # fmt: skip


def test_seed_example():
    result = tco(
        CATALOG, "A100-80GB", 8, 0.6, 3, kwh_price_usd=0.0,
        purchase_usd=120_000, ops_usd_per_year=15_000, rent_usd_per_hour=3.2,
    )  # fmt: skip
    assert result.buy_total_usd == pytest.approx(165_000)  # 120,000 + 3 x 15,000
    hours_used = 0.6 * 3 * 8760
    assert result.rent[0].total_usd == pytest.approx(3.2 * hours_used)  # $50,458
    # the seed says the cloud saves about 68%: 1 - 50,458 / 165,000 = 69%
    saving = 1 - result.rent[0].total_usd / result.buy_total_usd
    assert saving == pytest.approx(0.69, abs=0.01)
    # break-even 165,000 / (3.2 x 26,280) = 196%: renting wins at any utilization
    assert result.break_even_utilization is None
    assert "rent" in result.verdict and "any utilization" in result.verdict


def test_break_even_by_hand():
    # rent $20/h; buy 100,000 + 10,000/yr over 2 years; no power: u* = 120,000 / (20 x 17,520)
    result = tco(
        CATALOG, "A100-80GB", 8, 0.5, 2, kwh_price_usd=0.0,
        purchase_usd=100_000, ops_usd_per_year=10_000, rent_usd_per_hour=20.0,
    )  # fmt: skip
    assert result.break_even_utilization == pytest.approx(120_000 / (20 * 17_520))
    busy = tco(
        CATALOG, "A100-80GB", 8, 0.9, 2, kwh_price_usd=0.0,
        purchase_usd=100_000, ops_usd_per_year=10_000, rent_usd_per_hour=20.0,
    )  # fmt: skip
    assert busy.buy_total_usd < busy.rent[0].total_usd and "buying is cheaper" in busy.verdict


def test_power_cost_by_hand():
    # load 8 x (400 x 0.8 + 150) = 3.76 kW, idle 8 x (40 + 75) = 0.92 kW, PUE 1.5, $0.10/kWh
    result = tco(CATALOG, "A100-80GB", 8, 0.5, 1, kwh_price_usd=0.1, purchase_usd=1, pue=1.5)
    expected = (0.92 + 0.5 * (3.76 - 0.92)) * 8760 * 1.5 * 0.1
    assert result.energy_usd == pytest.approx(expected)


def test_rent_prices_come_from_the_cheapest_offers_per_gpu():
    result = tco(CATALOG, "A100-80GB", 8, 0.5, 1, purchase_usd=100_000)
    by_pricing = {r.pricing: r for r in result.rent}
    assert by_pricing["on_demand"].usd_per_hour == pytest.approx(8 * 1.89)
    assert by_pricing["spot"].usd_per_hour == pytest.approx(8 * 0.79)
    # a reservation is paid for every hour, used or not
    assert by_pricing["reserved"].total_usd == pytest.approx(24.0 * 8760)
    assert [r.total_usd for r in result.rent] == sorted(r.total_usd for r in result.rent)


def test_purchase_defaults_and_errors():
    from_catalog = tco(CATALOG, "H100-SXM", 8, 0.5, 3)
    assert from_catalog.purchase_usd == pytest.approx(8 * 30_000 * 1.25)
    assert from_catalog.ops_usd_per_year == pytest.approx(from_catalog.purchase_usd * 0.125)
    seeded = tco(CATALOG, "A100-80GB", 8, 0.5, 3)  # no catalog price: the seed's $120,000
    assert seeded.purchase_usd == 120_000
    bare = Catalog(gpus=[GPUSpec("L4", "nvidia", "ada", 24, 300, 72)])
    with pytest.raises(UserError, match="--purchase-usd"):
        tco(bare, "L4", 1, 0.5, 1)
    with pytest.raises(UserError, match="utilization"):
        tco(CATALOG, "H100-SXM", 8, 1.5, 3)


def test_cli_seed_example(run_cli):
    result = run_cli(
        "tco", "--gpu", "A100-80GB", "--count", "8", "--utilization", "0.6", "--years", "3",
        "--purchase-usd", "120000", "--ops-usd-per-year", "15000", "--rent-usd-per-hour", "3.2",
        "--kwh-price", "0", "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["buy_total_usd"] == pytest.approx(165_000)
    assert data["rent"][0]["total_usd"] == pytest.approx(50_457.6)


def test_cli_table_over_the_bundled_catalog(run_cli):
    result = run_cli("tco", "--gpu", "A100-80GB", "--count", "8", "--utilization", "0.6")
    assert result.code == 0, result.stderr
    assert "buy" in result.stdout and "rent" in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 100
    bad = run_cli("tco", "--gpu", "A100-90GB")
    assert bad.code == 2 and "did you mean" in bad.stderr
