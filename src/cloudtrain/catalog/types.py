"""Typed records of the catalog. Units live in field names; `None` always means
"not published / not applicable", never zero."""

from __future__ import annotations

from dataclasses import dataclass, field

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")

# AWS publishes spot interruption frequency in these bands (share of capacity
# reclaimed over the trailing month). Mid-points feed the planner's risk model.
INTERRUPTION_BANDS = {
    "<5%": 0.025,
    "5-10%": 0.075,
    "10-15%": 0.125,
    "15-20%": 0.175,
    ">20%": 0.25,
}


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model as its datasheet gives it (dense figures, never sparsity)."""

    name: str
    """Canonical name, e.g. 'H100-SXM'."""
    vendor: str
    architecture: str
    memory_gib: float
    memory_bandwidth_gbps: float
    """Device memory bandwidth in GB/s."""
    tdp_w: float
    compute_capability: str | None = None
    """CUDA compute capability like '9.0'; None for non-NVIDIA GPUs."""
    fp32_tflops: float | None = None
    tf32_tflops: float | None = None
    """None: the GPU has no TF32 tensor cores."""
    bf16_tflops: float | None = None
    fp16_tflops: float | None = None
    fp8_tflops: float | None = None
    """None: no FP8 tensor cores."""
    link_kind: str | None = None
    """GPU-to-GPU link: 'nvlink', 'infinity-fabric' or 'pcie'."""
    link_gbps_per_direction: float | None = None
    pcie_gen: int | None = None
    purchase_price_usd: float | None = None
    """List or street price of one GPU; None where not public."""
    aliases: tuple[str, ...] = ()
    """Other names, incl. the exact strings torch and nvidia-smi print."""
    source: str = ""
    as_of: str = ""

    def peak_tflops(self, dtype: str) -> float | None:
        """Dense peak TFLOP/s for 'fp32', 'tf32', 'bf16', 'fp16' or 'fp8'; None if unsupported."""
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
        return getattr(self, f"{dtype}_tflops")

    def runs_as(self, dtype: str) -> str | None:
        """The dtype whose peak `dtype` runs at here: itself, bf16 -> fp16 and tf32 ->
        fp32 on GPUs without them; None when the GPU cannot run it (fp8 without fp8
        units)."""
        if self.peak_tflops(dtype):
            return dtype
        fallback = {"bf16": "fp16", "tf32": "fp32"}.get(dtype)
        if fallback and self.peak_tflops(fallback):
            return fallback
        return None

    def op_peak_tflops(self, dtype: str) -> float | None:
        """The peak an op of `dtype` is measured against: that of `runs_as(dtype)`, else
        the fp32 peak (an fp8 op on a GPU without fp8 units)."""
        return self.peak_tflops(self.runs_as(dtype) or "fp32")


@dataclass(frozen=True)
class Offer:
    """One rentable instance type in one region of one provider, prices in USD."""

    provider: str
    region: str
    instance_type: str
    gpu: str
    """Canonical GPU name (a `GPUSpec.name`)."""
    gpu_count: int
    vcpus: int
    ram_gib: float
    price_usd_per_hour: float
    """On-demand price of the whole instance."""
    spot_usd_per_hour: float | None = None
    """None: no spot market for this offer (or not published)."""
    reserved_usd_per_hour: float | None = None
    """Effective hourly price under a 1-year reservation or commitment; None if unpublished."""
    interruption_band: str | None = None
    """One of INTERRUPTION_BANDS' keys; None where the provider publishes none."""
    local_nvme_gb: float | None = None
    network_gbps: float | None = None
    """Instance network bandwidth between nodes; None where unpublished."""
    zone: str | None = None
    currency: str = "USD"
    """Currency the source quoted; prices here are already converted to USD."""
    source: str = ""
    as_of: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        """Identity for overrides: a user row with the same key replaces this one."""
        return (self.provider, self.region, self.instance_type)

    @property
    def price_usd_per_gpu_hour(self) -> float:
        return self.price_usd_per_hour / self.gpu_count

    @property
    def interruption_rate(self) -> float | None:
        """Mid-point of the interruption band as a monthly fraction; None if unknown."""
        return INTERRUPTION_BANDS.get(self.interruption_band) if self.interruption_band else None


