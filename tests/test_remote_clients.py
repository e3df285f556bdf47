"""The README's "From another machine" lines, followed: an app on another host reaches ragmon with a key.

The other host is a network namespace joined to this one by a veth pair, so the app's address is not
loopback, as for an app on another machine or behind Docker's NAT. ragmon runs as the README says
(`ragmon serve --host 0.0.0.0` with `RAGMON_AUTH__API_KEYS`); the app in the namespace exports a trace
with the real OpenTelemetry exporter configured by the README's two variables, and sends one more
without a key. Without API keys at all, ragmon refuses the same app (403), which is why the section
exists. Needs root and iproute2 (`ip netns`), else skips; the namespace is removed whatever happens.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.live_server import free_port

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

pytestmark = pytest.mark.slow


def _readme_lines() -> list[str]:
    text = README.read_text(encoding="utf-8")
    block = text.split("<!-- remote:start -->", 1)[1].split("<!-- remote:end -->", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip() and not line.startswith("```")]


@dataclass(frozen=True)
class Namespace:
    name: str
    host_address: str  # this side of the veth pair, where ragmon is reached
    app_address: str  # the app's address inside the namespace: not loopback

    def run(
        self, *command: str, env: dict[str, str], timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", self.name, *command],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@contextmanager
def _namespace() -> Iterator[Namespace]:
    if shutil.which("ip") is None:
        pytest.skip(
            "iproute2's `ip` is not installed (apt-get install iproute2); needed for a network namespace"
        )
    if os.geteuid() != 0:
        pytest.skip("creating a network namespace (ip netns add) needs root")
    tag = f"{os.getpid() % 100000}{secrets.token_hex(2)}"
    name, host_if, app_if = f"ragmon-t{tag}", f"rgh{tag}", f"rgn{tag}"  # interface names: <= 15 chars
    block = (
        secrets.randbelow(16000) * 4
    )  # a /30 of 10.201.0.0/16 of its own: runs side by side may not collide
    host_address = f"10.201.{block // 256}.{block % 256 + 1}"
    app_address = f"10.201.{block // 256}.{block % 256 + 2}"
    try:
        _ip("netns", "add", name)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot create a network namespace here: {exc.stderr.strip()}")
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", app_if)
        _ip("link", "set", app_if, "netns", name)
        _ip("addr", "add", f"{host_address}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("netns", "exec", name, "ip", "addr", "add", f"{app_address}/30", "dev", app_if)
        _ip("netns", "exec", name, "ip", "link", "set", app_if, "up")
        _ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        yield Namespace(name, host_address, app_address)
    finally:
        # deleting the namespace deletes its end of the veth pair, and with it the pair
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=30)


@pytest.fixture
def namespace() -> Iterator[Namespace]:
    with _namespace() as ns:
        yield ns


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAGMON_", "OTEL_"))}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


@contextmanager
def _serve(data: Path, port: int, **settings: str) -> Iterator[subprocess.Popen[str]]:
    """`ragmon serve` with the README's flags (from its block) and `settings` as RAGMON_* variables."""
    serve = next(line for line in _readme_lines() if " ragmon serve " in line)
    flags = re.search(r"ragmon serve (--host \S+)", serve)
    assert flags is not None, serve
    command = [sys.executable, "-m", "service.cli", "serve", *flags.group(1).split()]
    command += ["--port", str(port), "--grpc-port", "0", "--data-dir", str(data)]
    server = subprocess.Popen(
        command,
        env=_env(RAGMON_SERVER__INGEST_PROCESSES="0", RAGMON_ASSEMBLER__GRACE_S="0.05", **settings),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError):
                assert server.poll() is None, server.communicate()[1]
                assert time.monotonic() < deadline, "ragmon serve never answered /healthz"
                time.sleep(0.2)
        yield server
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.communicate(timeout=30)


# Runs inside the namespace: a trace by the OpenTelemetry SDK's exporter, configured only by the
# OTEL_* variables; then one plain POST with no key. Prints what each got.
APP = textwrap.dedent(
    """
    import json, os, urllib.error, urllib.request
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = TracerProvider(resource=Resource.create({"service.name": "remote-app"}))
    held = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(held))
    with provider.get_tracer("app").start_as_current_span("chat") as span:
        span.set_attribute("gen_ai.operation.name", "chat")
        span.set_attribute("gen_ai.request.model", "gpt-4o-mini")
        trace_id = format(span.get_span_context().trace_id, "032x")
    keyed = OTLPSpanExporter().export(held.get_finished_spans()).name  # endpoint and headers from OTEL_*
    body = json.dumps({"resourceSpans": []}).encode()
    request = urllib.request.Request(
        os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"], body, {"content-type": "application/json"}
    )
    try:
        unkeyed = urllib.request.urlopen(request, timeout=10).status
        detail = ""
    except urllib.error.HTTPError as exc:
        unkeyed, detail = exc.code, exc.read().decode()
    print(json.dumps({"trace_id": trace_id, "keyed": keyed, "unkeyed": unkeyed, "detail": detail}))
    """
)


def _app_in(namespace: Namespace, endpoint: str, key: str) -> dict[str, str]:
    """Run the app in the namespace with the README's two variables; what it reports."""
    variables: dict[str, str] = {}
    for line in _readme_lines():
        found = re.match(r'export (OTEL_\w+)="?([^"]*)"?$', line)
        if found:
            variables[found.group(1)] = found.group(2).replace("$KEY", key)
    assert set(variables) == {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"}
    variables["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = endpoint
    done = namespace.run(sys.executable, "-c", APP, env=_env(**variables))
    assert done.returncode == 0, done.stderr
    report: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def _stored(port: int, key: str, trace_id: str) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v1/traces/{trace_id}", headers={"authorization": f"Bearer {key}"}
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as exc:
            if exc.code != 404 or time.monotonic() > deadline:
                return int(exc.code)
        time.sleep(0.2)


def test_an_app_in_another_network_reaches_ragmon_with_a_key_and_is_refused_without(
    namespace: Namespace, tmp_path: Path
) -> None:
    key = secrets.token_urlsafe(24)
    port = free_port()
    endpoint = f"http://{namespace.host_address}:{port}/v1/traces"
    # as the README says: API keys in the environment, listening on every address
    with _serve(tmp_path / "keyed", port, RAGMON_AUTH__API_KEYS=json.dumps({key: "default"})):
        seen = _app_in(namespace, endpoint, key)
        assert seen["keyed"] == "SUCCESS" and seen["unkeyed"] == 401, seen
        assert _stored(port, key, seen["trace_id"]) == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            metrics = answer.read().decode()
        assert 'ragmon_ingest_rejected_total{reason="unauthenticated"} 1.0' in metrics
    # the gap the section closes: no keys, and the same app is refused as not loopback
    with _serve(tmp_path / "open", port) as server:
        seen = _app_in(namespace, endpoint, key)
        assert seen["keyed"] == "FAILURE" and seen["unkeyed"] == 403, seen
        assert "only loopback clients are accepted" in seen["detail"]
        server.send_signal(signal.SIGTERM)
        _, log = server.communicate(timeout=60)
    assert "clients on other machines get 403 until API keys are set" in log
