"""`cloudtrain diagnose RUN`: every rule over a run's recorded steps, samples and events,
findings sorted by severity and stored with the run, plus its energy account."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cloudtrain.catalog import Catalog, load_catalog, lookup
from cloudtrain.diagnose import rules, rules_system
from cloudtrain.diagnose.data import RunData
from cloudtrain.diagnose.energy import EnergyAccount, account_energy
from cloudtrain.store import Finding, Run, RunStore

Rule = Callable[[RunData], Finding | None]

RULES: dict[str, Rule] = {
    "input_bound": rules.input_bound,
    "host_bound": rules.host_bound,
    "small_micro_batch": rules.small_micro_batch,
    "fp32_precision": rules.fp32_precision,
    "tf32_off": rules.tf32_off,
    "low_mfu": rules.low_mfu,
    "memory_headroom": rules.memory_headroom,
    "oom_adjustments": rules_system.oom_adjustments,
    "throttling": rules_system.throttling,
    "stall": rules_system.stall,
    "communication_bound": rules_system.communication_bound,
    "stragglers": rules_system.stragglers,
}
"""Every rule by name, in the order findings of equal severity are listed."""

_SEVERITY_ORDER = {"critical": 0, "warn": 1, "info": 2}


@dataclass(frozen=True)
class Diagnosis:
    run: Run
    findings: list[Finding]
    energy: EnergyAccount


def load_run_data(store: RunStore, ref: str, catalog: Catalog | None = None) -> RunData:
    """The run `ref` (id, id prefix or name) with its telemetry and GPU spec."""
    run = store.get_run(ref)
    catalog = catalog if catalog is not None else load_catalog()
    spec = lookup.resolve_gpu(catalog, run.gpu_name) if run.gpu_name else None
    return RunData(run, store.steps(run.id), store.samples(run.id), store.events(run.id), spec)


def diagnose(data: RunData) -> list[Finding]:
    """Findings of all rules, most severe first."""
    found = [f for rule in RULES.values() if (f := rule(data)) is not None]
    return sorted(found, key=lambda f: _SEVERITY_ORDER.get(f.severity, 3))


def diagnose_run(
    store: RunStore, ref: str, *, catalog: Catalog | None = None, save: bool = True
) -> Diagnosis:
    """Diagnose a stored run; with `save`, replace its stored findings and record its energy
    in the run summary (under "energy")."""
    catalog = catalog if catalog is not None else load_catalog()
    data = load_run_data(store, ref, catalog)
    findings = diagnose(data)
    energy = account_energy(data.run, data.samples, catalog)
    run = data.run
    if save:
        store.replace_findings(run.id, findings)
        run = store.update_run(run.id, summary={"energy": energy.as_summary()})
    return Diagnosis(run, findings, energy)
