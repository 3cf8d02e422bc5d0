"""Where alerts go: the terminal, the run store (as events), a shell command, a webhook.
A sink never raises: a failed delivery is logged and the next sink still runs."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import urllib.request
from dataclasses import asdict
from typing import Any, Protocol, TextIO

from cloudtrain.monitor.alerts import Alert
from cloudtrain.store import Event, RunStore

log = logging.getLogger(__name__)

# Alert rule -> store event kind (store.records.EVENT_KINDS).
EVENT_KIND = {"stall": "stall", "budget": "budget"}


def alert_json(alert: Alert) -> str:
    return json.dumps(asdict(alert), default=str)


class AlertSink(Protocol):
    def send(self, alert: Alert) -> None: ...


class TerminalSink:
    """One line per alert on stderr (or the given stream)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream

    def send(self, alert: Alert) -> None:
        stream = self.stream or sys.stderr
        stream.write(f"[cloudtrain {alert.severity}] {alert.rule}: {alert.message}\n")
        stream.flush()


class StoreSink:
    """Records each alert as an event of the run ("alert", or "stall"/"budget")."""

    def __init__(self, store: RunStore, run_id: str) -> None:
        self.store = store
        self.run_id = run_id

    def send(self, alert: Alert) -> None:
        data: dict[str, Any] = {
            "rule": alert.rule,
            "severity": alert.severity,
            "value": alert.value,
            "threshold": alert.threshold,
            "gpu_index": alert.gpu_index,
            **alert.data,
        }
        try:
            self.store.add_event(
                Event(
                    self.run_id,
                    EVENT_KIND.get(alert.rule, "alert"),
                    alert.message,
                    alert.time_unix_s,
                    data,
                )
            )
        except Exception:
            log.exception("could not record alert %s in the store", alert.rule)


class CommandSink:
    """Runs a shell command per alert, with the alert in the environment
    (CLOUDTRAIN_ALERT_RULE, _SEVERITY, _MESSAGE, _JSON). Waits at most `timeout_s`."""

    def __init__(self, command: str, timeout_s: float = 30.0) -> None:
        self.command = command
        self.timeout_s = timeout_s

    def send(self, alert: Alert) -> None:
        env = {
            **os.environ,
            "CLOUDTRAIN_ALERT_RULE": alert.rule,
            "CLOUDTRAIN_ALERT_SEVERITY": alert.severity,
            "CLOUDTRAIN_ALERT_MESSAGE": alert.message,
            "CLOUDTRAIN_ALERT_JSON": alert_json(alert),
        }
        try:
            done = subprocess.run(
                self.command,
                shell=True,
                env=env,
                timeout=self.timeout_s,
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                log.warning("alert command exited %s: %s", done.returncode, done.stderr[-500:])
        except (OSError, subprocess.TimeoutExpired) as error:
            log.warning("alert command failed: %s", error)


class WebhookSink:
    """POSTs each alert as JSON ({"text": message, "alert": {...}}; the "text" field makes it
    readable in Slack-style incoming webhooks)."""

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        self.url = url
        self.timeout_s = timeout_s

    def send(self, alert: Alert) -> None:
        body = json.dumps(
            {
                "text": f"[cloudtrain {alert.severity}] {alert.rule}: {alert.message}",
                "alert": json.loads(alert_json(alert)),
            }
        ).encode()
        request = urllib.request.Request(
            self.url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                response.read()
        except OSError as error:  # URLError, HTTPError, timeouts
            log.warning("alert webhook %s failed: %s", self.url, error)


class BackgroundSink:
    """Delivers through `inner` on a daemon thread so a slow command or webhook never
    holds up sampling."""

    def __init__(self, inner: AlertSink) -> None:
        self.inner = inner
        self._threads: list[threading.Thread] = []

    def send(self, alert: Alert) -> None:
        thread = threading.Thread(target=self.inner.send, args=(alert,), daemon=True)
        thread.start()
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]

    def join(self, timeout_s: float = 10.0) -> None:
        for thread in self._threads:
            thread.join(timeout_s)


def default_sinks(
    *,
    command: str | None = None,
    webhook_url: str | None = None,
    store: RunStore | None = None,
    run_id: str | None = None,
    terminal: bool = True,
) -> list[AlertSink]:
    """The sinks a config asks for: terminal, store (with a run), command, webhook."""
    sinks: list[AlertSink] = []
    if terminal:
        sinks.append(TerminalSink())
    if store is not None and run_id is not None:
        sinks.append(StoreSink(store, run_id))
    if command:
        sinks.append(BackgroundSink(CommandSink(command)))
    if webhook_url:
        sinks.append(BackgroundSink(WebhookSink(webhook_url)))
    return sinks
