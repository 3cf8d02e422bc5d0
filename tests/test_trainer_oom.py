"""OOM during training: the micro-batch halves, the same batch is redone, and the
result is what a run without the OOM computes."""

from __future__ import annotations

import pytest
import torch

from _train_scripts import tiny
from cloudtrain.runtime import Callback, Trainer
from cloudtrain.store import RunStore

OOM_AFTER = 5  # steps done before the memory limit appears
STEPS = 10


class _LimitMemoryAfter(Callback):
    """From step OOM_AFTER on, forward passes of more than 2 samples run out of memory."""

    def on_step_end(self, trainer, step, loss):
        if step == OOM_AFTER:
            trainer.model.oom_above = 2


def _fit_with_oom(noisy: bool):
    model = tiny.build_model(dropout=0.2 if noisy else 0.0)
    loss = tiny.noisy_loss if noisy else tiny.plain_loss
    cfg = tiny.config(max_steps=STEPS, micro_batch_size=4, store=True)
    trainer = Trainer(model, loss, tiny.dataset(), config=cfg, callbacks=[_LimitMemoryAfter()])
    return model, trainer.fit()


def _equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


@pytest.mark.parametrize("noisy", [False, True], ids=["plain", "dropout-and-rng"])
def test_oom_halves_the_micro_batch_and_equals_a_run_that_switched_size_there(tmp_path, noisy):
    model, result = _fit_with_oom(noisy)
    assert result.micro_batch_size == 2 and result.oom_adjustments == 1
    assert result.steps == STEPS
    # the reference: micro-batch 4 for OOM_AFTER steps, then 2 from a checkpoint
    loss = tiny.noisy_loss if noisy else tiny.plain_loss
    dropout = 0.2 if noisy else 0.0
    cfg = tiny.config(max_steps=OOM_AFTER, micro_batch_size=4, checkpoint_dir=tmp_path)
    Trainer(tiny.build_model(dropout=dropout), loss, tiny.dataset(), config=cfg).fit()
    reference = tiny.build_model(dropout=dropout)
    cfg = tiny.config(max_steps=STEPS, micro_batch_size=2, checkpoint_dir=tmp_path)
    Trainer(reference, loss, tiny.dataset(), config=cfg).fit()
    assert _equal(model, reference)  # bit for bit: same batches, same sums in same order


def test_oom_run_matches_a_run_without_oom_within_float_tolerance():
    model, _ = _fit_with_oom(noisy=False)
    clean = tiny.build_model(dropout=0.0)
    Trainer(
        clean,
        tiny.plain_loss,
        tiny.dataset(),
        config=tiny.config(max_steps=STEPS, micro_batch_size=4),
    ).fit()
    for a, b in zip(model.parameters(), clean.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_oom_is_an_event_in_the_store_and_a_line_for_the_user(capsys):
    _, result = _fit_with_oom(noisy=False)
    assert "micro-batch 4 -> 2" in capsys.readouterr().err
    with RunStore.open() as store:
        events = store.events(result.run_id, kind="oom_adjustment")
    assert len(events) == 1
    assert events[0].data == {"step": OOM_AFTER, "old_micro_batch": 4, "new_micro_batch": 2}


def test_oom_at_micro_batch_one_gives_up_with_advice():
    model = tiny.build_model()
    model.oom_above = 0
    cfg = tiny.config(max_steps=2, micro_batch_size=1)
    with pytest.raises(torch.OutOfMemoryError, match="micro_batch_size 1"):
        Trainer(model, tiny.plain_loss, tiny.dataset(), config=cfg).fit()
