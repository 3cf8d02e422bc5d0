"""Offer filtering and sorting (a pure function) and the catalog summary."""

from __future__ import annotations

import pytest

from cloudtrain.catalog import (
    Catalog,
    GPUSpec,
    Offer,
    catalog_summary,
    find_offers,
    load_catalog,
    price_per_pflop_hour,
)
from cloudtrain.errors import UnknownNameError, UserError


def gpu(name: str, bf16: float | None, *aliases: str) -> GPUSpec:
    return GPUSpec(name, "nvidia", "x", 80, 2000, 400, bf16_tflops=bf16, aliases=aliases)


def offer(provider, region, instance, gpu_name, count, price, spot=None) -> Offer:
    return Offer(provider, region, instance, gpu_name, count, 8 * count, 32.0 * count, price, spot)


@pytest.fixture
def catalog() -> Catalog:
    return Catalog(
        gpus=[
            gpu("H100-SXM", 1000.0, "H100"),
            gpu("A100-40GB", 300.0, "A100"),
            gpu("V100-16GB", None, "V100"),
            gpu("B200", 2250.0),
        ],
        offers=[
            offer("aws", "us-east-1", "p5.48xlarge", "H100-SXM", 8, 55.0, 20.0),
            offer("aws", "eu-central-1", "p4d.24xlarge", "A100-40GB", 8, 40.0, 18.0),
            offer("aws", "us-west-2", "p4d.24xlarge", "A100-40GB", 8, 21.0, 7.0),
            offer("lambda", "us-east-1", "gpu_1x_a100", "A100-40GB", 1, 1.3),
            offer("gcp", "us-central1", "n1-standard-8+1xV100", "V100-16GB", 1, 2.9, 1.0),
            offer("gcp", "europe-west4", "a3-highgpu-8g", "H100-SXM", 8, 88.0),
            offer("runpod", "US", "secure-1x-H100", "H100-SXM", 1, 3.0, 2.5),
        ],
    )


def names(offers: list[Offer]) -> list[str]:
    return [f"{o.provider}/{o.region}/{o.instance_type}" for o in offers]


def test_no_filter_lists_everything_cheapest_instance_first(catalog: Catalog):
    found = find_offers(catalog)
    assert len(found) == 7
    assert [o.price_usd_per_hour for o in found] == sorted(o.price_usd_per_hour for o in found)


def test_filters_combine(catalog: Catalog):
    assert names(find_offers(catalog, gpu="a100", provider="AWS")) == [
        "aws/us-west-2/p4d.24xlarge",
        "aws/eu-central-1/p4d.24xlarge",
    ]
    assert names(find_offers(catalog, gpu=["H100", "V100"], min_gpus=8)) == [
        "aws/us-east-1/p5.48xlarge",
        "gcp/europe-west4/a3-highgpu-8g",
    ]
    assert names(find_offers(catalog, region="us-*", max_price_usd_per_hour=3.0)) == [
        "lambda/us-east-1/gpu_1x_a100",
        "gcp/us-central1/n1-standard-8+1xV100",
    ]
    assert names(find_offers(catalog, region=["EU*", "US"], provider=["aws", "runpod"])) == [
        "runpod/US/secure-1x-H100",
        "aws/eu-central-1/p4d.24xlarge",
    ]
    assert find_offers(catalog, gpu="B200") == []


def test_spot_uses_spot_prices_for_filter_and_sort(catalog: Catalog):
    found = find_offers(catalog, spot_only=True, max_price_usd_per_hour=10)
    assert names(found) == [
        "gcp/us-central1/n1-standard-8+1xV100",
        "runpod/US/secure-1x-H100",
        "aws/us-west-2/p4d.24xlarge",
    ]
    assert all(o.spot_usd_per_hour is not None for o in find_offers(catalog, spot_only=True))


def test_sort_by_price_per_gpu(catalog: Catalog):
    found = find_offers(catalog, sort="price_per_gpu")
    per_gpu = [o.price_usd_per_gpu_hour for o in found]
    assert per_gpu == sorted(per_gpu)
    assert names(found)[:2] == ["lambda/us-east-1/gpu_1x_a100", "aws/us-west-2/p4d.24xlarge"]


