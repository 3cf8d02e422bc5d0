"""Alert rules, sinks (terminal, store, command, webhook) and the stall watchdog."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from cloudtrain.errors import UserError
from cloudtrain.monitor import (
    AlertConfig,
    AlertRules,
    CommandSink,
    GPUReader,
    Nvml,
    RecordedSource,
    StoreSink,
    TerminalSink,
    Watchdog,
    WebhookSink,
    request_stack_dump,
)
from cloudtrain.monitor.alerts import Alert
from cloudtrain.monitor.snapshots import GPUSnapshot, HostSnapshot, Snapshot
from cloudtrain.monitor.stacks import registered_pids
from cloudtrain.store import RunStore

FIXTURES = Path(__file__).parent / "fixtures" / "nvml"
HOST = HostSnapshot("h", 2, 10.0, (10.0, 10.0), 1.0, 8.0)


def snapshots_from(name: str, *, step_s: float = 1.0, frames: int = 6, start: float = 0.0):
    source = RecordedSource.load(FIXTURES / f"{name}.json")
    reader = GPUReader(Nvml(source))
    out = []
    for i in range(frames):
        now = start + i * step_s
        out.append(Snapshot(now, reader.read(now), HOST, True))
        source.refresh()
    return out


def gpu(**values) -> GPUSnapshot:
    return GPUSnapshot(index=0, name="GPU", **values)


def test_idle_fires_after_the_duration_and_asks_to_stop():
    rules = AlertRules(AlertConfig(idle_minutes=4, idle_stop=True))
    fired = [a for s in snapshots_from("t4_idle", step_s=60) for a in rules.check_snapshot(s)]
    assert [a.rule for a in fired] == ["gpu_idle"]
    assert fired[0].time_unix_s == 240.0 and fired[0].data["stop"] is True
    assert "stopping the job" in fired[0].message


def test_busy_gpus_are_not_idle():
    rules = AlertRules(AlertConfig(idle_minutes=0))
    assert not [a for s in snapshots_from("h100_load") for a in rules.check_snapshot(s)]


def test_memory_above_threshold():
    rules = AlertRules(AlertConfig(memory_fraction=0.95))
    hot = Snapshot(0.0, (gpu(memory_used_gib=77.0, memory_total_gib=80.0),), HOST, True)
    ok = Snapshot(0.0, (gpu(memory_used_gib=70.0, memory_total_gib=80.0),), HOST, True)
    assert rules.check_snapshot(ok) == []
    (alert,) = rules.check_snapshot(hot)
    assert alert.rule == "memory_high" and alert.value == pytest.approx(0.9625)
    assert rules.check_snapshot(hot) == []  # quiet until repeat_s passes


def test_throttling_must_last_and_ecc_errors_are_critical():
    rules = AlertRules(AlertConfig(throttle_s=3))
    fired = [a for s in snapshots_from("a100_throttled") for a in rules.check_snapshot(s)]
    by_rule = {a.rule: a for a in fired}
    assert set(by_rule) == {"throttling", "ecc_errors", "memory_high"}  # 38.9 of 40 GiB
    assert by_rule["throttling"].time_unix_s == 3.0
    assert by_rule["throttling"].data["reasons"] == ["power cap", "software thermal"]
    assert by_rule["ecc_errors"].severity == "critical" and by_rule["ecc_errors"].value == 2
    assert by_rule["ecc_errors"].time_unix_s == 4.0


def test_nan_loss_budget_and_stall_rules():
    rules = AlertRules(AlertConfig(budget_usd=10.0, stall_s=60))
    assert rules.check_loss(5, 2.3, 0.0) == []
    assert rules.check_loss(6, float("nan"), 0.0)[0].rule == "nan_loss"
    assert rules.check_loss(7, float("inf"), 700.0)[0].severity == "critical"
    assert rules.check_spend(9.99, 0.0) == []
    assert rules.check_spend(10.5, 0.0)[0].data == {"spend_usd": 10.5, "budget_usd": 10.0}
    assert rules.check_progress(100.0, 3, 159.0) == []
    assert rules.check_progress(100.0, 3, 161.0)[0].value == pytest.approx(61.0)


def test_config_from_a_toml_table():
    from cloudtrain.monitor.alerts import alert_config_from

    config = alert_config_from({"stall_s": 120, "idle_stop": True})
    assert config.stall_s == 120 and config.idle_stop
    with pytest.raises(UserError, match="did you mean stall_s"):
        alert_config_from({"stal_s": 120})


def test_config_rejects_bad_thresholds():
    with pytest.raises(UserError, match="memory_fraction"):
        AlertConfig(memory_fraction=95)
    with pytest.raises(UserError, match="webhook_url"):
        AlertConfig(webhook_url="example.com/hook")


# -- sinks -------------------------------------------------------------------------------


ALERT = Alert("memory_high", "warn", "GPU 0 memory 97% used", 0.97, 0.95, 0, 1.0)


def test_terminal_and_store_sinks(tmp_path: Path):
    out = io.StringIO()
    TerminalSink(out).send(ALERT)
    assert out.getvalue() == "[cloudtrain warn] memory_high: GPU 0 memory 97% used\n"
    with RunStore.open(tmp_path / "s.db") as store:
        run_id = store.create_run("r")
        StoreSink(store, run_id).send(ALERT)
        StoreSink(store, run_id).send(Alert("stall", "critical", "stuck", data={"stacks": "x"}))
        events = store.events(run_id)
        assert [e.kind for e in events] == ["alert", "stall"]
        assert events[0].data["rule"] == "memory_high" and events[0].data["value"] == 0.97
        assert events[1].data["stacks"] == "x"


def test_command_sink_gets_the_alert_in_its_environment(tmp_path: Path):
    target = tmp_path / "alert.json"
    CommandSink(f'printf "%s" "$CLOUDTRAIN_ALERT_JSON" > "{target}"').send(ALERT)
    assert json.loads(target.read_text())["rule"] == "memory_high"
    CommandSink("exit 3").send(ALERT)  # failures are logged, never raised


class _Hook(BaseHTTPRequestHandler):
    received: ClassVar[list[dict]] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Hook.received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_webhook_sink_posts_json_to_a_loopback_server():
    server = HTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        WebhookSink(f"http://127.0.0.1:{server.server_port}/hook").send(ALERT)
    finally:
        server.shutdown()
        server.server_close()
    (payload,) = _Hook.received
    assert payload["alert"]["rule"] == "memory_high"
    assert payload["text"].startswith("[cloudtrain warn] memory_high")
    # a closed port: logged, not raised
    WebhookSink(f"http://127.0.0.1:{server.server_port}/hook", timeout_s=1).send(ALERT)


# -- watchdog ----------------------------------------------------------------------------

HUNG = textwrap.dedent(
    """
    import sys, threading, time
    from cloudtrain.monitor import enable_stack_dumps
    enable_stack_dumps(sys.argv[1])
    def data_loader_worker():
        time.sleep(60)
    threading.Thread(target=data_loader_worker, name="loader", daemon=True).start()
    def all_reduce_that_never_returns():
        time.sleep(60)
    print("ready", flush=True)
    all_reduce_that_never_returns()
    """
)


def test_stall_dumps_every_thread_stack_of_the_process(tmp_path: Path):
    dump = tmp_path / "stacks.txt"
    proc = subprocess.Popen(
        [sys.executable, "-c", HUNG, str(dump)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert proc.pid in registered_pids(dump)
        with RunStore.open(tmp_path / "s.db") as store:
            run_id = store.create_run("hung")
            now = [1000.0]
            dog = Watchdog(
                AlertConfig(stall_s=30),
                sinks=[StoreSink(store, run_id)],
                stack_dump_path=dump,
                clock=lambda: now[0],
            )
            dog.on_step(10, loss=2.0)
            now[0] = 1020.0
            assert dog.poll() == []
            now[0] = 1031.0
            (alert,) = dog.poll()
            assert alert.rule == "stall"
            stacks = alert.data["stacks"]
            assert "all_reduce_that_never_returns" in stacks
            assert "data_loader_worker" in stacks
            (event,) = store.events(run_id, kind="stall")
            assert "all_reduce_that_never_returns" in event.data["stacks"]
        assert proc.poll() is None  # the dump does not kill the process
    finally:
        proc.kill()
        proc.wait()


def test_unregistered_processes_are_never_signalled(tmp_path: Path):
    dump = tmp_path / "stacks.txt"
    dump.write_text("# cloudtrain stack dumps: pid=999999999 signal=12\n")
    assert request_stack_dump(dump) is None
    dog = Watchdog(AlertConfig(stall_s=1), stack_dump_path=dump, clock=lambda: 0.0)
    dog.on_step(1, now=0.0)
    (alert,) = dog.poll(5.0)
    assert alert.data["stacks"] is None
    assert "no process registered" in alert.message


def test_watchdog_reads_steps_from_the_store_and_stops_idle_jobs(tmp_path: Path):
    from cloudtrain.store import StepRecord

    with RunStore.open(tmp_path / "s.db") as store:
        run_id = store.create_run("r")
        store.add_steps([StepRecord(run_id, 1, 0.0, loss=float("nan"))])
        stopped = []
        dog = Watchdog(
            AlertConfig(idle_minutes=4, idle_stop=True, budget_usd=1.0),
            store=store,
            run_id=run_id,
            stop_job=stopped.append,
            spend_usd=lambda now: now / 100,
        )
        for snapshot in snapshots_from("t4_idle", step_s=60):
            dog.on_snapshot(snapshot)
        rules = [a.rule for a in dog.fired]
        assert rules == ["nan_loss", "budget", "gpu_idle"]
        assert dog.last_step == 1 and dog.stopped
        assert [a.rule for a in stopped] == ["gpu_idle"]


def test_watchdog_ignores_stall_until_the_first_step():
    dog = Watchdog(AlertConfig(stall_s=1))
    assert dog.poll(10_000.0) == []
    assert time.time() > 0
