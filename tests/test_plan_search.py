"""plan(): candidates, constraints and their counts, ranking, the Pareto frontier,
impossible requests, and a run over the bundled catalog."""

from __future__ import annotations

import copy

import pytest

from cloudtrain.catalog.types import (
    Catalog,
    ExchangeRate,
    GPUSpec,
    GridIntensity,
    Offer,
    ProviderPUE,
    Region,
)
from cloudtrain.errors import UnknownNameError
from cloudtrain.plan import Assumptions, Constraints, Workload, plan, preset

GPUS = [
    GPUSpec(
        "A100-80GB", "nvidia", "ampere", 80, 2039, 400, fp32_tflops=19.5, tf32_tflops=156,
        bf16_tflops=312, fp16_tflops=312, link_kind="nvlink", link_gbps_per_direction=300,
        pcie_gen=4, aliases=("A100",),
    ),
    GPUSpec(
        "H100-SXM", "nvidia", "hopper", 80, 3350, 700, fp32_tflops=67, tf32_tflops=494.5,
        bf16_tflops=989, fp16_tflops=989, fp8_tflops=1979, link_kind="nvlink",
        link_gbps_per_direction=450, pcie_gen=5,
    ),
    GPUSpec("T4", "nvidia", "turing", 16, 320, 70, fp32_tflops=8.1, fp16_tflops=65, pcie_gen=3),
]  # fmt: skip
OFFERS = [
    Offer("aws", "us-east-1", "p4de", "A100-80GB", 8, 96, 1152, 40.0, spot_usd_per_hour=12.0,
          reserved_usd_per_hour=25.0, interruption_band="5-10%", network_gbps=400),
    Offer("lambda", "us-east-1", "gpu_8x_a100", "A100-80GB", 8, 240, 1800, 14.3, network_gbps=None),
    Offer("gcp", "europe-west4", "a3-highgpu-8g", "H100-SXM", 8, 208, 1872, 88.0,
          spot_usd_per_hour=30.0, network_gbps=800),
    Offer("alibaba", "cn-hangzhou", "gn6i", "T4", 1, 4, 15, 0.5, network_gbps=4),
]  # fmt: skip
CATALOG = Catalog(
    gpus=GPUS,
    offers=OFFERS,
    regions=[
        Region("aws", "us-east-1", "USA"),
        Region("lambda", "us-east-1", "USA"),
        Region("gcp", "europe-west4", "NLD", gco2e_per_kwh=268),
        Region("alibaba", "cn-hangzhou", "CHN"),
    ],
    grid=[
        GridIntensity("USA", "United States", 369),
        GridIntensity("CHN", "China", 582),
        GridIntensity("WORLD", "World", 475),
    ],
    pue=[ProviderPUE("aws", 1.15), ProviderPUE("gcp", 1.1)],
    exchange_rates=[ExchangeRate("CNY", 0.139)],
)
GPT = Workload(
    name="gpt-1b", parameters=1.3e9, layers=24, hidden_size=2048, heads=16, seq_len=2048,
    global_batch=512, tokens=20e9,
)  # fmt: skip


def run(workload: Workload = GPT, **constraints) -> object:
    constraints.setdefault("max_nodes", 4)
    return plan(workload, Constraints(**constraints), CATALOG)


def test_every_candidate_is_either_estimated_or_removed_once():
    result = run()
    # offers x node counts x the pricings each offer has: (3 + 1 + 2 + 1) x 4
    assert result.candidates == 28
    assert len(result.estimates) + sum(result.removed.values()) == 28
    # one T4 cannot hold 1.3e9 x 16 bytes of states; FSDP over 2+ T4 nodes can
    assert result.removed == {"memory": 1}


def test_ranked_by_cost_with_a_reason():
    result = run()
    costs = [e.cost_usd for e in result.estimates]
    assert costs == sorted(costs)
    assert "cheapest" in result.why and result.best.label in result.why


def test_objective_time_puts_the_fastest_first():
    result = run(objective="time")
    assert result.best.total_s == min(e.total_s for e in result.estimates)
    assert result.best.gpu == "H100-SXM"


def test_objective_carbon():
    result = run(objective="carbon")
    assert result.best.co2e_kg == min(e.co2e_kg for e in result.estimates)


