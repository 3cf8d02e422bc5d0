"""Export a training job as a SkyPilot task YAML (https://docs.skypilot.co).

The task runs `python -m torch.distributed.run` on every node with the node count,
rank, GPUs per node and head address SkyPilot provides (SKYPILOT_NUM_NODES,
SKYPILOT_NODE_RANK, SKYPILOT_NUM_GPUS_PER_NODE, first line of SKYPILOT_NODE_IPS).
With `spot`, `resources.any_of` lists a spot and an on-demand candidate, so SkyPilot
falls back to on-demand when spot is out of capacity. `job_recovery` applies to
managed jobs (`sky jobs launch task.yaml`). A checkpoint bucket is mounted with
MOUNT_CACHED (writes go to local disk first and are uploaded in the background), and
its path is handed to the training script as CLOUDTRAIN_CHECKPOINT_DIR.

SkyPilot itself accepts any accelerator name and recovery strategy when it parses a
task and fails only at launch; `build_task` checks both up front.
"""

from __future__ import annotations

import importlib.util
import shlex
from dataclasses import dataclass, field
from typing import Any

import yaml

from cloudtrain.errors import UnknownNameError, UserError
from cloudtrain.launch.worker import worker_args

CHECKPOINT_ENV = "CLOUDTRAIN_CHECKPOINT_DIR"
RECOVERY_STRATEGIES = ("EAGER_NEXT_REGION", "FAILOVER")
"""SkyPilot managed-job recovery strategies (EAGER_NEXT_REGION is SkyPilot's default)."""

# Infra names SkyPilot 0.14 registers (`sky.utils.registry.CLOUD_REGISTRY`), plus k8s.
SKYPILOT_CLOUDS = (
    "aws", "azure", "cudo", "do", "fluidstack", "gcp", "hyperbolic", "ibm", "k8s",
    "kubernetes", "lambda", "nebius", "oci", "paperspace", "runpod", "scp", "slurm",
    "ssh", "vast", "vsphere",
)  # fmt: skip

# Catalog GPU name -> SkyPilot accelerator name (SkyPilot's catalogs name the SXM
# A100 40GB "A100", the 16 GB V100 "V100", the H100 SXM "H100").
CATALOG_TO_SKYPILOT = {
    "T4": "T4", "A10G": "A10G", "A10": "A10", "L4": "L4", "L40S": "L40S",
    "RTX-A6000": "A6000", "RTX-4090": "RTX4090", "V100-16GB": "V100",
    "V100-32GB": "V100-32GB", "A30": "A30", "A100-40GB": "A100",
    "A100-80GB": "A100-80GB", "H100-SXM": "H100", "H200": "H200", "B200": "B200",
    "MI300X": "MI300X",
}  # fmt: skip
SKYPILOT_ACCELERATORS = (
    *sorted(set(CATALOG_TO_SKYPILOT.values())),
    *("GH200", "H100-MEGA", "L40", "K80", "P100", "A5000", "A4000", "RTX3090"),
)


@dataclass(frozen=True)
class SkyPilotSpec:
    """What to run and on what. Validated by `build_task`."""

    command: tuple[str, ...]
    """Training script and its arguments, e.g. ('train.py', '--lr', '3e-4')."""
    gpu: str
    """Catalog or SkyPilot GPU name ('H100', 'A100-80GB', ...)."""
    gpus_per_node: int = 1
    nodes: int = 1
    infra: str | None = None
    """'aws', 'gcp/us-central1', 'k8s', ...; None lets SkyPilot pick any enabled cloud."""
    spot: bool = False
    """Prefer spot, with on-demand as the fallback candidate."""
    disk_gb: int | None = None
    """Boot disk size; None keeps SkyPilot's default."""
    max_restarts: int = 3
    """Restarts on user-code errors (`max_restarts_on_errors`); preemptions always recover."""
    recovery_strategy: str = "EAGER_NEXT_REGION"
    bucket: str | None = None
    """Checkpoint bucket: a URL (s3://, gs://, r2://, ...) or a bucket name SkyPilot
    creates; None keeps checkpoints on the node's disk (lost when it is replaced)."""
    checkpoint_path: str = "/checkpoints"
    setup: str | None = None
    """Shell commands run once per node before the job (e.g. pip install)."""
    name: str = "cloudtrain"
    workdir: str | None = "."
    """Directory synced to the nodes; None syncs nothing."""
    master_port: int = 29500
    envs: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_offer(cls, offer: Any, command: tuple[str, ...], **options: Any) -> SkyPilotSpec:
        """A spec for a catalog `Offer` (the choice of a plan): GPU, count, cloud/region, spot."""
        return cls(
            command=command,
            gpu=offer.gpu,
            gpus_per_node=offer.gpu_count,
            infra=f"{offer.provider.lower()}/{offer.region}",
            spot=options.pop("spot", offer.spot_usd_per_hour is not None),
            **options,
        )


def skypilot_accelerator(name: str, catalog: Any | None = None) -> str:
    """SkyPilot's accelerator name for a catalog or SkyPilot GPU name, or UnknownNameError."""
    by_lower = {n.lower(): n for n in SKYPILOT_ACCELERATORS}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    if catalog is None:
        from cloudtrain.catalog import load_catalog

        catalog = load_catalog()
    spec = catalog.resolve_gpu(name)
    if spec is None:
        choices = [*SKYPILOT_ACCELERATORS, *(gpu.name for gpu in catalog.gpus)]
        raise UnknownNameError("GPU", name, choices)
    if spec.name not in CATALOG_TO_SKYPILOT:
        raise UserError(
            f"GPU '{name}' ({spec.name}) has no SkyPilot accelerator name known here; "
            f"use one SkyPilot lists (`sky show-gpus`), e.g. {', '.join(SKYPILOT_ACCELERATORS[:6])}"
        )
    return CATALOG_TO_SKYPILOT[spec.name]


