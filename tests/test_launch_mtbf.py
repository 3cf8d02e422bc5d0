"""The job's MTBF from `cloudtrain run --mtbf-hours/--interruption-band`, handed to the
training script as CLOUDTRAIN_MTBF_S (with CLOUDTRAIN_CHECKPOINT_DIR) and picked up by
TrainConfig's defaults."""

from __future__ import annotations

import json
import math

import pytest

from cloudtrain.catalog.types import INTERRUPTION_BANDS
from cloudtrain.errors import UnknownNameError, UserError
from cloudtrain.launch.supervisor import (
    MTBF_ENV,
    RunSpec,
    Supervisor,
    max_nodes,
    mtbf_s_from_band,
)
from cloudtrain.plan.cost import hazard_per_node_hour


def test_band_mtbf_is_the_planners_hazard_inverted():
    for band, fraction in INTERRUPTION_BANDS.items():
        assert mtbf_s_from_band(band) == pytest.approx(3600 / hazard_per_node_hour(fraction))
    # "<5%": 2.5 % of nodes a month -> -ln(0.975) / 730 h per node-hour -> ~28,800 h
    assert mtbf_s_from_band("<5%") / 3600 == pytest.approx(730 / -math.log(0.975))
    assert mtbf_s_from_band(">20%", nodes=4) == pytest.approx(mtbf_s_from_band(">20%") / 4)
    ordered = [mtbf_s_from_band(b) for b in INTERRUPTION_BANDS]
    assert ordered == sorted(ordered, reverse=True)  # riskier band, shorter MTBF


def test_unknown_band_and_bad_values_are_user_errors():
    with pytest.raises(UnknownNameError, match="interruption band"):
        mtbf_s_from_band("5-10")
    with pytest.raises(UserError, match="mtbf"):
        RunSpec(command=("t.py",), mtbf_s=0.0)
    assert max_nodes(None) == 1 and max_nodes("2") == 2 and max_nodes("1:4") == 4
    with pytest.raises(UserError, match="--nnodes"):
        max_nodes("two")


class _NullRecorder:
    run_id = "test"


def test_the_script_environment_carries_the_mtbf_only_when_given(monkeypatch):
    monkeypatch.delenv(MTBF_ENV, raising=False)
    with_mtbf = Supervisor(RunSpec(command=("t.py",), mtbf_s=7200.0), _NullRecorder())
    assert float(with_mtbf._env(1)[MTBF_ENV]) == 7200.0
    without = Supervisor(RunSpec(command=("t.py",)), _NullRecorder())
    assert MTBF_ENV not in without._env(1)


SCRIPT = """
import json, sys
from cloudtrain.runtime import TrainConfig
cfg = TrainConfig(max_steps=1)
json.dump({"dir": str(cfg.checkpoint_dir), "mtbf_s": cfg.mtbf_s}, open(sys.argv[1], "w"))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "hours"),
    [(["--mtbf-hours", "12"], 12.0), (["--interruption-band", ">20%"], None)],
)
def test_cloudtrain_run_hands_dir_and_mtbf_to_train_config(run_cli, tmp_path, flags, hours):
    script = tmp_path / "show.py"
    script.write_text(SCRIPT)
    out = tmp_path / "seen.json"
    done = run_cli(
        "run", *flags, "--checkpoint-dir", "ck", "--", str(script), str(out), cwd=tmp_path
    )
    assert done.code == 0, done.stderr[-2000:]
    seen = json.loads(out.read_text())
    assert seen["dir"] == str(tmp_path / "ck")
    expected = hours * 3600 if hours else mtbf_s_from_band(">20%")
    assert seen["mtbf_s"] == pytest.approx(expected)


def test_cli_rejects_both_mtbf_flags(run_cli):
    done = run_cli("run", "--mtbf-hours", "3", "--interruption-band", "<5%", "--", "t.py")
    assert done.code == 2 and "not both" in done.stderr


OFFER_SCRIPT = """
import json, sys
from cloudtrain.runtime import TrainConfig
cfg = TrainConfig(max_steps=1)
json.dump({"price": cfg.price_usd_per_hour, "mtbf_s": cfg.mtbf_s}, open(sys.argv[1], "w"))
"""


@pytest.mark.slow
def test_cloudtrain_run_on_a_spot_offer_prices_the_run_and_sets_the_mtbf(run_cli, tmp_path):
    """The offer's spot price reaches the Trainer (cost so far) and its interruption band
    sets the checkpoint MTBF, the way `cloudtrain plan` priced and risked it."""
    from cloudtrain.catalog import find_offer, load_catalog

    offer = find_offer(load_catalog(), "aws/us-east-1/p5.48xlarge")
    script = tmp_path / "show.py"
    script.write_text(OFFER_SCRIPT)
    out = tmp_path / "seen.json"
    done = run_cli(
        "run",
        "--offer",
        "aws/us-east-1/p5.48xlarge",
        "--pricing",
        "spot",
        "--",
        str(script),
        str(out),
        cwd=tmp_path,
    )
    assert done.code == 0, done.stderr[-2000:]
    seen = json.loads(out.read_text())
    assert seen["price"] == pytest.approx(offer.spot_usd_per_hour)  # one node
    assert seen["mtbf_s"] == pytest.approx(mtbf_s_from_band(offer.interruption_band))
    assert "aws/us-east-1/p5.48xlarge spot" in done.stderr
    from cloudtrain.store import RunStore

    with RunStore.open() as store:  # the run knows where it ran: diagnose's carbon and PUE
        run = store.list_runs(limit=1)[0]
    assert (run.provider, run.region, run.instance_type, run.pricing) == (
        "aws",
        "us-east-1",
        "p5.48xlarge",
        "spot",
    )
    assert run.config["offer"]["gpu"] == "H100-SXM"  # the GPU is the one the Trainer sees


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--offer", "aws/us-east-1/p5.48xlarge", "--price", "3"], "not both"),
        (["--offer", "aws/us-east-1/p5.48xlarge", "--pricing", "spto"], "did you mean spot"),
        (["--offer", "aws/p5.48xlarge"], "name one: aws/us-east-1/p5.48xlarge"),
        (["--offer", "aws/us-east-1/p5.48xlarg"], "did you mean p5.48xlarge"),
        (["--offer", "lambda/gpu_1x_h100_sxm5", "--pricing", "spot"], "no spot price"),
    ],
)
def test_cli_offer_mistakes_are_one_line_errors(run_cli, flags, message):
    done = run_cli("run", *flags, "--", "t.py")
    assert done.code == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