def test_pareto_frontier():
    result = run()
    frontier = result.frontier
    assert frontier and all(e.on_frontier for e in frontier)
    for member in frontier:  # nothing is both cheaper and faster than a frontier member
        assert not any(
            e.cost_usd < member.cost_usd and e.total_s < member.total_s for e in result.estimates
        )
    for other in (e for e in result.estimates if not e.on_frontier):
        assert any(f.cost_usd <= other.cost_usd and f.total_s <= other.total_s for f in frontier)
    times = [e.total_s for e in frontier]
    assert times == sorted(times)


def test_provider_region_and_country_filters():
    only = run(providers=("lambda",))
    assert {e.provider for e in only.estimates} == {"lambda"}
    assert only.removed["provider"] == (3 + 2 + 1) * 4
    europe = run(countries=("NLD",))
    assert {e.region for e in europe.estimates} == {"europe-west4"}
    globbed = run(regions=("us-*",))
    assert {e.region for e in globbed.estimates} == {"us-east-1"}


def test_gpu_names_resolve_aliases_and_unknown_names_suggest():
    assert {e.gpu for e in run(gpus=("A100",)).estimates} == {"A100-80GB"}
    with pytest.raises(UnknownNameError, match="did you mean"):
        run(gpus=("H100-SMX",))
    with pytest.raises(UnknownNameError, match="provider 'asw'"):
        run(providers=("asw",))


def test_pricing_and_interruption_band():
    no_spot = run(pricings=("on_demand", "reserved"))
    assert "spot" not in {e.pricing for e in no_spot.estimates}
    calm = run(max_interruption_band="<5%")
    # aws is 5-10%, gcp publishes none (assumed 15-20%): both spot offers go
    assert "spot" not in {e.pricing for e in calm.estimates}
    assert calm.removed["interruption_band"] == 2 * 4
    loose = run(max_interruption_band="5-10%")
    assert {(e.provider, e.pricing) for e in loose.estimates if e.pricing == "spot"} == {
        ("aws", "spot")
    }


def test_spot_costs_interruptions_and_reserved_shows_its_commitment():
    result = run(gpus=("A100-80GB",), providers=("aws",))
    by_pricing = {(e.nodes, e.pricing): e for e in result.estimates}
    spot, on_demand = by_pricing[(2, "spot")], by_pricing[(2, "on_demand")]
    assert spot.expected_interruptions > 0 and spot.total_s > on_demand.total_s
    assert spot.interruption_band == "5-10%"
    reserved = by_pricing[(2, "reserved")]
    assert reserved.commitment_usd == pytest.approx(2 * 25.0 * 8760)


def test_min_memory_and_max_gpus():
    result = run(min_gpu_memory_gib=40, max_gpus=8)
    assert {e.gpu for e in result.estimates} == {"A100-80GB", "H100-SXM"}
    assert all(e.nodes == 1 for e in result.estimates)
    assert result.removed["min_gpu_memory"] == 4


def test_precision_fallbacks_and_removals():
    fp8 = run(GPT.replace(precision="fp8"))
    assert {e.gpu for e in fp8.estimates} == {"H100-SXM"}
    assert fp8.removed["precision"] > 0
    small = GPT.replace(parameters=50e6, layers=4, hidden_size=512, heads=8, seq_len=256)
    t4 = run(small, gpus=("T4",))
    assert {e.dtype for e in t4.estimates} == {"fp16"}  # no bf16 on Turing


def test_deadline_and_budget_filter_and_currency_converts():
    loose = run()
    fastest = min(e.total_s for e in loose.estimates)
    tight = run(deadline_s=fastest * 1.5)
    assert all(e.total_s <= fastest * 1.5 for e in tight.estimates)
    assert tight.removed["deadline"] > 0
    cny = run(currency="CNY", budget=loose.best.cost_usd / 0.139 * 1.01)
    assert cny.best.cost == pytest.approx(cny.best.cost_usd / 0.139)
    assert all(e.cost_usd <= loose.best.cost_usd * 1.01 for e in cny.estimates)
    assert cny.removed["budget"] > 0


def test_big_model_needs_fsdp_and_says_so():
    result = run(preset("llama-7b").replace(tokens=1e9), gpus=("A100-80GB",))
    one_node = [e for e in result.estimates if e.nodes == 1]
    assert one_node and all("fsdp" in e.requires for e in one_node)
    assert all(e.sharding == "fsdp" for e in one_node)


