"""Explaining runs and machines: `doctor` (environment checks, each with its fix), rules that
turn a run's recorded telemetry into findings (symptom, evidence, cause, fix, expected
gain), and the energy/carbon account of a run.

    from cloudtrain.diagnose import run_doctor, diagnose_run
    report = run_doctor(data_dir="/data")           # DoctorReport: pass/warn/fail checks
    with RunStore.open() as store:
        diagnosis = diagnose_run(store, "my-run")   # findings stored with the run
"""

from cloudtrain.diagnose.checks import STATUSES, Check, GPUFacts
from cloudtrain.diagnose.data import RunData
from cloudtrain.diagnose.doctor import DoctorReport, TorchFacts, run_doctor
from cloudtrain.diagnose.energy import EnergyAccount, account_energy
from cloudtrain.diagnose.run import RULES, Diagnosis, diagnose, diagnose_run, load_run_data

__all__ = [
    "RULES",
    "STATUSES",
    "Check",
    "Diagnosis",
    "DoctorReport",
    "EnergyAccount",
    "GPUFacts",
    "RunData",
    "TorchFacts",
    "account_energy",
    "diagnose",
    "diagnose_run",
    "load_run_data",
    "run_doctor",
]
