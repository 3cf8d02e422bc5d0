"""Lookups: GPUs by name and by the device strings torch/nvidia-smi print; regions, carbon, PUE."""

from __future__ import annotations

import pytest

from cloudtrain.catalog import (
    DEFAULT_PUE,
    Catalog,
    GPUSpec,
    GridIntensity,
    ProviderPUE,
    Region,
    load_catalog,
    normalize_gpu_name,
    resolve_gpu,
)
from cloudtrain.errors import UnknownNameError, UserError


def spec(name: str, *aliases: str) -> GPUSpec:
    return GPUSpec(name, "nvidia", "x", 80, 2000, 400, bf16_tflops=300, aliases=aliases)


@pytest.fixture
def small() -> Catalog:
    return Catalog(
        gpus=[
            spec("H100-SXM", "NVIDIA H100 80GB HBM3", "H100"),
            spec("H100-PCIe", "NVIDIA H100 PCIe"),
            spec("A100-80GB", "NVIDIA A100-SXM4-80GB"),
        ],
        regions=[
            Region("aws", "us-east-1", "USA"),
            Region("gcp", "europe-west4", "NLD", gco2e_per_kwh=282),
            Region("gcp", "me-central2", "SAU"),
        ],
        grid=[GridIntensity("USA", "United States", 369), GridIntensity("WORLD", "World", 475)],
        pue=[ProviderPUE("gcp", 1.10)],
    )


@pytest.fixture(scope="module")
def bundled() -> Catalog:
    return load_catalog(include_user=False)


def test_normalisation_ignores_case_punctuation_and_brand_words():
    assert normalize_gpu_name("NVIDIA A100-SXM4-80GB") == "a100sxm480gb"
    assert normalize_gpu_name("nvidia  a100 sxm4 80gb") == "a100sxm480gb"
    assert normalize_gpu_name("Tesla V100-SXM2-16GB") == normalize_gpu_name("V100 SXM2 16GB")
    assert normalize_gpu_name("NVIDIA GeForce RTX 4090") == "rtx4090"
    assert normalize_gpu_name("AMD Instinct MI300X") == "mi300x"
    assert normalize_gpu_name("NVIDIA") == "nvidia"


def test_resolution_is_exact_never_by_prefix(small: Catalog):
    assert small.resolve_gpu("NVIDIA H100 80GB HBM3").name == "H100-SXM"
    assert small.resolve_gpu("nvidia h100 pcie").name == "H100-PCIe"
    assert small.resolve_gpu("NVIDIA H100 NVL") is None  # not H100-PCIe, not H100-SXM
    assert small.resolve_gpu("NVIDIA A100-SXM4-80GB MIG 3g.40gb") is None
    assert small.resolve_gpu("NVIDIA A100-SXM4") is None
    assert small.resolve_gpu("") is None


