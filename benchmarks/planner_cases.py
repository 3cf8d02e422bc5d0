"""Measured training steps the planner is checked against, and how to predict one.

Two kinds of source besides the published LLM runs in validate_planner.py:

- timm's published training benchmark on one RTX 3090 (`data/timm_rtx3090_train.csv`:
  PyTorch 1.12, fp16 autocast, SGD as a for-loop — PyTorch 1.12's default — NCHW and
  channels_last), for the models in `zoo/`;
- measurements on one H200 (`../shared/reference/h200_calibration.md`, 2026-11-29, and
  `results/gpu-2026-11-29-H200/train_throughput_*.json`).

Every prediction traces the model with `cloudtrain.profiling.profile_model` and asks
the planner for a one-GPU plan at the measured micro-batch; nothing is set per model.
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))

from cloudtrain.catalog import Catalog, Offer  # noqa: E402
from cloudtrain.plan import Constraints, Estimate, plan, traced_workload  # noqa: E402
from cloudtrain.plan.profile import ModelProfile  # noqa: E402

TIMM_CSV = HERE / "data" / "timm_rtx3090_train.csv"
H200_SOURCE = "measured on an H200, 2026-11-29 (shared/reference/h200_calibration.md)"
TRAIN_THROUGHPUT_SOURCE = "benchmarks/results/gpu-2026-11-29-H200/train_throughput_*.json"


@dataclass(frozen=True)
class Case:
    """One measured training step and what ran it."""

    source: str
    label: str
    model: str
    """A zoo model name, or 'examples-gpt' for examples/gpt.py."""
    gpu: str
    batch: int
    measured_step_s: float
    precision: str
    channels_last: bool = False
    optimizer: str = "adamw"
    optimizer_impl: str = "foreach"
    compile: bool = False
    tf32: bool | None = None
    build: dict[str, Any] = field(default_factory=dict)


def timm_cases() -> list[Case]:
    rows = [r for r in csv.DictReader(line for line in TIMM_CSV.open() if line[0] != "#")]
    return [
        Case(
            source=f"timm RTX 3090 ({r['layout'].upper()})",
            label=r["model"],
            model=r["model"],
            gpu="RTX-3090",
            batch=int(r["train_batch_size"]),
            measured_step_s=float(r["train_step_time_ms"]) / 1000.0,
            precision="fp16",
            channels_last=r["layout"] == "nhwc",
            optimizer="sgd",
            optimizer_impl="plain",
        )
        for r in rows
    ]


def h200_cases() -> list[Case]:
    gpt = {"model": "gpt2", "gpu": "H200", "source": "H200 calibration"}
    resnet = {"model": "resnet50", "gpu": "H200", "source": "H200 calibration",
              "batch": 256, "optimizer": "sgd"}  # fmt: skip
    return [
        Case(label="GPT-2 fp32, TF32 off", batch=16, measured_step_s=0.3016, precision="fp32",
             tf32=False, **gpt),
        Case(label="GPT-2 fp32, TF32 on", batch=16, measured_step_s=0.1038, precision="tf32",
             **gpt),
        Case(label="GPT-2 bf16", batch=16, measured_step_s=0.0506, precision="bf16", **gpt),
        Case(label="GPT-2 fp16", batch=16, measured_step_s=0.0516, precision="fp16", **gpt),
        Case(label="GPT-2 bf16 fused AdamW", batch=16, measured_step_s=0.0428,
             precision="bf16", optimizer_impl="fused", **gpt),
        Case(label="GPT-2 bf16 fused compile", batch=16, measured_step_s=0.0326,
             precision="bf16", optimizer_impl="fused", compile=True, **gpt),
        Case(label="GPT-2 bf16 fused compile B32", batch=32, measured_step_s=0.0630,
             precision="bf16", optimizer_impl="fused", compile=True, **gpt),
        Case(label="ResNet-50 fp32, TF32 off", measured_step_s=0.2407, precision="fp32",
             tf32=False, **resnet),
        Case(label="ResNet-50 fp32, TF32 on", measured_step_s=0.1156, precision="tf32",
             **resnet),
        Case(label="ResNet-50 bf16 NCHW", measured_step_s=0.1045, precision="bf16", **resnet),
        Case(label="ResNet-50 bf16 channels_last", measured_step_s=0.0544, precision="bf16",
             channels_last=True, **resnet),
    ]  # fmt: skip


def throughput_cases() -> list[Case]:
    """The train_throughput benchmark's hand-written loops on the H200."""
    source = "H200 train_throughput"
    gpt = {"source": source, "model": "examples-gpt", "gpu": "H200", "batch": 16}
    return [
        Case(label="examples/gpt.py fp32 (PyTorch defaults)", measured_step_s=0.29858,
             precision="fp32", **gpt),
        Case(label="examples/gpt.py bf16 TF32 fused compile", measured_step_s=0.04069,
             precision="bf16", optimizer_impl="fused", compile=True, **gpt),
        Case(label="ResNet-50 fp32 (PyTorch defaults)", source=source, model="resnet50",
             gpu="H200", batch=256, measured_step_s=256 / 2074.0, precision="fp32",
             optimizer="adamw"),
        Case(label="ResNet-50 bf16 channels_last fused compile", source=source,
             model="resnet50", gpu="H200", batch=256, measured_step_s=256 / 6310.0,
             precision="bf16", channels_last=True, optimizer="adamw",
             optimizer_impl="fused", compile=True),
    ]  # fmt: skip


