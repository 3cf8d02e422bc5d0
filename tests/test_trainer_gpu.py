"""The Trainer's CUDA paths, on a real GPU (skipped without one): what "auto" picks,
a real CUDA out-of-memory, the memory probe, MFU and GPU samples in the store."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from _train_scripts import tiny
from cloudtrain.catalog import resolve_gpu
from cloudtrain.monitor import Nvml
from cloudtrain.runtime import Callback, Trainer
from cloudtrain.runtime.precision import resolve_precision
from cloudtrain.runtime.setup import use_channels_last
from cloudtrain.store import RunStore

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _ampere_or_newer() -> bool:
    return torch.cuda.get_device_capability(0) >= (8, 0)


def _fit(model: nn.Module, loss=tiny.plain_loss, data=None, **overrides) -> tuple[Trainer, object]:
    cfg = tiny.config(**{"max_steps": 3, "micro_batch_size": "auto", **overrides})
    trainer = Trainer(model, loss, data if data is not None else tiny.dataset(), config=cfg)
    return trainer, trainer.fit()


def test_auto_precision_is_bf16_on_ampere_and_newer():
    if not _ampere_or_newer():
        pytest.skip("bf16 autocast needs compute capability 8.0+")
    precision = resolve_precision("auto", torch.device("cuda:0"), allow_tf32=True)
    assert precision.name == "bf16" and precision.autocast_dtype == torch.bfloat16
    assert precision.tf32 and not precision.grad_scaler


def test_defaults_enable_tf32_fused_adamw_and_compile():
    trainer, result = _fit(tiny.build_model(dropout=0.0), store=True)
    assert result.device == "cuda" and trainer.compiled
    assert trainer.optimizer.defaults["fused"] is True
    if _ampere_or_newer():
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    with RunStore.open() as store:
        config = store.get_run(result.run_id).config
    assert config["compile"] is True and config["device"].startswith("cuda")
    assert config["resolved_precision"] == result.precision
    assert config["device_name"] == torch.cuda.get_device_name(0)


def test_conv_model_runs_channels_last():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 2))
    images = torch.utils.data.TensorDataset(torch.randn(16, 3, 8, 8), torch.randint(0, 2, (16,)))
    assert use_channels_last("auto", model, torch.device("cuda:0"))
    seen = []

    def loss(m, batch):
        seen.append(batch[0].is_contiguous(memory_format=torch.channels_last))
        return nn.functional.cross_entropy(m(batch[0]), batch[1])

    trainer, result = _fit(model, loss, images, micro_batch_size=8, compile=False)
    assert trainer.channels_last and result.steps == 3 and seen and all(seen)


class _Hungry(nn.Module):
    """Forward allocates `bytes_per_sample` per sample of real CUDA memory; above
    `oom_above` samples it asks for twice the GPU's memory (a real CUDA OOM)."""

    def __init__(self, bytes_per_sample: int = 0, oom_above: int | None = None) -> None:
        super().__init__()
        self.inner = tiny.build_model(dropout=0.0)
        self.bytes_per_sample, self.oom_above = bytes_per_sample, oom_above

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        if self.oom_above is not None and n > self.oom_above:
            total = torch.cuda.get_device_properties(x.device).total_memory
            torch.empty(2 * total, dtype=torch.uint8, device=x.device)
        if self.bytes_per_sample:
            buffer = torch.empty(n * self.bytes_per_sample, dtype=torch.uint8, device=x.device)
            del buffer
        return self.inner(x)


def test_a_real_cuda_oom_halves_the_micro_batch():
    model = _Hungry(oom_above=4)
    _, result = _fit(model, micro_batch_size=8, compile=False)
    assert result.steps == 3 and result.micro_batch_size == 4
    assert result.oom_adjustments >= 1