def test_sort_by_price_per_pflop_puts_gpus_without_bf16_last(catalog: Catalog):
    found = find_offers(catalog, sort="price_per_pflop")
    assert names(found)[-1] == "gcp/us-central1/n1-standard-8+1xV100"
    # $/h over (GPUs x bf16 TFLOPS / 1000): runpod 3.0/1.0, lambda 1.3/0.3, p5 55/8.0
    assert price_per_pflop_hour(found[0], 1000.0) == pytest.approx(3.0)
    assert names(found)[:3] == [
        "runpod/US/secure-1x-H100",
        "lambda/us-east-1/gpu_1x_a100",
        "aws/us-east-1/p5.48xlarge",
    ]
    spot = find_offers(catalog, sort="price_per_pflop", spot_only=True)
    # spot: p5 20/8.0 = 2.5 ties runpod 2.5/1.0; the provider name breaks the tie
    assert names(spot)[:2] == ["aws/us-east-1/p5.48xlarge", "runpod/US/secure-1x-H100"]


def test_ties_break_by_provider_region_instance(catalog: Catalog):
    twin = offer("aws", "ap-south-1", "p4d.24xlarge", "A100-40GB", 8, 21.0)
    catalog.offers.append(twin)
    assert names(find_offers(catalog, gpu="A100", provider="aws"))[:2] == [
        "aws/ap-south-1/p4d.24xlarge",
        "aws/us-west-2/p4d.24xlarge",
    ]


def test_unknown_names_are_user_errors_with_suggestions(catalog: Catalog):
    with pytest.raises(UnknownNameError, match=r"unknown GPU 'H100-SMX'; did you mean H100-SXM"):
        find_offers(catalog, gpu=["A100", "H100-SMX"])
    with pytest.raises(UnknownNameError, match=r"unknown provider 'lamda'; did you mean lambda"):
        find_offers(catalog, provider="lamda")
    with pytest.raises(UserError, match="unknown sort 'cheapest'"):
        find_offers(catalog, sort="cheapest")
    with pytest.raises(UserError, match="--min-gpus must be at least 1"):
        find_offers(catalog, min_gpus=0)


def test_summary_counts_and_cheapest_per_gpu(catalog: Catalog):
    summary = catalog_summary(catalog)
    assert (summary.gpu_count, summary.offer_count, summary.spot_offer_count) == (4, 7, 5)
    assert summary.providers == ("aws", "gcp", "lambda", "runpod")
    assert summary.region_count == 7
    by_gpu = {g.gpu: g for g in summary.gpus}
    h100 = by_gpu["H100-SXM"]
    assert h100.offer_count == 3
    assert h100.cheapest_usd_per_gpu_hour == pytest.approx(3.0)
    assert (h100.provider, h100.instance_type) == ("runpod", "secure-1x-H100")
    assert h100.cheapest_spot_usd_per_gpu_hour == pytest.approx(2.5)
    assert by_gpu["A100-40GB"].cheapest_usd_per_gpu_hour == pytest.approx(1.3)
    assert by_gpu["A100-40GB"].cheapest_spot_usd_per_gpu_hour == pytest.approx(7.0 / 8)
    assert by_gpu["B200"].offer_count == 0 and by_gpu["B200"].cheapest_usd_per_gpu_hour is None


def test_bundled_catalog_meets_the_coverage_the_planner_needs():
    summary = catalog_summary(load_catalog(include_user=False))
    assert summary.offer_count >= 60 and summary.provider_count >= 6
    assert summary.spot_offer_count > 0


def test_every_offer_is_found_by_its_ref_in_any_case():
    from cloudtrain.catalog import find_offer, load_catalog, offer_ref

    catalog = load_catalog()
    for offer in catalog.offers:
        assert find_offer(catalog, offer_ref(offer)) is offer
        assert find_offer(catalog, offer_ref(offer).upper()) is offer
    kinds = [(o.provider, o.instance_type) for o in catalog.offers]
    only_one_region = [
        o for o, kind in zip(catalog.offers, kinds, strict=True) if kinds.count(kind) == 1
    ]
    for offer in only_one_region:  # PROVIDER/INSTANCE is enough
        assert find_offer(catalog, f"{offer.provider}/{offer.instance_type}") is offer
    assert only_one_region
