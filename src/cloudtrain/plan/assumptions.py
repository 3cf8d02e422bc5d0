"""Every default the planner uses that the user cannot see in the catalog; each one is
reported in `Plan.assumptions` and can be changed by passing a modified copy."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Assumptions:
    """Tunable defaults of the time, cost and energy models (units in the names)."""

    overlap_fraction: float = 0.8
    """Share of gradient communication that can run under the backward pass (DDP) or
    the whole micro-step (FSDP); the rest (the last buckets) is exposed."""
    comm_efficiency: float = 0.8
    """Achieved share of nominal link and network bandwidth in collectives (nccl-tests
    bus bandwidth is typically 75-85% of the nominal figure)."""
    default_network_gbps: float = 25.0
    """Instance network (Gbit/s) assumed where the catalog has none."""
    grad_reduce_bytes: float = 4.0
    """Bytes per parameter in the gradient reduction (fp32: PyTorch's default for AMP
    DDP and for FSDP's reduce dtype in torchtitan)."""
    provision_s: float = 600.0
    """From request to first step: instance start, image pull, data staging (10 min)."""
    restart_s: float = 600.0
    """Cost of one spot interruption besides the lost work: new capacity, start-up and
    checkpoint load (10 min)."""
    checkpoint_write_gb_per_s: float = 1.0
    """Checkpoint write bandwidth per node (GB/s): local NVMe or cloud disk with torch.save."""
    checkpoint_interval_s: float = 3600.0
    """Checkpoint period on non-interruptible capacity; spot uses Young's interval."""
    unknown_band_monthly_rate: float = 0.175
    """Monthly reclaimed share assumed for spot offers without a published band
    (the 15-20% band's mid-point: pessimistic but not the worst)."""
    spot_interruptions_per_node_hour: float | None = None
    """Override of the per-node hazard; None: derived from the offer's band."""
    gpu_power_fraction: float = 0.8
    """Mean GPU power during training as a share of TDP (training keeps GPUs near their
    limit; 70-90% is typical)."""
    host_power_w_per_gpu: float = 150.0
    """CPUs, memory, NICs and fans per GPU (DGX H100's maximum non-GPU draw is about
    575 W per GPU: 10.2 kW system - 8 x 700 W; typical draw is well below it)."""
    default_gco2e_per_kwh: float = 475.0
    """Grid intensity for regions of unknown country (world average, Our World in Data
    2023) when the catalog has no WORLD row."""
    cpu_images_per_s_per_vcpu: float = 150.0
    """JPEG decode + random-resized-crop + flip + normalize per vCPU (PyTorch DataLoader
    with PIL); `cloudtrain bench` measures a synthetic stand-in."""
    reserved_term_hours: float = 8760.0
    """Length of a reservation / committed-use term (1 year)."""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
