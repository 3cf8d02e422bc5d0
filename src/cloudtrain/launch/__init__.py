"""Launch: every process and cloud side effect of cloudtrain lives here.

- `supervise(RunSpec(...))`: `cloudtrain run`, torchrun under a supervisor with
  restarts, resume, a budget and SIGTERM-as-checkpoint (exit codes in `supervisor`).
- Spot policies (`GreedyPolicy`, `UniformProgressPolicy`, ...) that any backend able
  to switch between spot and on-demand can drive, and `simulate` to replay a trace.
- The autoscaler for a GPU pool (`AutoscalePolicy`) and its simulator.
- Exports: SkyPilot task YAML (`skypilot.build_task`), Kubeflow TrainJob/PyTorchJob
  (`k8s.train_job`, `k8s.pytorch_job`), ONNX (`onnx_export.export_onnx`, needs torch,
  onnx, onnxruntime; import it from its module).

Nothing imported here loads torch, so `import cloudtrain.launch` stays light.
"""

from __future__ import annotations

from cloudtrain.launch.autoscale import (
    AutoscaleConfig,
    AutoscalePolicy,
    FixedPool,
    JobSpec,
    PoolObservation,
    ThresholdPolicy,
    load_jobs,
    synthetic_jobs,
)
from cloudtrain.launch.autoscale_sim import PoolSimResult, simulate_pool
from cloudtrain.launch.spot_policy import (
    POLICIES,
    ClusterType,
    GreedyPolicy,
    JobState,
    OnDemandPolicy,
    SpotOnlyPolicy,
    SpotPolicy,
    UniformProgressPolicy,
    make_policy,
)
from cloudtrain.launch.spot_sim import SpotJob, SpotSimResult, compare_policies, simulate
from cloudtrain.launch.spot_trace import SpotTrace, load_trace, save_trace, synthetic_trace
from cloudtrain.launch.supervisor import (
    EXIT_BUDGET,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    RunOutcome,
    RunSpec,
    supervise,
)

__all__ = [
    "EXIT_BUDGET",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "POLICIES",
    "AutoscaleConfig",
    "AutoscalePolicy",
    "ClusterType",
    "FixedPool",
    "GreedyPolicy",
    "JobSpec",
    "JobState",
    "OnDemandPolicy",
    "PoolObservation",
    "PoolSimResult",
    "RunOutcome",
    "RunSpec",
    "SpotJob",
    "SpotOnlyPolicy",
    "SpotPolicy",
    "SpotSimResult",
    "SpotTrace",
    "ThresholdPolicy",
    "UniformProgressPolicy",
    "compare_policies",
    "load_jobs",
    "load_trace",
    "make_policy",
    "save_trace",
    "simulate",
    "simulate_pool",
    "supervise",
    "synthetic_jobs",
    "synthetic_trace",
]