def all_cases() -> list[Case]:
    return [*timm_cases(), *h200_cases(), *throughput_cases()]


def build_model(case: Case) -> tuple[Any, Any, Any]:
    """(model, batch of 2, loss_fn) on the meta device."""
    import torch

    if case.model == "examples-gpt":
        from gpt import GPT, GPTConfig, gpt_loss

        with torch.device("meta"):
            model = GPT(GPTConfig(50304, 1024, 12, 12, 768))
        tokens = torch.randint(0, 50304, (2, 1024), device="meta")
        return model, (tokens, tokens), gpt_loss
    import zoo

    spec = zoo.MODELS[case.model]
    with torch.device("meta"):
        model = spec.build(**case.build)
    return model, zoo.example_batch(spec, 2, device="meta"), zoo.loss_fn(spec)


def profile_case(case: Case) -> ModelProfile:
    from cloudtrain.profiling import profile_model

    model, batch, loss_fn = build_model(case)
    return profile_model(
        model, batch, loss_fn, precision=case.precision, channels_last=case.channels_last,
        name=case.model,
    )  # fmt: skip


def predict(case: Case, profile: ModelProfile, catalog: Catalog) -> Estimate:
    """The planner's one-GPU estimate at the case's micro-batch. The GPU's memory is
    lifted so that step time is judged even where the memory model disagrees with the
    batch that ran (memory is judged apart: `memory_fits`)."""
    workload = traced_workload(
        profile, global_batch=case.batch, samples_per_epoch=case.batch * 100,
        micro_batch=case.batch, optimizer=case.optimizer, optimizer_impl=case.optimizer_impl,
        compile=case.compile, tf32=case.tf32,
    )  # fmt: skip
    gpu = replace(catalog.gpu(case.gpu), memory_gib=100_000.0)
    others = [g for g in catalog.gpus if g.name != gpu.name]
    offer = Offer(
        provider="measured", region="n/a", instance_type=f"1x{gpu.name}", gpu=gpu.name,
        gpu_count=1, vcpus=64, ram_gib=512, price_usd_per_hour=1.0,
    )  # fmt: skip
    single = Catalog(gpus=[*others, gpu], offers=[offer], rates=catalog.rates)
    result = plan(workload, Constraints(max_nodes=1, pricings=("on_demand",)), single)
    if result.best is None:
        raise SystemExit(f"{case.label}: the planner found no plan ({result.why_empty})")
    return result.best


def predicted_memory_gib(case: Case, profile: ModelProfile, catalog: Catalog) -> float:
    """Memory per GPU the planner predicts at the case's micro-batch (GiB)."""
    from cloudtrain.plan.memory import memory_fit

    workload = traced_workload(
        profile, global_batch=case.batch, samples_per_epoch=case.batch,
        optimizer=case.optimizer,
    )  # fmt: skip
    fit = memory_fit(workload, catalog.gpu(case.gpu).memory_gib, 1, "ddp", False)
    return fit.total_gib(case.batch)
