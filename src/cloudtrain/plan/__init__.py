"""Planning: what to rent, how long the job takes, what it costs (pure functions).

`plan(workload, constraints, catalog)` ranks every offer x node count x pricing;
`tco(catalog, gpu, count, utilization, years)` compares renting with buying. Both take
their inputs as values and return dataclasses; nothing here prints or reads files,
except `load_workload_file`, which parses the TOML file the caller names.
"""

from cloudtrain.plan.assumptions import Assumptions
from cloudtrain.plan.presets import PRESETS, load_workload_file, preset, workload_from_mapping
from cloudtrain.plan.result import OBJECTIVES, Constraints, Estimate, Plan
from cloudtrain.plan.search import STAGES, plan
from cloudtrain.plan.tco import TCO, RentOption, tco
from cloudtrain.plan.workload import (
    Workload,
    flops_per_token,
    hardware_flops_per_sample,
    model_flops_per_sample,
    traced_workload,
    training_flops,
)

__all__ = [
    "OBJECTIVES",
    "PRESETS",
    "STAGES",
    "TCO",
    "Assumptions",
    "Constraints",
    "Estimate",
    "Plan",
    "RentOption",
    "Workload",
    "flops_per_token",
    "hardware_flops_per_sample",
    "load_workload_file",
    "model_flops_per_sample",
    "plan",
    "preset",
    "tco",
    "traced_workload",
    "training_flops",
    "workload_from_mapping",
]
