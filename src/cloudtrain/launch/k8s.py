"""Export a training job for Kubernetes with Kubeflow.

- `train_job`: a Kubeflow Trainer v2 `TrainJob` (trainer.kubeflow.org/v1alpha1) that
  refers to the `torch-distributed` ClusterTrainingRuntime. The runtime sets the
  torchrun environment (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
  PET_MASTER_ADDR, PET_MASTER_PORT), so the container runs plain `torchrun SCRIPT`.
  /dev/shm is a memory-backed emptyDir (the container default of 64 MiB starves
  DataLoader workers), added through `podSpecOverrides` on the runtime's `node` job
  (the field name of Trainer v2.0).
- `pytorch_job`: the legacy Training Operator `PyTorchJob` (kubeflow.org/v1) with an
  `elasticPolicy` (c10d rendezvous, min/max replicas, restarts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from cloudtrain.errors import UserError
from cloudtrain.launch.worker import worker_args

CHECKPOINT_ENV = "CLOUDTRAIN_CHECKPOINT_DIR"
TRAINER_API = "trainer.kubeflow.org/v1alpha1"
LEGACY_API = "kubeflow.org/v1"
GPU_RESOURCE = "nvidia.com/gpu"
_NODE_JOB = "node"
"""Name of the replicated job and its container in the torch-distributed runtime."""


@dataclass(frozen=True)
class K8sSpec:
    """A distributed training job for Kubernetes. Validated by the builders."""

    command: tuple[str, ...]
    """Training script and its arguments, run under torchrun."""
    image: str
    """Container image with PyTorch and the training code."""
    name: str = "cloudtrain"
    nodes: int = 1
    min_nodes: int | None = None
    """Legacy elastic PyTorchJob only: fewest nodes to keep training; None: `nodes`."""
    gpus_per_node: int = 1
    max_restarts: int = 3
    shm_gib: float | None = None
    """Size limit of /dev/shm; None: no limit beyond the pod's memory."""
    checkpoint_pvc: str | None = None
    """PersistentVolumeClaim mounted at `checkpoint_path`; None: no checkpoint volume."""
    checkpoint_path: str = "/checkpoints"
    runtime: str = "torch-distributed"
    namespace: str | None = None
    envs: dict[str, str] = field(default_factory=dict)

    def check(self) -> None:
        if not self.command:
            raise UserError("no training command; give it after `--`, e.g. -- train.py --lr 3e-4")
        if not self.image:
            raise UserError("--image is required: a container image with PyTorch and your code")
        if self.nodes < 1 or self.gpus_per_node < 0:
            raise UserError(
                f"need --nodes >= 1 and --count >= 0, got {self.nodes}, {self.gpus_per_node}"
            )
        if self.min_nodes is not None and not 1 <= self.min_nodes <= self.nodes:
            raise UserError(f"--min-nodes must be in [1, {self.nodes}], got {self.min_nodes}")
        if self.max_restarts < 0:
            raise UserError("--max-restarts must be >= 0")
        if self.shm_gib is not None and not self.shm_gib > 0:
            raise UserError("--shm-gib must be > 0")


def _metadata(spec: K8sSpec) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": spec.name}
    if spec.namespace:
        meta["namespace"] = spec.namespace
    return meta


def _env(spec: K8sSpec) -> list[dict[str, str]]:
    envs = {CHECKPOINT_ENV: spec.checkpoint_path} if spec.checkpoint_pvc else {}
    envs.update(spec.envs)
    return [{"name": key, "value": value} for key, value in envs.items()]


def _volumes(spec: K8sSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, container volumeMounts): /dev/shm in memory, optional checkpoint PVC."""
    shm: dict[str, Any] = {"medium": "Memory"}
    if spec.shm_gib is not None:
        shm["sizeLimit"] = f"{round(spec.shm_gib * 1024)}Mi"
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": shm}]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if spec.checkpoint_pvc:
        claim = {"claimName": spec.checkpoint_pvc}
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": claim})
        mounts.append({"name": "checkpoints", "mountPath": spec.checkpoint_path})
    return volumes, mounts


def _resources(spec: K8sSpec) -> dict[str, Any]:
    if spec.gpus_per_node == 0:
        return {}
    gpus = {GPU_RESOURCE: spec.gpus_per_node}
    return {"limits": dict(gpus), "requests": dict(gpus)}


def train_job(spec: K8sSpec) -> dict[str, Any]:
    """A Kubeflow Trainer v2 TrainJob running `torchrun COMMAND` on `nodes` nodes."""
    spec.check()
    volumes, mounts = _volumes(spec)
    trainer: dict[str, Any] = {
        "image": spec.image,
        "command": ["torchrun", *worker_args(spec.command)],
        "numNodes": spec.nodes,
        "numProcPerNode": max(1, spec.gpus_per_node),
    }
    resources = _resources(spec)
    if resources:
        trainer["resourcesPerNode"] = resources
    env = _env(spec)
    if env:
        trainer["env"] = env
    override = {
        "targetJobs": [{"name": _NODE_JOB}],
        "volumes": volumes,
        "containers": [{"name": _NODE_JOB, "volumeMounts": mounts}],
    }
    return {
        "apiVersion": TRAINER_API,
        "kind": "TrainJob",
        "metadata": _metadata(spec),
        "spec": {
            "runtimeRef": {
                "name": spec.runtime,
                "apiGroup": "trainer.kubeflow.org",
                "kind": "ClusterTrainingRuntime",
            },
            "trainer": trainer,
            "podSpecOverrides": [override],
        },
    }


def pytorch_job(spec: K8sSpec) -> dict[str, Any]:
    """A legacy PyTorchJob (kubeflow.org/v1) with an elastic policy over c10d rendezvous."""
    spec.check()
    volumes, mounts = _volumes(spec)
    container: dict[str, Any] = {
        "name": "pytorch",  # the Training Operator finds the container by this name
        "image": spec.image,
        "command": ["torchrun", *worker_args(spec.command)],
        "volumeMounts": mounts,
    }
    resources = _resources(spec)
    if resources:
        container["resources"] = resources
    env = _env(spec)
    if env:
        container["env"] = env
    worker = {
        "replicas": spec.nodes,
        "restartPolicy": "OnFailure",
        "template": {"spec": {"containers": [container], "volumes": volumes}},
    }
    return {
        "apiVersion": LEGACY_API,
        "kind": "PyTorchJob",
        "metadata": _metadata(spec),
        "spec": {
            "elasticPolicy": {
                "rdzvBackend": "c10d",
                "minReplicas": spec.min_nodes or spec.nodes,
                "maxReplicas": spec.nodes,
                "maxRestarts": spec.max_restarts,
            },
            "nprocPerNode": str(max(1, spec.gpus_per_node)),
            "runPolicy": {"backoffLimit": spec.max_restarts},
            "pytorchReplicaSpecs": {"Worker": worker},
        },
    }


def to_yaml(manifest: dict[str, Any]) -> str:
    return yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False)