@dataclass(frozen=True)
class Region:
    """A cloud region, where it is, and the carbon intensity of its grid."""

    provider: str
    region: str
    country: str
    """ISO 3166-1 alpha-3 country code, e.g. 'USA'."""
    location: str = ""
    gco2e_per_kwh: float | None = None
    """Region-level intensity where published; None: use the country's."""
    source: str = ""
    as_of: str = ""


@dataclass(frozen=True)
class GridIntensity:
    country: str
    """ISO 3166-1 alpha-3 code, or 'WORLD'."""
    name: str
    gco2e_per_kwh: float
    source: str = ""
    as_of: str = ""


@dataclass(frozen=True)
class ProviderPUE:
    provider: str
    pue: float
    """Power usage effectiveness: facility energy / IT energy (>= 1)."""
    source: str = ""
    as_of: str = ""


@dataclass(frozen=True)
class ExchangeRate:
    currency: str
    usd_per_unit: float
    source: str = ""
    as_of: str = ""


@dataclass(frozen=True)
class AchievableRate:
    """One row of achievable.csv: a kernel kind's achievable shares of peak on some GPUs
    (see cloudtrain.catalog.rates)."""

    key: str
    """A GPU name, a compute capability ('8.6'), an architecture ('hopper') or 'default'."""
    kernel: str
    dtype: str
    layout: str
    compute_fraction: float
    """Achieved FLOP/s / dense peak for the dtype, for a large kernel of this kind."""
    bandwidth_fraction: float
    """Achieved bytes/s / memory bandwidth, for a large kernel of this kind."""
    overhead_us: float
    """Fixed GPU time of one launch (kernel 'host': CPU time of one eager op), microseconds."""
    source: str = ""
    as_of: str = ""

    @property
    def row(self) -> str:
        """Which row: 'hopper matmul bf16/any'."""
        return f"{self.key} {self.kernel} {self.dtype}/{self.layout}"


@dataclass
class Catalog:
    """Everything the catalog knows, bundled rows merged with the user's."""

    gpus: list[GPUSpec] = field(default_factory=list)
    offers: list[Offer] = field(default_factory=list)
    regions: list[Region] = field(default_factory=list)
    grid: list[GridIntensity] = field(default_factory=list)
    pue: list[ProviderPUE] = field(default_factory=list)
    exchange_rates: list[ExchangeRate] = field(default_factory=list)
    rates: list[AchievableRate] = field(default_factory=list)
    """Achievable shares of peak per kernel kind (achievable.csv), for the roofline."""

    # Lookups (implemented in cloudtrain.catalog.lookup; indexes are built on first use).

    def gpu(self, name: str) -> GPUSpec:
        """The GPU named `name` or one of its aliases; UnknownNameError with did-you-mean."""
        from cloudtrain.catalog import lookup

        return lookup.gpu(self, name)

    def resolve_gpu(self, device_name: str) -> GPUSpec | None:
        """The GPU a device string names ('NVIDIA A100-SXM4-80GB'); None if not in the catalog."""
        from cloudtrain.catalog import lookup

        return lookup.resolve_gpu(self, device_name)

    def region(self, provider: str, region: str) -> Region | None:
        """The listed region of a provider; None if not listed."""
        from cloudtrain.catalog import lookup

        return lookup.region(self, provider, region)

    def carbon_intensity(self, provider: str, region: str) -> float | None:
        """gCO2e/kWh of a region (its own figure, else its country's); None if unknown."""
        from cloudtrain.catalog import lookup

        return lookup.carbon_intensity(self, provider, region)

    def pue_for(self, provider: str) -> float:
        """The provider's PUE, else the documented default (lookup.DEFAULT_PUE)."""
        from cloudtrain.catalog import lookup

        return lookup.pue_for(self, provider)
