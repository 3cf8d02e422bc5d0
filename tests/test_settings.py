"""Layered settings: defaults < user config < ./cloudtrain.toml < env < flags, the checks
that name the file, key and fix, and the commands that read them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cloudtrain.cli.config_cmds import SECTIONS
from cloudtrain.errors import UserError
from cloudtrain.launch.supervisor import RunSpec
from cloudtrain.plan.result import OBJECTIVES, Constraints
from cloudtrain.settings import PLAN_OBJECTIVES, RunSettings, load_settings, with_flags
from cloudtrain.store import RunStore

NVML = Path(__file__).parent / "fixtures" / "nvml"
PLAN = ("plan", "--preset", "gpt2-124m", "--tokens", "1e9", "--json")


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _load(tmp_path: Path, env: dict[str, str] | None = None):
    return load_settings(SECTIONS, cwd=tmp_path, environ=env or {})


# ---------------------------------------------------------------- layers


def test_defaults_match_what_the_commands_used_before():
    settings = load_settings(SECTIONS, cwd=Path("/nonexistent"), environ={})
    run = settings.get("run")
    spec = RunSpec(command=("t.py",))
    assert (run.max_restarts, run.grace_s, run.price_usd_per_hour, run.budget_usd) == (
        spec.max_restarts, spec.grace_s, spec.price_usd_per_hour, spec.budget_usd,
    )  # fmt: skip
    plan = settings.get("plan")
    assert (plan.currency, plan.objective, plan.top) == (
        Constraints().currency, Constraints().objective, 10,
    )  # fmt: skip
    assert PLAN_OBJECTIVES == OBJECTIVES
    assert {source for *_, source in settings.rows()} == {"default"}


def test_each_layer_overrides_the_previous_and_flags_win(tmp_path, cloudtrain_home):
    _write(cloudtrain_home / "config.toml", "[run]\nmax_restarts = 1\ngrace_s = 10\n"
           "price_usd_per_hour = 2.5\n")  # fmt: skip
    _write(tmp_path / "cloudtrain.toml", "[run]\nmax_restarts = 2\ngrace_s = 20\n")
    settings = _load(tmp_path, {"CLOUDTRAIN_RUN_MAX_RESTARTS": "7"})
    run = settings.get("run")
    assert (run.max_restarts, run.grace_s, run.price_usd_per_hour, run.budget_usd) == (
        7, 20.0, 2.5, None,
    )  # fmt: skip
    assert settings.source("run", "max_restarts") == "env CLOUDTRAIN_RUN_MAX_RESTARTS"
    assert settings.source("run", "grace_s") == "./cloudtrain.toml"
    assert settings.source("run", "price_usd_per_hour") == "user config"
    assert settings.source("run", "budget_usd") == "default"
    flagged = with_flags(run, max_restarts=0, grace_s=None, budget_usd=4.0)
    assert (flagged.max_restarts, flagged.grace_s, flagged.budget_usd) == (0, 20.0, 4.0)
    with pytest.raises(UserError, match="max_restarts must be >= 0"):
        with_flags(run, max_restarts=-1)  # flags are checked too


def test_relative_catalog_paths_are_relative_to_their_file(tmp_path, cloudtrain_home):
    _write(cloudtrain_home / "config.toml", '[catalog]\npaths = ["mine.csv", "/abs/x.csv"]\n')
    assert _load(tmp_path).get("catalog").paths == (
        cloudtrain_home / "mine.csv", Path("/abs/x.csv"),
    )  # fmt: skip


# ---------------------------------------------------------------- checks


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[plan]\ncurrency = 5\n", "plan.currency = 5: expected a string"),
        ("[plan]\ntop = -1\n", "plan.top must be >= 0"),
        ("[plan]\nobjective = 'speed'\n", "plan.objective must be one of cost, time, carbon"),
        ("[run]\nmax_restarts = 1.5\n", "run.max_restarts = 1.5: expected an integer"),
        ("[run]\nbudget_usd = 0\n", "run.budget_usd must be > 0, not 0"),
        ("[alerts]\nidle_util_pct = 150\n", "alerts.idle_util_pct must be in [0, 100]"),
        ("[alerts]\nidle_stop = 'yes'\n", "alerts.idle_stop = 'yes': expected true or false"),
        ("[alerts]\nstall_s = 'x'\n", "alerts.stall_s = 'x': expected a number (or false: off)"),
        ("[catalog]\npaths = 'a.csv'\n", "catalog.paths = 'a.csv': expected a list of paths"),
        ("[plan\n", "not valid TOML"),
        ("plan = 3\n", "'plan' must be a table"),
    ],
)
def test_a_bad_value_names_the_file_the_key_and_what_is_expected(tmp_path, toml, message):
    path = _write(tmp_path / "cloudtrain.toml", toml)
    with pytest.raises(UserError) as caught:
        _load(tmp_path)
    text = str(caught.value)
    assert text.startswith(f"{path}") and message in text and "\n" not in text


def test_unknown_keys_and_sections_suggest_the_right_name(tmp_path, cloudtrain_home):
    _write(cloudtrain_home / "config.toml", "[alerts]\nstal_s = 3\n")
    with pytest.raises(
        UserError, match=r"config.toml: unknown key alerts.stal_s; did you mean stall_s"
    ):
        _load(tmp_path)
    _write(cloudtrain_home / "config.toml", "[plann]\ntop = 3\n")
    with pytest.raises(UserError, match=r"unknown section \[plann\]; did you mean plan\?"):
        _load(tmp_path)
    (cloudtrain_home / "config.toml").unlink()
    with pytest.raises(UserError, match=r"env CLOUDTRAIN_RUN_GRACE: unknown key run\.grace; did"):
        _load(tmp_path, {"CLOUDTRAIN_RUN_GRACE": "3"})


def test_env_values_are_parsed_by_type(tmp_path):
    env = {
        "CLOUDTRAIN_ALERTS_IDLE_STOP": "yes",
        "CLOUDTRAIN_ALERTS_ECC": "0",
        "CLOUDTRAIN_ALERTS_IDLE_MINUTES": "2.5",
        "CLOUDTRAIN_ALERTS_STALL_S": "off",
        "CLOUDTRAIN_ALERTS_COMMAND": "notify-send alert",
        "CLOUDTRAIN_RUN_MAX_RESTARTS": "5",
        "CLOUDTRAIN_CATALOG_PATHS": "a.csv, b.csv",
        "CLOUDTRAIN_PLAN_CURRENCY": "cny",
        "CLOUDTRAIN_RUN_ID": "set-by-the-supervisor",  # not a setting
        "CLOUDTRAIN_HOME": "/ignored",
    }
    settings = _load(tmp_path, env)
    alerts = settings.get("alerts")
    assert (alerts.idle_stop, alerts.ecc, alerts.idle_minutes, alerts.stall_s) == (
        True, False, 2.5, None,
    )  # fmt: skip
    assert alerts.command == "notify-send alert"
    assert settings.get("run").max_restarts == 5
    assert settings.get("catalog").paths == (Path("a.csv"), Path("b.csv"))
    assert settings.get("plan").currency == "CNY"
    for var, value, message in [
        ("CLOUDTRAIN_ALERTS_IDLE_STOP", "maybe", "expected true/false"),
        ("CLOUDTRAIN_RUN_MAX_RESTARTS", "two", "expected an integer"),
        ("CLOUDTRAIN_RUN_GRACE_S", "-1", "run.grace_s must be > 0"),
    ]:
        with pytest.raises(UserError, match=f"env {var}.*{message}"):
            _load(tmp_path, {var: value})


def test_false_turns_an_optional_threshold_off(tmp_path):
    _write(tmp_path / "cloudtrain.toml", "[alerts]\nstall_s = false\nidle_stop = false\n")
    alerts = _load(tmp_path).get("alerts")
    assert alerts.stall_s is None and alerts.idle_stop is False


def test_run_settings_validate_at_construction():
    with pytest.raises(UserError, match="grace_s must be > 0"):
        RunSettings(grace_s=0)


# ---------------------------------------------------------------- config show


def test_config_show_lists_values_and_sources(run_cli, tmp_path, cloudtrain_home):
    _write(cloudtrain_home / "config.toml", "[plan]\ncurrency = 'EUR'\ntop = 4\n")
    _write(tmp_path / "cloudtrain.toml", "[plan]\ntop = 5\n[alerts]\nstall_s = false\n")
    env = {"CLOUDTRAIN_ALERTS_BUDGET_USD": "12.5"}
    done = run_cli("config", "show", "--json", env=env, cwd=tmp_path)
    assert done.code == 0, done.stderr
    data = json.loads(done.stdout)["settings"]
    assert data["plan"]["currency"] == {"value": "EUR", "source": "user config"}
    assert data["plan"]["top"] == {"value": 5, "source": "./cloudtrain.toml"}
    assert data["plan"]["objective"] == {"value": "cost", "source": "default"}
    assert data["alerts"]["stall_s"] == {"value": None, "source": "./cloudtrain.toml"}
    assert data["alerts"]["budget_usd"] == {
        "value": 12.5, "source": "env CLOUDTRAIN_ALERTS_BUDGET_USD",
    }  # fmt: skip
    text = run_cli("config", "show", env=env, cwd=tmp_path)
    assert text.code == 0, text.stderr
    line = next(x for x in text.stdout.splitlines() if "plan.currency" in x)
    assert "EUR" in line and "user config" in line
    assert str(cloudtrain_home / "config.toml") in text.stdout


def test_a_bad_config_file_is_a_one_line_user_error(run_cli, tmp_path):
    _write(tmp_path / "cloudtrain.toml", "[plan]\ntop = 'many'\n")
    done = run_cli("config", "show", cwd=tmp_path)
    assert done.code == 2
    assert done.stderr.strip() == (
        f"error: {tmp_path / 'cloudtrain.toml'}: plan.top = 'many': expected an integer"
    )


# ---------------------------------------------------------------- the commands


def test_plan_reads_currency_and_top_and_flags_win(run_cli, tmp_path):
    _write(tmp_path / "cloudtrain.toml", "[plan]\ncurrency = 'CNY'\ntop = 2\n")
    data = json.loads(run_cli(*PLAN, cwd=tmp_path).stdout)
    assert data["currency"] == "CNY" and len(data["estimates"]) == 2
    text = run_cli(*PLAN[:-1], cwd=tmp_path)
    assert "CNY" in text.stdout or "¥" in text.stdout
    data = json.loads(run_cli(*PLAN, "--currency", "usd", "--top", "3", cwd=tmp_path).stdout)
    assert data["currency"] == "USD" and len(data["estimates"]) == 3


def test_a_workload_file_constraint_wins_over_plan_settings(run_cli, tmp_path):
    _write(tmp_path / "cloudtrain.toml", "[plan]\ncurrency = 'CNY'\nobjective = 'time'\n")
    job = _write(tmp_path / "job.toml", "[workload]\npreset = 'gpt2-124m'\ntokens = 1e9\n"
                 "[constraints]\ncurrency = 'USD'\n")  # fmt: skip
    done = run_cli("plan", str(job), "--json", cwd=tmp_path)
    assert done.code == 0, done.stderr
    constraints = json.loads(done.stdout)["constraints"]
    assert (constraints["currency"], constraints["objective"]) == ("USD", "time")


def test_catalog_paths_setting_and_the_flag(run_cli, tmp_path):
    header = "provider,region,instance_type,gpu,gpu_count,vcpus,ram_gib,price_per_hour\n"
    _write(tmp_path / "cat" / "a.csv", header + "onprem,lab-a,box-a,H100,8,224,2048,0.1\n")
    other = _write(tmp_path / "b.csv", header + "onprem,lab-b,box-b,H100,8,224,2048,0.1\n")
    _write(tmp_path / "cloudtrain.toml", "[catalog]\npaths = ['cat/a.csv']\n")
    listed = run_cli("offers", "--provider", "onprem", "--json", cwd=tmp_path)
    assert listed.code == 0, listed.stderr
    assert [o["region"] for o in json.loads(listed.stdout)] == ["lab-a"]
    flagged = run_cli("offers", "--provider", "onprem", "--json", "--catalog", str(other),
                      cwd=tmp_path)  # fmt: skip
    assert [o["region"] for o in json.loads(flagged.stdout)] == ["lab-b"]


def _watch(run_cli, tmp_path: Path, *flags: str, seconds: float = 20):
    return run_cli(
        "watch", "--interval", "0.2", "--name", "w", *flags, "--",
        sys.executable, "-c", f"import time; time.sleep({seconds})",
        env={"CLOUDTRAIN_NVML_RECORDING": str(NVML / "t4_idle.json")}, cwd=tmp_path,
    )  # fmt: skip


def test_watch_reads_alerts_and_a_flag_overrides(run_cli, tmp_path, cloudtrain_home):
    _write(tmp_path / "cloudtrain.toml", "[alerts]\nidle_minutes = 0\nidle_stop = true\n"
           "command = 'echo $CLOUDTRAIN_ALERT_RULE >> fired.txt'\n")  # fmt: skip
    done = _watch(run_cli, tmp_path)
    assert "stopping the job" in done.stderr
    assert (tmp_path / "fired.txt").read_text().split() == ["gpu_idle"]
    with RunStore.open(cloudtrain_home / "store.db") as store:
        run = store.get_run("w")
        assert run.status == "stopped" and run.summary["stopped_by"] == "gpu_idle"
    (tmp_path / "fired.txt").unlink()
    done = _watch(run_cli, tmp_path, "--no-idle-stop", seconds=1.5)
    assert done.code == 0, done.stderr
    assert (tmp_path / "fired.txt").read_text().split() == ["gpu_idle"]  # alerted, not stopped


def test_run_reads_run_settings_and_flags_win(run_cli, tmp_path):
    script = _write(tmp_path / "fail.py", "import sys\nsys.exit(3)\n")
    _write(tmp_path / "cloudtrain.toml", "[run]\nmax_restarts = 1\nprice_usd_per_hour = 36.0\n")
    args = ("run", "--backoff-s", "0.05", "--json")
    done = run_cli(*args, "--", str(script), cwd=tmp_path)
    outcome = json.loads(done.stdout)
    assert len(outcome["attempts"]) == 2 and outcome["spend_usd"] is not None
    done = run_cli(*args, "--max-restarts", "0", "--", str(script), cwd=tmp_path)
    assert len(json.loads(done.stdout)["attempts"]) == 1
    _write(tmp_path / "cloudtrain.toml", "[run]\nbudget_usd = 5.0\n")
    done = run_cli("run", "--", str(script), cwd=tmp_path)
    assert done.code == 2 and "--price" in done.stderr  # the budget setting took effect


def test_diagnose_uses_the_catalog_paths_setting(run_cli, tmp_path, cloudtrain_home):
    with RunStore.open(cloudtrain_home / "store.db") as store:
        run_id = store.create_run("r", provider="aws", region="us-east-1")
        store.update_run(run_id, status="completed")
    _write(tmp_path / "pue.csv", "provider,pue,source,as_of\naws,1.42,our DC audit,2026-11-01\n")
    _write(tmp_path / "cloudtrain.toml", "[catalog]\npaths = ['pue.csv']\n")
    bundled = run_cli("diagnose", run_id, "--json")
    configured = run_cli("diagnose", run_id, "--json", cwd=tmp_path)
    assert bundled.code == configured.code == 0, configured.stderr
    assert json.loads(bundled.stdout)["energy"]["pue"] == 1.15
    assert json.loads(configured.stdout)["energy"]["pue"] == 1.42
