"""Runs a conformance client app in its own virtualenv, pointed at an OTLP receiver and the stub.

Shared by the pytest module and by the capture command:

    .venv/bin/python -m tests.conformance.harness capture [client ...]

which runs each client against `capture.py` (and the stub) and leaves the OTLP/JSON dumps and the
client's manifest in /tmp/conformance-captures/<client>/; `pack [client ...]` then keeps their traces
and logs requests in tests/conformance/captures/<client>.json.gz.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
VENVS = ROOT / ".venvs" / "conformance"
CAPTURES = Path("/tmp/conformance-captures")
# the captures kept in the repository (`pack`)
PACKED = HERE / "captures"
APP_TIMEOUT_S = 90
# written by build_venvs.sh into a Node client's node_modules once `npm ci` succeeded
NODE_BUILT = Path("node_modules") / ".package-lock.sha256"
# the Node clients' packages (@langchain/openai 1.5, openai 6) need Node.js 20 or newer
MIN_NODE = 20


@dataclass(frozen=True)
class Client:
    name: str
    venv: str  # the folder under clients/: a Python client's venv, a Node client's npm project
    protocol: str = "http/protobuf"
    env: tuple[tuple[str, str], ...] = ()
    node: bool = False  # app.mjs run by node, its packages in clients/<venv>/node_modules (npm ci)

    @property
    def folder(self) -> Path:
        return HERE / "clients" / self.venv

    @property
    def python(self) -> Path:
        return VENVS / self.venv / "bin" / "python"

    @property
    def app(self) -> Path:
        return self.folder / ("app.mjs" if self.node else "app.py")

    @property
    def command(self) -> list[str]:
        return (
            [shutil.which("node") or "node", str(self.app)]
            if self.node
            else [str(self.python), str(self.app)]
        )

    @property
    def built(self) -> bool:
        # build_venvs.sh writes the hash last, so a venv (or node_modules) without it is half-built
        if self.node:
            return node_major() >= MIN_NODE and (self.folder / NODE_BUILT).exists()
        return self.python.exists() and (VENVS / self.venv / ".requirements.sha256").exists()

    @property
    def build_hint(self) -> str:
        if self.node and node_major() < MIN_NODE:
            return f"{self.venv} needs Node.js >= {MIN_NODE} on PATH (found: {node_major() or 'none'})"
        what = "node_modules (npm ci)" if self.node else "virtualenv"
        return f"no {what} for {self.venv}: run tests/conformance/build_venvs.sh {self.venv}"


@cache
def node_major() -> int:
    """The major version of `node` on PATH; 0 when there is none."""
    node = shutil.which("node")
    if node is None:
        return 0
    version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
    match = re.match(r"v(\d+)\.", version.strip())
    return int(match.group(1)) if match else 0


CLIENTS = [
    Client("langchain", "langchain"),
    Client("llamaindex", "llamaindex"),
    Client("traceloop", "traceloop"),
    Client("openai_v2_http", "openai_v2"),
    Client("openai_v2_grpc", "openai_v2", protocol="grpc"),
    # the same app on the instrumentation's opt-in latest GenAI conventions: content only as
    # `gen_ai.client.inference.operation.details` log records
    Client(
        "openai_v2_latest",
        "openai_v2",
        env=(
            ("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental"),
            ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "EVENT_ONLY"),
        ),
    ),
    Client("phoenix_openai", "phoenix_openai"),
    Client("haystack", "haystack"),
    Client("dspy", "dspy"),
    Client("openlit", "openlit"),
    Client("pydantic_ai", "pydantic_ai"),
    Client("node_openai", "node_openai", node=True),
    Client("node_langchain", "node_langchain", node=True),
]
BY_NAME = {c.name: c for c in CLIENTS}


def client_env(
    client: Client, *, otlp_http: str, otlp_grpc: str | None, openai_base_url: str
) -> dict[str, str]:
    """The client's environment: the parent's minus any OTEL_*/proxy settings, plus ours."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OTEL_", "TRACELOOP_", "PHOENIX_", "OPENAI_"))
        and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")
    }
    endpoint = otlp_http
    if client.protocol == "grpc":
        if otlp_grpc is None:
            raise ValueError(f"{client.name} needs a gRPC receiver")
        endpoint = otlp_grpc
    env.update(
        {
            "CONFORMANCE_CLIENT": client.name,
            "OPENAI_BASE_URL": openai_base_url,
            "OPENAI_API_KEY": "sk-conformance",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": client.protocol,
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            # openai-v2: message content only with this; it then goes out as log records
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true",
            "TRACELOOP_TELEMETRY": "false",
            "HAYSTACK_TELEMETRY_ENABLED": "False",
            "ANONYMIZED_TELEMETRY": "False",
            "NO_PROXY": "127.0.0.1,localhost",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    env.update(client.env)
    return env


def run_client(client: Client, manifest: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*client.command, str(manifest)],
        env=env,
        capture_output=True,
        text=True,
        timeout=APP_TIMEOUT_S,
        cwd=str(client.folder),
    )


def capture(names: list[str]) -> int:
    from tests.conformance.capture import serve
    from tests.conformance.openai_stub import Stub
    from tests.live_server import free_port

    failed = 0
    for name in names or [c.name for c in CLIENTS]:
        client = BY_NAME[name]
        if client.protocol == "grpc":
            print(f"{name}: skipped (capture speaks OTLP/HTTP; the _http variant sends the same data)")
            continue
        if not client.built:
            print(f"{name}: {client.build_hint}")
            failed += 1
            continue
        out = CAPTURES / name
        shutil.rmtree(out, ignore_errors=True)
        port = free_port()
        server = serve(out, port)
        try:
            with Stub() as stub:
                env = client_env(
                    client,
                    otlp_http=f"http://127.0.0.1:{port}",
                    otlp_grpc=None,
                    openai_base_url=stub.base_url,
                )
                result = run_client(client, out / "manifest.json", env)
        finally:
            server.shutdown()
        (out / "app.log").write_text(result.stdout + result.stderr)
        print(f"{name}: rc={result.returncode}, {len(list(out.glob('0*.json')))} requests -> {out}")
        if result.returncode:
            failed += 1
            print(result.stderr[-3000:])
    return 1 if failed else 0


def pack(names: list[str]) -> int:
    """Keep the traces and logs requests of each client's capture in `PACKED` (one gzipped JSON file
    a client: {"traces": [request, ...], "logs": [...]}, OTLP/JSON as captured, ids in hex), for
    tests that read real libraries' span shapes without their virtualenvs
    (tests/service/ingest/test_span_redaction.py)."""
    PACKED.mkdir(parents=True, exist_ok=True)
    missing = 0
    for name in names or [c.name for c in CLIENTS if c.protocol != "grpc"]:
        folder = CAPTURES / name
        requests: dict[str, list[object]] = {"traces": [], "logs": []}
        for path in sorted(folder.glob("0*-*.json")):
            signal = path.stem.split("-", 1)[1]
            if signal in requests:
                requests[signal].append(json.loads(path.read_text()))
        if not requests["traces"]:
            print(f"{name}: no capture in {folder}")
            missing += 1
            continue
        packed = json.dumps(requests, separators=(",", ":"), sort_keys=True).encode()
        (PACKED / f"{name}.json.gz").write_bytes(gzip.compress(packed, 9, mtime=0))
        print(f"{name}: {len(requests['traces'])} traces and {len(requests['logs'])} logs requests")
    return 1 if missing else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in ("capture", "pack"):
        sub.add_parser(command).add_argument("clients", nargs="*", help=", ".join(BY_NAME))
    args = parser.parse_args()
    unknown = sorted(set(args.clients) - set(BY_NAME))
    if unknown:
        parser.error(f"unknown clients {unknown}; known: {', '.join(BY_NAME)}")
    sys.exit(capture(args.clients) if args.command == "capture" else pack(args.clients))


if __name__ == "__main__":
    main()
