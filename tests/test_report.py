"""The HTML report: contents, escaping of hostile strings, self-containment, comparison,
the CLI, and a real headless Chromium that renders it, draws its plots and logs no error."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cloudtrain.diagnose import diagnose_run
from cloudtrain.report import build_plots, gather, render_html, write_report
from cloudtrain.report.data import downsample
from cloudtrain.report.html import script_json
from cloudtrain.store import Event, RunStore
from fixtures.runs.loader import load_run

HOSTILE = "<script>alert(1)</script>"
HOSTILE_VALUE = '</script><img src=x onerror="alert(2)">&amp;'


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    store = RunStore.open(tmp_path_factory.mktemp("report") / "store.db")
    ids = {name: load_run(store, name) for name in ("healthy_h100", "slow_a10g", "troubled_ddp")}
    for run_id in ids.values():
        diagnose_run(store, run_id)
    hostile = load_run(store, "slow_a10g", run_name=HOSTILE)
    store.update_run(
        hostile,
        config={"model": HOSTILE_VALUE, "data": "/data/<b>x</b>"},
        command=["python", "train.py", "--tag", HOSTILE_VALUE],
    )
    store.add_event(
        Event(hostile, "note", HOSTILE_VALUE, 1_780_000_010.0, {"stacks": HOSTILE_VALUE})
    )
    diagnose_run(store, hostile)
    ids["hostile"] = hostile
    yield store, ids
    store.close()


def test_report_has_summary_findings_plots_and_events(store, tmp_path: Path):
    store, ids = store
    path = write_report(store, [ids["troubled_ddp"]], tmp_path / "r.html")
    page = path.read_text()
    assert "bert-large-ddp" in page and "4 x A100-40GB-PCIe" in page
    assert "kg CO2e" in page and "kWh" in page and "$5.16/h" in page
    for rule in ("stall", "communication_bound", "stragglers", "oom_adjustments"):
        assert f'data-rule="{rule}"' in page
    assert "stack dump" in page and "all_reduce" in page
    for key in ("throughput", "mfu", "loss", "util", "memory", "power", "temperature", "cost"):
        assert f'id="plot-{key}"' in page


def test_hostile_strings_are_escaped_everywhere(store, tmp_path: Path):
    store, ids = store
    page = write_report(store, [ids["hostile"]], tmp_path / "h.html").read_text()
    assert HOSTILE not in page
    assert "<img" not in page and "<b>x</b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count("</script>") == 2  # the two script elements of the page itself
    assert "&amp;amp;" in page  # '&amp;' in a value shows as typed, not as '&'


def test_script_json_cannot_close_its_element():
    text = script_json({"name": "</script><!--", "amp": "&"})
    assert "<" not in text and ">" not in text and "&" not in text


def test_report_is_self_contained(store, tmp_path: Path):
    store, ids = store
    page = write_report(store, [ids["healthy_h100"]], tmp_path / "s.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<link" not in page and "@import" not in page
    assert "default-src 'none'" in page


def test_compare_overlays_runs(store, tmp_path: Path):
    store, ids = store
    reports = [gather(store, ids[n]) for n in ("healthy_h100", "slow_a10g")]
    plots = {p.key: p for p in build_plots(reports)}
    assert [s.label for s in plots["util"].series] == ["gpt-350m-h100", "resnet50-a10g"]
    # tokens/s and samples/s do not share an axis label
    assert plots["throughput"].unit == ""
    assert plots["throughput"].series[1].label == "resnet50-a10g (samples/s)"
    page = render_html(reports)
    assert "cloudtrain compare" in page and page.count("<th>gpt-350m-h100</th>") == 1


def test_single_multi_gpu_run_plots_each_gpu(store):
    store, ids = store
    plots = {p.key: p for p in build_plots([gather(store, ids["troubled_ddp"])])}
    assert [s.label for s in plots["util"].series] == [f"GPU {i}" for i in range(4)]
    cost = plots["cost"].series[0]
    assert cost.y[-1] == pytest.approx(5.16 * cost.x_min[-1] / 60, rel=1e-3)


def test_downsample_keeps_gaps_and_bounds():
    points = [(float(t), None if 100 <= t < 300 else 1.0) for t in range(3000)]
    out = downsample(points, 300)
    assert len(out) == 300 and out[15] == (out[15][0], None) and out[0][1] == 1.0


def test_cli_report(run_cli, store, tmp_path: Path):
    store, ids = store
    env = {"CLOUDTRAIN_HOME": str(Path(store.path).parent)}
    out = tmp_path / "cli.html"
    done = run_cli("report", ids["slow_a10g"], "-o", str(out), env=env)
    assert done.code == 0, done.stderr
    assert done.stdout.strip() == str(out) and out.stat().st_size > 10_000
    both = run_cli(
        "report",
        "--compare",
        ids["slow_a10g"],
        ids["healthy_h100"],
        "-o",
        str(tmp_path / "cmp.html"),
        env=env,
    )
    assert both.code == 0, both.stderr
    assert run_cli("report", ids["slow_a10g"], ids["healthy_h100"], env=env).code == 2
    assert run_cli("report", "no-such-run", env=env).code == 2


# -- in a real browser -------------------------------------------------------------------


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("CI") == "true" and hasattr(os, "geteuid") and os.geteuid() == 0:
        subprocess.run(["apt-get", "update", "-qq"], check=True, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True, timeout=900)
        return shutil.which("chromium") or pytest.fail("apt-get installed no chromium")
    pytest.skip(
        "headless test needs Debian's chromium: apt-get install -y chromium "
        "(installed automatically when CI=true and running as root)"
    )


def _render(page: Path, profile: Path, query: str = "?selftest=1") -> tuple[str, str]:
    done = subprocess.run(
        [
            _chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1280,2000",
            "--dump-dom",
            page.resolve().as_uri() + query,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, done.stderr


def _body(dom: str) -> dict[str, str]:
    tag = re.search(r"<body([^>]*)>", dom).group(1)
    return dict(re.findall(r'([\w-]+)="([^"]*)"', tag))


@pytest.mark.slow
def test_chromium_renders_plots_without_errors(store, tmp_path: Path):
    store, ids = store
    page = write_report(store, [ids["troubled_ddp"]], tmp_path / "r.html")
    dom, log = _render(page, tmp_path / "profile")
    body = _body(dom)
    assert "data-js-error" not in body
    assert not [line for line in log.splitlines() if ":CONSOLE" in line], log[-3000:]
    assert body["data-plots-drawn"] == "9"
    assert int(body["data-points"]) > 1000
    assert body["data-event-kinds"] == "3"  # oom_adjustment, stall, restart
    assert dom.count('data-plot="') == 9 and "<path" in dom
    assert body["data-hover-test"].startswith("t = ")
    assert "GPU 0:" in body["data-hover-test"] or "bert-large-ddp:" in body["data-hover-test"]


@pytest.mark.slow
def test_chromium_hostile_run_and_comparison(store, tmp_path: Path):
    store, ids = store
    page = write_report(
        store, [ids["hostile"], ids["healthy_h100"], ids["troubled_ddp"]], tmp_path / "c.html"
    )
    dom, log = _render(page, tmp_path / "profile")
    body = _body(dom)
    assert "data-js-error" not in body
    assert not [line for line in log.splitlines() if ":CONSOLE" in line], log[-3000:]
    assert "<img" not in dom  # the hostile value stayed text
    assert int(body["data-plots-drawn"]) == 9
    assert HOSTILE not in dom and "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
