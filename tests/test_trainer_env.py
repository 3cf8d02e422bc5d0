"""TrainConfig defaults that a launcher sets through the environment."""

from __future__ import annotations

import pytest

from _train_scripts import tiny
from cloudtrain.errors import UserError
from cloudtrain.runtime import TrainConfig, Trainer
from cloudtrain.runtime.checkpoint import young_interval_s
from cloudtrain.runtime.config import (
    CHECKPOINT_DIR_ENV,
    DEFAULT_MTBF_S,
    MTBF_ENV,
    NODE_PRICE_ENV,
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv(CHECKPOINT_DIR_ENV, raising=False)
    monkeypatch.delenv(MTBF_ENV, raising=False)
    monkeypatch.delenv(NODE_PRICE_ENV, raising=False)
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def test_without_the_environment_the_defaults_stay():
    cfg = TrainConfig(max_steps=1)
    assert cfg.checkpoint_dir is None and cfg.mtbf_s == DEFAULT_MTBF_S
    assert cfg.price_usd_per_hour is None


def test_checkpoint_dir_and_mtbf_default_to_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(CHECKPOINT_DIR_ENV, str(tmp_path / "ck"))
    monkeypatch.setenv(MTBF_ENV, "7200")
    cfg = TrainConfig(max_steps=1, checkpoint_every_seconds="auto")
    assert cfg.checkpoint_dir == str(tmp_path / "ck") and cfg.mtbf_s == 7200.0
    explicit = TrainConfig(max_steps=1, checkpoint_dir=None, mtbf_s=60.0)
    assert explicit.checkpoint_dir is None and explicit.mtbf_s == 60.0  # arguments win


def test_a_checkpoint_dir_alone_checkpoints_on_youngs_interval(monkeypatch, tmp_path):
    monkeypatch.setenv(MTBF_ENV, "50")
    cfg = tiny.config(max_steps=3, checkpoint_dir=str(tmp_path / "ck"))
    assert cfg.checkpoint_every_seconds == "auto"  # nothing asked: never lose work
    trainer = Trainer(tiny.build_model(), tiny.plain_loss, tiny.dataset(), config=cfg)
    trainer.fit()
    assert trainer.clock.interval_s == pytest.approx(young_interval_s(trainer.ckpt.last_save_s, 50))
    off = TrainConfig(max_steps=1, checkpoint_dir=str(tmp_path), checkpoint_every_seconds=None)
    assert off.checkpoint_every_seconds is None
    with pytest.raises(UserError, match="checkpoint_dir"):
        TrainConfig(max_steps=1, checkpoint_every_seconds=60.0)


def test_the_auto_interval_uses_the_environments_mtbf(monkeypatch, tmp_path):
    monkeypatch.setenv(CHECKPOINT_DIR_ENV, str(tmp_path / "ck"))
    monkeypatch.setenv(MTBF_ENV, "50")
    cfg = tiny.config(max_steps=3, checkpoint_every_seconds="auto")
    trainer = Trainer(tiny.build_model(), tiny.plain_loss, tiny.dataset(), config=cfg)
    result = trainer.fit()
    assert result.last_checkpoint and (tmp_path / "ck").is_dir()
    assert trainer.clock.mtbf_s == 50.0
    save_s = trainer.ckpt.last_save_s  # the final checkpoint re-derives the interval
    assert trainer.clock.interval_s == pytest.approx(young_interval_s(save_s, 50.0))


@pytest.mark.parametrize("value", ["soon", "0", "-5", "inf"])
def test_a_bad_mtbf_in_the_environment_names_the_variable(monkeypatch, value):
    monkeypatch.setenv(MTBF_ENV, value)
    with pytest.raises(UserError, match=MTBF_ENV):
        TrainConfig(max_steps=1)


@pytest.mark.parametrize(("world", "per_node", "nodes"), [(None, None, 1), (8, 8, 1), (16, 8, 2)])
def test_the_job_price_is_the_node_price_times_the_nodes(monkeypatch, world, per_node, nodes):
    monkeypatch.setenv(NODE_PRICE_ENV, "19.66")
    if world is not None:
        monkeypatch.setenv("WORLD_SIZE", str(world))
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(per_node))
    assert TrainConfig(max_steps=1).price_usd_per_hour == pytest.approx(19.66 * nodes)
    assert TrainConfig(max_steps=1, price_usd_per_hour=3.0).price_usd_per_hour == 3.0


@pytest.mark.parametrize("value", ["cheap", "-1", "inf"])
def test_a_bad_node_price_in_the_environment_names_the_variable(monkeypatch, value):
    monkeypatch.setenv(NODE_PRICE_ENV, value)
    with pytest.raises(UserError, match=NODE_PRICE_ENV):
        TrainConfig(max_steps=1)


def test_opting_out_of_the_launchers_checkpoint_dir_is_said(monkeypatch, tmp_path, capsys):
    """checkpoint_dir=None passed on purpose (or from an unset flag) under cloudtrain run:
    one line says nothing will be saved; leaving it out uses the launcher's directory."""
    monkeypatch.setenv(CHECKPOINT_DIR_ENV, str(tmp_path / "ck"))
    cfg = tiny.config(max_steps=2, checkpoint_dir=None)
    Trainer(tiny.build_model(), tiny.plain_loss, tiny.dataset(), config=cfg).fit()
    assert "checkpoint_dir=None: nothing is saved" in capsys.readouterr().err
    result = Trainer(tiny.build_model(), tiny.plain_loss, tiny.dataset(), config=tiny.config(
        max_steps=2)).fit()  # fmt: skip
    assert "nothing is saved" not in capsys.readouterr().err and result.last_checkpoint
