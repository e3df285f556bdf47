"""End to end: real Prometheus scrapes a live ragmon and runs the generated rules; real Alertmanager delivers.

Slow traffic must reach a webhook as `RagmonLatencyHigh` carrying app and release;
normal traffic must not, although Prometheus evaluated the rule on its data for
longer than the rule's `for`. The rules are the generator's fast variant
(`for: 3s`, 1 s evaluation); Alertmanager runs the shipped example config with
its receiver URL and group timings pointed at the test.
"""

from __future__ import annotations

import calendar
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from dashboards.build import main as build
from tests.dashboards.queries import DASHBOARDS
from tests.live_server import LiveServer, free_port, live_server

BINARIES = {name: shutil.which(name) for name in ("prometheus", "prometheus-alertmanager")}
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not all(BINARIES.values()),
        reason="prometheus / prometheus-alertmanager not installed (Debian packages; .ci/run installs them)",
    ),
]
FOR_S = 3
ALERT = "RagmonLatencyHigh"
P95_TOTAL = (
    "app_stage_quantile:ragmon_stage_duration_seconds:histogram_quantile_rate5m"
    '{quantile="0.95",stage="total",app="shop"}'
)


class _Webhook(BaseHTTPRequestHandler):
    received: list[dict[str, Any]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class Stack:
    ragmon: LiveServer
    prometheus: str
    alertmanager: str
    received: list[dict[str, Any]]

    def query(self, expr: str) -> list[dict[str, Any]]:
        reply = httpx.get(f"{self.prometheus}/api/v1/query", params={"query": expr}, timeout=5).json()
        result: list[dict[str, Any]] = reply["data"]["result"]
        return result

    def rules(self) -> list[dict[str, Any]]:
        groups = httpx.get(f"{self.prometheus}/api/v1/rules", timeout=5).json()["data"]["groups"]
        return [rule for group in groups for rule in group["rules"]]

    def delivered(self, alertname: str) -> list[dict[str, Any]]:
        return [
            alert
            for message in list(self.received)
            for alert in message["alerts"]
            if alert["labels"]["alertname"] == alertname and alert["status"] == "firing"
        ]


def _wait(predicate: Callable[[], Any], what: str, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except httpx.HTTPError:
            value = None
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _start(argv: list[str], ready_url: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: httpx.get(ready_url, timeout=1).status_code == 200, f"{argv[0]} ready", 30)
    except AssertionError:
        process.kill()
        raise AssertionError(f"{argv[0]} did not start:\n{log.read_text()[-2000:]}") from None
    return process


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    received: list[dict[str, Any]] = []
    handler = type("Webhook", (_Webhook,), {"received": received})
    webhook = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=webhook.serve_forever, daemon=True).start()

    assert (
        build(["--out", str(tmp_path), "--for", f"{FOR_S}s", "--interval", "1s", "--only", "rules.yml"]) == 0
    )
    am_config = yaml.safe_load((DASHBOARDS / "alertmanager.yml").read_text())
    am_config["route"].update(group_wait="1s", group_interval="1s")
    for receiver in am_config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = f"http://127.0.0.1:{webhook.server_port}/alert"
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(am_config))
    am_port, prom_port = free_port(), free_port()
    processes = []
    with live_server(tmp_path / "ragmon", assembler={"grace_s": 0.05}, judging={"enabled": False}) as ragmon:
        try:
            processes.append(
                _start(
                    [
                        str(BINARIES["prometheus-alertmanager"]),
                        f"--config.file={tmp_path / 'alertmanager.yml'}",
                        f"--web.listen-address=127.0.0.1:{am_port}",
                        f"--storage.path={tmp_path / 'am'}",
                        "--cluster.listen-address=",
                    ],
                    f"http://127.0.0.1:{am_port}/-/ready",
                    tmp_path / "alertmanager.log",
                )
            )
            prometheus_config = {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(tmp_path / "rules.yml")],
                "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
                "scrape_configs": [
                    {
                        "job_name": "ragmon",
                        "static_configs": [{"targets": [ragmon.url.removeprefix("http://")]}],
                    }
                ],
            }
            (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config))
            processes.append(
                _start(
                    [
                        str(BINARIES["prometheus"]),
                        f"--config.file={tmp_path / 'prometheus.yml'}",
                        f"--web.listen-address=127.0.0.1:{prom_port}",
                        f"--storage.tsdb.path={tmp_path / 'prom'}",
                    ],
                    f"http://127.0.0.1:{prom_port}/-/ready",
                    tmp_path / "prometheus.log",
                )
            )
            stack = Stack(ragmon, f"http://127.0.0.1:{prom_port}", f"http://127.0.0.1:{am_port}", received)
            _wait(lambda: stack.query('up{job="ragmon"} == 1'), "Prometheus scraping ragmon")
            yield stack
        finally:
            for process in processes:
                process.terminate()
                process.wait(10)
            webhook.shutdown()