def test_checkpointing_forced_off_and_sharding_forced():
    w = preset("llama-7b").replace(tokens=1e9, activation_checkpointing=False, sharding="fsdp")
    result = run(w, gpus=("H100-SXM",))
    assert all(not e.activation_checkpointing and e.sharding == "fsdp" for e in result.estimates)


def test_efficiency_override_and_measured_matmul():
    base = run(gpus=("A100-80GB",), providers=("lambda",), max_nodes=1).best
    slow = plan(
        GPT, Constraints(gpus=("A100-80GB",), providers=("lambda",), max_nodes=1), CATALOG,
        efficiency_overrides={"*": 0.25},
    ).best  # fmt: skip
    assert slow.efficiency == 0.25 and slow.compute_s == pytest.approx(2 * base.compute_s)
    measured = plan(
        GPT, Constraints(gpus=("A100-80GB",), max_nodes=1), CATALOG,
        measured_matmul={"A100": {"bf16": 0.6}},
    ).best  # fmt: skip
    assert measured.efficiency == pytest.approx(0.5 * 0.6 / 0.869, abs=1e-4)
    assert "measured" in measured.efficiency_source


def test_assumptions_are_reported_and_changeable():
    result = run()
    for key in ("overlap_fraction", "restart_s", "efficiency", "exchange_rate", "spot_hazard"):
        assert key in result.assumptions
    assert result.assumptions["efficiency"]["A100-80GB"]["value"] == 0.5
    slower_start = plan(
        GPT, Constraints(max_nodes=1), CATALOG, assumptions=Assumptions(provision_s=7200)
    )
    assert slower_start.best.provision_s == 7200


def test_plan_is_pure():
    before = copy.deepcopy(CATALOG.offers)
    run()
    assert before == CATALOG.offers


# ---------------------------------------------------------------- impossible requests


def test_deadline_unreachable_says_how_much_to_relax():
    result = run(deadline_s=60)
    assert result.estimates == [] and result.best is None
    assert "fastest plan takes" in result.why_empty and "--deadline" in result.why_empty


def test_budget_unreachable_names_the_cheapest():
    result = run(budget=1.0)
    assert "cheapest plan" in result.why_empty and "--budget" in result.why_empty


def test_nothing_fits_says_how_much_memory():
    result = run(preset("llama-70b"), gpus=("T4",))
    assert "does not fit" in result.why_empty and "GiB per GPU" in result.why_empty
    assert "--max-nodes" in result.why_empty


def test_filters_leave_nothing():
    result = run(countries=("CHN",), min_gpu_memory_gib=40)
    assert "filters" in result.why_empty


def test_batch_smaller_than_gpu_count():
    result = run(GPT.replace(global_batch=4), gpus=("H100-SXM",), pricings=("on_demand",))
    assert "global batch" in result.why_empty


# ---------------------------------------------------------------- the bundled catalog


def test_bundled_catalog_plans_llama_7b():
    from cloudtrain.catalog import load_catalog

    catalog = load_catalog(include_user=False)
    result = plan(preset("llama-7b").replace(tokens=20e9), Constraints(), catalog)
    assert result.candidates >= 8 * len(catalog.offers)
    assert result.estimates and result.frontier
    best = result.best
    assert 0 < best.mfu < 0.7 and best.cost_usd > 0 and best.co2e_kg > 0


def test_bundled_catalog_data_residency_in_china_in_cny():
    from cloudtrain.catalog import load_catalog

    catalog = load_catalog(include_user=False)
    result = plan(preset("gpt2-124m"), Constraints(countries=("CHN",), currency="CNY"), catalog)
    regions = {(r.provider, r.region): r.country for r in catalog.regions}
    assert result.estimates
    assert {regions[(e.provider, e.region)] for e in result.estimates} == {"CHN"}
    assert result.currency == "CNY" and result.best.cost > result.best.cost_usd


def test_spot_that_cannot_finish_is_removed_and_explained():
    hectic = Assumptions(spot_interruptions_per_node_hour=10.0)
    result = plan(GPT, Constraints(max_nodes=2, pricings=("spot",)), CATALOG, assumptions=hectic)
    assert result.estimates == []
    assert result.removed["spot_risk"] == 2 * 2  # two spot offers x two node counts
    assert "allow on-demand" in result.why_empty
