"""The Trainer on CPU: config validation, accumulation, data sources, eval, schedulers,
the auto micro-batch, and what it records in the run store."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from _train_scripts import tiny
from cloudtrain.errors import UserError
from cloudtrain.runtime import TrainConfig, Trainer
from cloudtrain.runtime.batch import concat_batches, count_tokens, slice_batch
from cloudtrain.runtime.precision import resolve_precision
from cloudtrain.runtime.setup import use_channels_last, use_compile
from cloudtrain.store import RunStore


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "needs a limit"),
        ({"max_steps": 0}, "max_steps must be a positive"),
        ({"max_steps": 1, "micro_batch_size": 64, "global_batch_size": 8}, "exceeds"),
        ({"max_steps": 1, "precision": "int4"}, "precision must be one of"),
        ({"max_steps": 1, "checkpoint_every_steps": 5}, "checkpoint_dir is None"),
        ({"max_steps": 1, "device": "tpu"}, "device must be"),
        ({"max_steps": 1, "memory_target_fraction": 1.5}, r"\(0, 1\]"),
    ],
)
def test_config_rejects_bad_values_with_the_fix(kwargs, match):
    with pytest.raises(UserError, match=match):
        TrainConfig(**kwargs)


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _fit(micro: int, steps: int = 6, **kw):
    model = tiny.build_model(dropout=0.0)
    cfg = tiny.config(max_steps=steps, micro_batch_size=micro, **kw)
    result = Trainer(model, tiny.plain_loss, tiny.dataset(), config=cfg).fit()
    return model, result


def test_accumulation_matches_one_big_batch_within_float_tolerance():
    big, _ = _fit(8)
    small, result = _fit(2)
    assert result.micro_batch_size == 2
    for a, b in zip(_params(big), _params(small), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_training_reduces_the_loss_and_reports_a_summary():
    model = tiny.build_model(dropout=0.0)
    cfg = tiny.config(max_steps=40, micro_batch_size=8, store=True, run_name="tiny-fit")
    result = Trainer(model, tiny.plain_loss, tiny.dataset(), config=cfg).fit()
    assert result.steps == 40 and result.stopped_by == "max_steps"
    assert result.final_loss < 0.45  # from ~0.69 (a coin flip)
    assert result.samples_per_s > 0 and result.mfu is None  # CPU: no catalog peak
    assert result.flops_per_step > 0 and result.precision == "fp32"
    assert "steps 0 -> 40" in result.summary()
    with RunStore.open() as store:
        run = store.get_run(result.run_id)
        steps = store.steps(result.run_id)
    assert run.status == "completed" and run.name == "tiny-fit"
    assert [s.step for s in steps] == list(range(1, 41))
    assert steps[-1].micro_batch == 8 and steps[-1].samples == 8 and steps[-1].lr == 0.05
    assert steps[-1].loss == pytest.approx(result.final_loss, rel=1e-6)
    assert steps[-1].grad_norm is not None and steps[-1].flops > 0


def test_max_epochs_stops_after_whole_passes():
    _, result = _fit(8, steps=None, max_epochs=2)
    assert result.steps == 2 * 96 // 8 and result.stopped_by == "max_epochs"


def test_iterable_of_batches_is_split_and_resumes(tmp_path):
    data = tiny.dataset().tensors
    batches = [(data[0][i : i + 5], data[1][i : i + 5]) for i in range(0, 95, 5)]  # 5 per item
    seen = []

    def loss(model, batch):
        seen.append(batch[0].shape[0])
        return tiny.plain_loss(model, batch)

    cfg = tiny.config(max_steps=3, micro_batch_size=4, checkpoint_dir=tmp_path)
    Trainer(tiny.build_model(), loss, batches, config=cfg).fit()
    assert seen == [4] + [4, 4] * 3  # one pass counts the FLOPs, then 3 steps x 2 micro
    cfg = tiny.config(max_steps=5, micro_batch_size=4, checkpoint_dir=tmp_path)
    trainer = Trainer(tiny.build_model(), loss, batches, config=cfg)
    trainer.fit()
    # 5 steps of 8 samples = 40 samples = 8 whole items: the position says so
    assert trainer.source.position.offset == 8 and trainer.source.position.item_offset == 0


def test_a_one_shot_generator_ends_with_data_exhausted():
    data = tiny.dataset().tensors
    gen = ((data[0][i : i + 8], data[1][i : i + 8]) for i in range(0, 24, 8))
    cfg = tiny.config(max_steps=100, micro_batch_size=8)
    result = Trainer(tiny.build_model(), tiny.plain_loss, gen, config=cfg).fit()
    assert result.steps == 3 and result.stopped_by == "data_exhausted"


def test_eval_scheduler_and_clipping():
    evals = []

    class Seen(tiny.Callback):
        def on_eval(self, trainer, step, eval_loss):
            evals.append((step, eval_loss))

    cfg = tiny.config(max_steps=6, eval_every_steps=3, grad_clip_norm=0.5)
    trainer = Trainer(
        tiny.build_model(),
        tiny.plain_loss,
        tiny.dataset(),
        config=cfg,
        eval_data=tiny.dataset(),
        callbacks=[Seen()],
        lr_scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
    )
    result = trainer.fit()
    assert [s for s, _ in evals] == [3, 6, 6]
    assert result.eval_loss == evals[-1][1]
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**6)


def test_auto_micro_batch_finds_the_largest_that_fits():
    model = tiny.build_model()
    model.oom_above = 5  # forward raises torch.OutOfMemoryError above 5 samples
    cfg = tiny.config(max_steps=2, global_batch_size=16, micro_batch_size="auto")
    result = Trainer(model, tiny.plain_loss, tiny.dataset(), config=cfg).fit()
    assert result.micro_batch_size == 5
    assert result.oom_adjustments == 0


def test_auto_micro_batch_on_cpu_without_a_limit_is_the_whole_batch():
    _, result = _fit("auto", steps=1)
    assert result.micro_batch_size == 8


def test_trials_leave_no_trace():
    """The auto search runs extra passes; the run must equal one with a fixed size."""
    a, _ = _fit("auto", steps=4)
    b, _ = _fit(8, steps=4)
    assert all(torch.equal(x, y) for x, y in zip(_params(a), _params(b), strict=True))


def test_defaults_on_cpu():
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu, allow_tf32=True).name == "fp32"
    assert resolve_precision("bf16", cpu, allow_tf32=True).autocast_dtype == torch.bfloat16
    assert not use_compile("auto", cpu)
    conv = nn.Sequential(nn.Conv2d(3, 4, 3))
    assert not use_channels_last("auto", conv, cpu) and use_channels_last(True, conv, cpu)


def test_bf16_autocast_on_cpu_trains():
    _, result = _fit(4, steps=3, precision="bf16")
    assert result.precision == "bf16" and result.final_loss == result.final_loss  # not NaN


def test_batch_helpers():
    batch = {"ids": torch.arange(12).view(4, 3), "w": torch.ones(4)}
    halves = [slice_batch(batch, 0, 2), slice_batch(batch, 2, 4)]
    joined = concat_batches(halves)
    assert torch.equal(joined["ids"], batch["ids"]) and count_tokens(batch) == 12
    assert count_tokens((torch.randn(4, 3, 8, 8), torch.arange(4))) is None


def test_a_resumed_run_stays_one_run_in_the_store(tmp_path):
    ids = []
    for steps in (3, 6):
        cfg = tiny.config(max_steps=steps, checkpoint_dir=tmp_path, store=True)
        ids.append(
            Trainer(tiny.build_model(), tiny.plain_loss, tiny.dataset(), config=cfg).fit().run_id
        )
    assert ids[0] == ids[1]
    with RunStore.open() as store:
        assert [s.step for s in store.steps(ids[0])] == [1, 2, 3, 4, 5, 6]
        assert [e.kind for e in store.events(ids[0], kind="resume")] == ["resume"]
        assert store.get_run(ids[0]).status == "completed"


class _FakeProbe:
    """A device of 1000 bytes where a pass over n samples peaks at 100 * n bytes."""

    def __init__(self) -> None:
        self.last_n = 0
        self.trials: list[int] = []

    def reset(self) -> None:
        self.last_n = 0

    def peak_bytes(self) -> int:
        self.trials.append(self.last_n)
        return 100 * self.last_n

    def capacity_bytes(self) -> int:
        return 1000


def test_auto_micro_batch_respects_the_memory_target_of_a_probe():
    probe = _FakeProbe()

    def loss(model, batch):
        probe.last_n = batch[0].shape[0]
        return tiny.plain_loss(model, batch)

    # target 0.8 x 1000 bytes = 800 -> at most 8 samples; per-rank batch 16
    cfg = tiny.config(
        max_steps=1, global_batch_size=16, micro_batch_size="auto", memory_target_fraction=0.8
    )
    result = Trainer(tiny.build_model(), loss, tiny.dataset(), config=cfg, memory_probe=probe).fit()
    assert result.micro_batch_size == 8
    assert probe.trials == [16, 1, 2, 4, 8, 12, 10, 9]  # whole batch, grow, bisect


class _Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(6, 6), nn.Tanh()) for _ in range(3))
        self.head = nn.Linear(6, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_activation_checkpointing_gives_the_same_training():
    models = []
    for flag in (False, True):
        model = _Stack()
        cfg = tiny.config(max_steps=4, activation_checkpointing=flag)
        Trainer(model, tiny.plain_loss, tiny.dataset(), config=cfg).fit()
        models.append(model)
    assert list(models[1].state_dict()) == list(models[0].state_dict())  # keys unchanged
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_conv_model_channels_last_on_cpu():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(2))
    images = torch.utils.data.TensorDataset(torch.randn(16, 3, 8, 8), torch.randint(0, 2, (16,)))
    cfg = tiny.config(max_steps=2, channels_last=True)

    def loss(m, batch):
        assert batch[0].is_contiguous(memory_format=torch.channels_last)
        return nn.functional.cross_entropy(m(batch[0]), batch[1])

    model(images[:2][0])  # materialise the lazy layer
    assert Trainer(model, loss, images, config=cfg).fit().steps == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_defaults_bf16_compile_fused_and_mfu():
    model = tiny.build_model(dropout=0.0)
    cfg = tiny.config(max_steps=5, micro_batch_size="auto", store=True)
    result = Trainer(model, tiny.plain_loss, tiny.dataset(), config=cfg).fit()
    assert result.device == "cuda" and result.precision in ("bf16", "fp16")
    assert result.final_loss == result.final_loss


def test_dataloader_defaults_come_from_the_machine(monkeypatch):
    from cloudtrain.runtime import data as D

    monkeypatch.setattr(D.os, "sched_getaffinity", lambda pid: set(range(32)), raising=False)
    assert D.default_num_workers("cuda", local_world=8) == 3  # 32 cores / 8 GPUs - 1
    assert D.default_num_workers("cuda", local_world=1) == 8  # capped
    assert D.default_num_workers("cpu", local_world=1) == 0  # workers would fight the model
    common = dict(global_batch=8, rank=0, world=1, seed=0, device_type="cuda", local_world=8)
    source = D.make_source(tiny.dataset(), **common)
    loader = source.loader
    assert loader.num_workers == 3 and loader.pin_memory
    assert loader.persistent_workers and loader.prefetch_factor == 4
    inline = D.make_source(tiny.dataset(), **{**common, "device_type": "cpu"}).loader
    assert inline.num_workers == 0 and not inline.pin_memory


def test_is_main_is_rank_zero_or_a_single_process(monkeypatch):
    trainer = Trainer(tiny.build_model(), tiny.plain_loss, tiny.dataset(), config=tiny.config())
    monkeypatch.delenv("RANK", raising=False)
    assert trainer.is_main
    monkeypatch.setenv("RANK", "1")
    assert not trainer.is_main