def _traffic(stack: Stack, total_s: float, stop: threading.Event) -> None:
    """Sends a batch of traces of app shop, release 2.0.0, every 0.3 s until `stop`."""
    n = 0
    with stack.ragmon.client() as client:
        while not stop.is_set():
            batch = [
                {
                    "trace_id": f"{0xA1E27000 + n + i:032x}",
                    "app": "shop",
                    "release": "2.0.0",
                    "query": "where is my order?",
                    "answer": "It ships tomorrow.",
                    "timings": {
                        "total_s": total_s,
                        "retrieval_s": total_s * 0.01,
                        "generation_s": total_s * 0.5,
                    },
                }
                for i in range(5)
            ]
            n += len(batch)
            assert client.post("/api/v1/traces", json={"traces": batch}).status_code == 200
            stop.wait(0.3)


@pytest.fixture
def send(stack: Stack) -> Iterator[Callable[[float], None]]:
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(total_s: float) -> None:
        thread = threading.Thread(target=_traffic, args=(stack, total_s, stop), daemon=True)
        thread.start()
        threads.append(thread)

    yield start
    stop.set()
    for thread in threads:
        thread.join(10)


def _all_rules_healthy(stack: Stack) -> None:
    unhealthy = [(r["name"], r.get("lastError")) for r in stack.rules() if r["health"] != "ok"]
    assert unhealthy == []


def test_slow_traffic_pages_through_alertmanager(stack: Stack, send: Callable[[float], None]) -> None:
    send(20.0)  # SLO for total is 8 s
    alerts = _wait(lambda: stack.delivered(ALERT), f"{ALERT} at the webhook")
    labels = alerts[0]["labels"]
    assert labels["app"] == "shop" and labels["stage"] == "total"
    assert labels["release"] == "2.0.0" and labels["severity"] == "critical"
    assert alerts[0]["annotations"]["runbook_url"].endswith(f"dashboards/runbooks/{ALERT}.md")
    assert "release 2.0.0" in alerts[0]["annotations"]["description"]
    assert float(stack.query(P95_TOTAL)[0]["value"][1]) > 8
    _all_rules_healthy(stack)


def test_normal_traffic_does_not_page(stack: Stack, send: Callable[[float], None]) -> None:
    send(0.4)
    first = _wait(lambda: stack.query(P95_TOTAL), "the recorded p95 of normal traffic")
    assert float(first[0]["value"][1]) < 8
    seen_at = time.time()

    def evaluated_long_enough() -> bool:
        rule = next(r for r in stack.rules() if r.get("name") == ALERT)
        last = rule["lastEvaluation"]
        # RFC 3339 with nanoseconds; seconds precision is enough here
        evaluated = calendar.timegm(time.strptime(last[:19], "%Y-%m-%dT%H:%M:%S"))
        return evaluated > seen_at + FOR_S + 3 and rule["state"] == "inactive"

    _wait(evaluated_long_enough, f"{ALERT} evaluated past its for: on normal traffic")
    assert float(stack.query(P95_TOTAL)[0]["value"][1]) < 8
    assert stack.delivered(ALERT) == []
    am_alerts = httpx.get(f"{stack.alertmanager}/api/v2/alerts", timeout=5).json()
    assert [a for a in am_alerts if a["labels"]["alertname"] == ALERT] == []
    _all_rules_healthy(stack)