def _check_spec(spec: SkyPilotSpec) -> str:
    """Validate; returns the recovery strategy in SkyPilot's spelling."""
    if not spec.command:
        raise UserError("no training command; give it after `--`, e.g. -- train.py --lr 3e-4")
    if spec.gpus_per_node < 1 or spec.nodes < 1:
        raise UserError(f"--count and --nodes must be >= 1, got {spec.gpus_per_node}, {spec.nodes}")
    if spec.max_restarts < 0:
        raise UserError(f"--max-restarts must be >= 0, got {spec.max_restarts}")
    if spec.disk_gb is not None and spec.disk_gb < 1:
        raise UserError(f"--disk-gb must be >= 1, got {spec.disk_gb}")
    if spec.infra is not None:
        cloud = spec.infra.split("/", 1)[0].lower()
        if cloud not in SKYPILOT_CLOUDS:
            raise UnknownNameError("SkyPilot infra", cloud, SKYPILOT_CLOUDS)
    strategy = spec.recovery_strategy.upper().replace("-", "_")
    if strategy not in RECOVERY_STRATEGIES:
        raise UnknownNameError("recovery strategy", spec.recovery_strategy, RECOVERY_STRATEGIES)
    return strategy


def torchrun_line(spec: SkyPilotSpec) -> str:
    """The run section: torchrun on every node from SkyPilot's environment."""
    script = shlex.join(worker_args(spec.command))
    return (
        'MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)\n'
        "python -m torch.distributed.run \\\n"
        '  --nnodes="$SKYPILOT_NUM_NODES" \\\n'
        '  --nproc-per-node="$SKYPILOT_NUM_GPUS_PER_NODE" \\\n'
        '  --node-rank="$SKYPILOT_NODE_RANK" \\\n'
        '  --master-addr="$MASTER_ADDR" \\\n'
        f"  --master-port={spec.master_port} \\\n"
        f"  {script}\n"
    )


def build_task(spec: SkyPilotSpec, catalog: Any | None = None) -> dict[str, Any]:
    """The SkyPilot task as a dict (the YAML's content), after our own checks."""
    strategy = _check_spec(spec)
    resources: dict[str, Any] = {}
    if spec.infra:
        resources["infra"] = spec.infra
    resources["accelerators"] = f"{skypilot_accelerator(spec.gpu, catalog)}:{spec.gpus_per_node}"
    if spec.disk_gb is not None:
        resources["disk_size"] = spec.disk_gb
    if spec.spot:
        resources["any_of"] = [{"use_spot": True}, {"use_spot": False}]
    resources["job_recovery"] = {"strategy": strategy, "max_restarts_on_errors": spec.max_restarts}
    task: dict[str, Any] = {"name": spec.name, "resources": resources, "num_nodes": spec.nodes}
    if spec.workdir:
        task["workdir"] = spec.workdir
    envs = {CHECKPOINT_ENV: spec.checkpoint_path if spec.bucket else "~/checkpoints"}
    task["envs"] = {**envs, **spec.envs}
    if spec.bucket:
        task["file_mounts"] = {spec.checkpoint_path: _bucket_mount(spec.bucket)}
    if spec.setup:
        task["setup"] = spec.setup.rstrip("\n") + "\n"
    task["run"] = torchrun_line(spec)
    return task


def _bucket_mount(bucket: str) -> dict[str, Any]:
    if "://" in bucket:
        return {"source": bucket, "mode": "MOUNT_CACHED"}
    if not bucket or "/" in bucket:
        raise UserError(f"--bucket '{bucket}' must be a URL (s3://name) or a plain bucket name")
    return {"name": bucket, "mode": "MOUNT_CACHED", "persistent": True}


class _BlockDumper(yaml.SafeDumper):
    """YAML with multi-line strings written as `|` blocks."""


def _str_presenter(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str_presenter)


def to_yaml(task: dict[str, Any]) -> str:
    return yaml.dump(task, Dumper=_BlockDumper, sort_keys=False, default_flow_style=False)


def skypilot_available() -> bool:
    """Is SkyPilot importable (`pip install "cloudtrain[sky]"` or `pip install skypilot`)."""
    return importlib.util.find_spec("sky") is not None


def check_with_skypilot(task: dict[str, Any]) -> str:
    """Parse `task` with SkyPilot's own `sky.Task.from_yaml_config`; returns its version.

    Raises UserError with SkyPilot's message when it rejects the task, and when
    SkyPilot is not installed (install it with `pip install skypilot`).
    """
    if not skypilot_available():
        raise UserError("SkyPilot is not installed; `pip install skypilot` to check with it")
    import sky

    try:
        sky.Task.from_yaml_config(task)
    except Exception as error:  # SkyPilot raises several types for schema errors
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise UserError(
            f"SkyPilot rejects the task: {type(error).__name__}: {first_line}"
        ) from error
    return str(getattr(sky, "__version__", "unknown"))


def with_cluster_type(task: dict[str, Any], kind: str) -> dict[str, Any]:
    """A copy of `task` pinned to 'spot' or 'on-demand' (no any_of), for a controller that
    lets a spot policy choose (see docs/launch.md); 'none' is not a task: stop the job."""
    if kind not in ("spot", "on-demand"):
        raise UserError(f"cluster type must be 'spot' or 'on-demand', not '{kind}'")
    resources = {k: v for k, v in task["resources"].items() if k != "any_of"}
    resources["use_spot"] = kind == "spot"
    return {**task, "resources": resources}