# What torch.cuda.get_device_name() / nvidia-smi --query-gpu=name print on each GPU.
DEVICE_STRINGS = [
    ("NVIDIA H200", "H200"),
    ("NVIDIA H100 80GB HBM3", "H100-SXM"),
    ("NVIDIA H100 PCIe", "H100-PCIe"),
    ("NVIDIA H100 NVL", "H100-NVL"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
    ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
    ("NVIDIA A100-PCIE-40GB", "A100-40GB-PCIe"),
    ("NVIDIA A100 80GB PCIe", "A100-80GB-PCIe"),
    ("Tesla V100-SXM2-16GB", "V100-16GB"),
    ("Tesla V100-SXM2-32GB", "V100-32GB"),
    ("Tesla V100-PCIE-16GB", "V100-PCIe-16GB"),
    ("Tesla T4", "T4"),
    ("NVIDIA A10G", "A10G"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA A30", "A30"),
    ("NVIDIA RTX A6000", "RTX-A6000"),
    ("NVIDIA GeForce RTX 4090", "RTX-4090"),
    ("NVIDIA GeForce RTX 3090", "RTX-3090"),
    ("AMD Instinct MI300X", "MI300X"),
    ("AMD Instinct MI250X", "MI250X"),
]
UNKNOWN_DEVICES = [
    "NVIDIA GeForce RTX 3080",
    "NVIDIA H800",
    "NVIDIA H20",
    "NVIDIA GH200 480GB",
    "NVIDIA L40",
    "NVIDIA A40",
    "NVIDIA RTX 6000 Ada Generation",
    "Tesla K80",
    "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
    "AMD Instinct MI325X",
    "cpu",
]


@pytest.mark.parametrize(("device", "expected"), DEVICE_STRINGS)
def test_device_strings_resolve_to_the_right_bundled_spec(
    bundled: Catalog, device: str, expected: str
):
    assert bundled.resolve_gpu(device).name == expected


@pytest.mark.parametrize("device", UNKNOWN_DEVICES)
def test_unknown_devices_resolve_to_none(bundled: Catalog, device: str):
    assert bundled.resolve_gpu(device) is None


def test_module_level_resolve_uses_the_user_catalog(cloudtrain_home):
    assert resolve_gpu("NVIDIA H200").name == "H200"
    assert resolve_gpu("Lab GPU 9000") is None
    folder = cloudtrain_home / "catalog"
    folder.mkdir()
    (folder / "lab.csv").write_text(
        "name,aliases,vendor,architecture,memory_gib,memory_bandwidth_gbps,tdp_w\n"
        "LAB-9000,Lab GPU 9000,acme,future,64,2000,500\n"
    )
    assert resolve_gpu("Lab GPU 9000").name == "LAB-9000"


def test_gpu_by_name_or_alias_and_did_you_mean(small: Catalog):
    assert small.gpu("H100").name == "H100-SXM"
    assert small.gpu("h100-pcie").name == "H100-PCIe"
    with pytest.raises(UnknownNameError) as caught:
        small.gpu("H100-SMX")
    assert isinstance(caught.value, UserError)
    assert str(caught.value).startswith("unknown GPU 'H100-SMX'; did you mean H100-SXM")
    with pytest.raises(UnknownNameError, match="valid choices: A100-80GB, H100-PCIe, H100-SXM"):
        small.gpu("Z")


def test_regions_carbon_and_pue(small: Catalog):
    assert small.region("AWS", "US-EAST-1").country == "USA"
    assert small.region("aws", "mars-1") is None
    assert small.carbon_intensity("aws", "us-east-1") == 369  # the country's grid
    assert small.carbon_intensity("gcp", "europe-west4") == 282  # the region's own figure
    assert small.carbon_intensity("gcp", "me-central2") is None  # no figure for SAU
    assert small.carbon_intensity("azure", "nowhere") is None
    assert small.pue_for("GCP") == pytest.approx(1.10)
    assert small.pue_for("lambda") == DEFAULT_PUE
    small.pue.append(ProviderPUE("default", 1.4))
    assert small.pue_for("lambda") == pytest.approx(1.4)  # the index follows the list


def test_bundled_regions_have_carbon_figures(bundled: Catalog):
    providers = {o.provider for o in bundled.offers}
    for provider in providers:
        regions = {o.region for o in bundled.offers if o.provider == provider}
        known = [r for r in regions if bundled.carbon_intensity(provider, r) is not None]
        assert known, f"no carbon intensity for any {provider} region"
    assert all(bundled.pue_for(p) >= 1.0 for p in providers)


def test_did_you_mean_matches_aliases_and_suggests_the_canonical_name():
    from cloudtrain.catalog import load_catalog
    from cloudtrain.errors import UnknownNameError

    with pytest.raises(UnknownNameError) as caught:
        load_catalog(include_user=False).gpu("H10")
    assert "did you mean H100-SXM" in str(caught.value)  # via its alias 'H100'
