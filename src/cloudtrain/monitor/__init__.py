"""Watching the machine: NVML (the only package that calls it) and psutil sampling,
immutable snapshots, energy meters, alert rules, the stall watchdog and stack dumps.

    from cloudtrain.monitor import Sampler, Watchdog, AlertConfig

    with Sampler(store=store, run_id=run_id) as sampler:      # 1 s, background thread
        sampler.add_listener(Watchdog(AlertConfig(stall_s=300), store=store,
                                      run_id=run_id).on_snapshot)
        ...

Without a GPU (or driver) everything still works: GPU lists are empty and
`Snapshot.nvml_unavailable_reason` says why.
"""

from cloudtrain.monitor.alerts import RULES, Alert, AlertConfig, AlertRules, alert_config_from
from cloudtrain.monitor.energy import CounterMeter, CpuEnergyMeter, estimate_cpu_power_w
from cloudtrain.monitor.gpu import GPUReader
from cloudtrain.monitor.host import HostReader
from cloudtrain.monitor.keys import snapshot_metrics
from cloudtrain.monitor.nvml import Nvml, NvmlSource, PynvmlSource, RecordedSource, open_nvml
from cloudtrain.monitor.sampler import Sampler, SamplerConfig
from cloudtrain.monitor.sinks import CommandSink, StoreSink, TerminalSink, WebhookSink
from cloudtrain.monitor.snapshots import GPUSnapshot, HostSnapshot, ProcessSnapshot, Snapshot
from cloudtrain.monitor.stacks import (
    STACK_DUMP_ENV,
    enable_stack_dumps,
    enable_stack_dumps_from_env,
    request_stack_dump,
)
from cloudtrain.monitor.watchdog import Watchdog

__all__ = [
    "RULES",
    "STACK_DUMP_ENV",
    "Alert",
    "AlertConfig",
    "AlertRules",
    "CommandSink",
    "CounterMeter",
    "CpuEnergyMeter",
    "GPUReader",
    "GPUSnapshot",
    "HostReader",
    "HostSnapshot",
    "Nvml",
    "NvmlSource",
    "ProcessSnapshot",
    "PynvmlSource",
    "RecordedSource",
    "Sampler",
    "SamplerConfig",
    "Snapshot",
    "StoreSink",
    "TerminalSink",
    "Watchdog",
    "WebhookSink",
    "alert_config_from",
    "enable_stack_dumps",
    "enable_stack_dumps_from_env",
    "estimate_cpu_power_w",
    "open_nvml",
    "request_stack_dump",
    "snapshot_metrics",
]