def test_auto_micro_batch_uses_the_cuda_memory_probe():
    total = torch.cuda.get_device_properties(0).total_memory
    model = _Hungry(bytes_per_sample=total // 64)  # 32 samples: half the GPU
    data = torch.utils.data.TensorDataset(torch.randn(256, 6), torch.rand(256, 1).round())
    _, result = _fit(model, data=data, global_batch_size=128, memory_target_fraction=0.5,
                     compile=False)  # fmt: skip
    assert 8 <= result.micro_batch_size < 32


def test_mfu_is_computed_for_a_catalog_gpu():
    if resolve_gpu(torch.cuda.get_device_name(0)) is None:
        pytest.skip(f"{torch.cuda.get_device_name(0)} is not in the catalog")
    _, result = _fit(tiny.build_model(dropout=0.0), max_steps=5, compile=False)
    assert result.gpu_name is not None
    assert result.mfu is not None and 0 < result.mfu < 1


def test_a_fit_on_the_gpu_stores_gpu_samples():
    nvml = Nvml()
    if not nvml.available:
        pytest.skip(f"NVML unavailable: {nvml.unavailable_reason}")
    _, result = _fit(
        tiny.build_model(dropout=0.0), max_steps=20, store=True, monitor_interval_s=0.05
    )
    with RunStore.open() as store:
        samples = store.samples(result.run_id)
    assert samples and any(s.metrics.get("gpu/0/memory_used_gib") for s in samples)
    assert all(s.metrics.get("gpu/count", 0) >= 1 for s in samples)


def test_host_agreements_under_nccl_go_through_a_gloo_group(tmp_path):
    """Under NCCL the per-step flags travel as CPU tensors over a side gloo group, so
    agreeing never waits for the GPU (a one-rank NCCL group shows the wiring)."""
    import torch.distributed as dist

    from cloudtrain.runtime import distributed as D

    dist.init_process_group(
        "nccl", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1
    )
    try:
        group = D.host_plane().group
        assert group is not None and dist.get_backend(group) == "gloo"
        flags = torch.tensor([0, 1], dtype=torch.int64)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
        assert flags.tolist() == [0, 1] and D.host_plane().group is group  # created once
    finally:
        dist.destroy_process_group()


def test_fp8_precision_trains_on_hopper_and_newer():
    if torch.cuda.get_device_capability(0) < (8, 9):
        pytest.skip("FP8 needs compute capability 8.9+")
    pytest.importorskip("torchao")
    x = torch.randn(512, 64, generator=torch.Generator().manual_seed(1))
    data = torch.utils.data.TensorDataset(x, x[:, :8].sin())

    def mse(m, batch):
        return nn.functional.mse_loss(m(batch[0]).float(), batch[1])

    def train(precision: str):
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Linear(64, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 8)
        )
        with torch.no_grad():
            initial = mse(model, data[:64]).item()
        trainer, result = _fit(
            model, loss=mse, data=data, precision=precision, max_steps=40, lr=3e-3,
            micro_batch_size=64, global_batch_size=64, compile=False, log_every_steps=40,
        )  # fmt: skip
        return trainer, result, initial

    trainer, fp8, initial = train("fp8")
    _, bf16, _ = train("bf16")
    assert fp8.precision == "fp8" and bf16.precision == "bf16"
    assert type(trainer.model[2]).__name__ == "Float8Linear"  # the inner layer converted
    assert fp8.final_loss < 0.5 * initial  # it learns
    assert fp8.final_loss < 2 * bf16.final_loss  # about as well as bf16


class _ReseedCuda(Callback):
    def on_fit_start(self, trainer):
        torch.cuda.manual_seed(999)  # as if the CUDA RNG state had not been restored


def _defaults_run(steps: int, ckpt, callbacks=()):
    model = tiny.build_model()  # dropout: the CUDA RNG decides what each step computes
    log = tiny.LossLog()
    cfg = tiny.config(max_steps=steps, checkpoint_dir=ckpt)
    data = tiny.dataset()
    trainer = Trainer(model, tiny.noisy_loss, data, config=cfg, callbacks=[log, *callbacks])
    trainer.fit()
    return trainer, model, log.losses


def test_a_resume_on_the_gpu_is_bit_identical(tmp_path):
    """With the CUDA defaults (compile, bf16 autocast, fused AdamW), dropout and
    accumulation, a run cut at step 3 and resumed equals the uncut run bit for bit;
    reseeding the CUDA RNG after the restore (the negative control) breaks that."""
    trainer, reference, reference_losses = _defaults_run(8, None)
    assert trainer.device.type == "cuda" and trainer.compiled
    _, _, first = _defaults_run(3, tmp_path / "exact")
    _, resumed, second = _defaults_run(8, tmp_path / "exact")
    assert sorted(second) == list(range(4, 9))
    assert {**first, **second} == reference_losses
    assert tiny.same_params(resumed, reference)
    _defaults_run(3, tmp_path / "sloppy")
    _, sloppy, _ = _defaults_run(8, tmp_path / "sloppy", [_ReseedCuda()])
    assert not tiny.same_params(sloppy, reference)


def test_without_a_gloo_group_agreements_fall_back_to_the_gpu(tmp_path, monkeypatch, capsys):
    """A gloo group that cannot connect (simulated: new_group raises) costs a host sync
    per step, not the run: agreements go through NCCL on CUDA tensors, with one line."""
    import torch.distributed as dist

    from cloudtrain.runtime import distributed as D

    def cannot_connect(*args, **kwargs):
        raise RuntimeError("Gloo connectFullMesh failed")

    dist.init_process_group(
        "nccl", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1
    )
    monkeypatch.setattr(dist, "new_group", cannot_connect)
    try:
        plane = D.host_plane()
        assert plane.group is None and plane.device.type == "cuda"
        assert D._all_reduce_ints([3, 0], dist.ReduceOp.MAX) == [3, 0]
        assert "GLOO_SOCKET_IFNAME" in capsys.readouterr().err
    finally:
        dist.destroy_process_group()
