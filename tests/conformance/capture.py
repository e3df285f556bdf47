"""A tiny OTLP/HTTP capture server: point a client at it instead of ragmon to see what it sends.

    .venv/bin/python tests/conformance/capture.py serve --port 4318 --out /tmp/conformance-captures/langchain
    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 <client app>
    .venv/bin/python tests/conformance/capture.py summary /tmp/conformance-captures/langchain

It accepts `POST /v1/traces`, `/v1/logs` and `/v1/metrics` in protobuf or JSON, gzip or not,
answers 200 with an empty (partial-success-free) response in the caller's encoding, and dumps
each request as OTLP/JSON (`google.protobuf.json_format`, camelCase names as the OTLP/JSON spec
has them) to `<out>/<seq>-<signal>.json`. Trace and span ids are rewritten from base64 to hex, as
OTLP/JSON writes them, so they can be matched against ragmon's trace ids by eye.

`summary` prints one line per span (trace, parent, kind, name, attributes) and per log record.
`run` starts the server, runs a command with the OTLP environment pointed at it, and stops.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import gzip
import itertools
import json
import os
import subprocess
import sys
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

SIGNALS: dict[str, tuple[type[Message], type[Message]]] = {
    "/v1/traces": (ExportTraceServiceRequest, ExportTraceServiceResponse),
    "/v1/logs": (ExportLogsServiceRequest, ExportLogsServiceResponse),
    "/v1/metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse),
}
_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId"})


def hex_ids(node: Any) -> Any:
    """json_format writes bytes as base64; OTLP/JSON writes trace and span ids as hex."""
    if isinstance(node, dict):
        return {
            k: base64.b64decode(v).hex() if k in _ID_KEYS and isinstance(v, str) else hex_ids(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [hex_ids(v) for v in node]
    return node


def make_handler(out: Path) -> type[BaseHTTPRequestHandler]:
    counter = itertools.count()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _body(self) -> bytes:
            """The request body, sent with a content-length or chunked (Node's OTLP exporters)."""
            if "chunked" not in (self.headers.get("transfer-encoding") or "").lower():
                return self.rfile.read(int(self.headers.get("content-length") or 0))
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()  # the CRLF after each chunk
            while self.rfile.readline().strip():  # trailers, up to the blank line
                pass
            return b"".join(chunks)

        def do_POST(self) -> None:
            path = self.path.split("?")[0]
            if path not in SIGNALS:
                self.send_error(404)
                return
            request_type, response_type = SIGNALS[path]
            body = self._body()
            encoding = (self.headers.get("content-encoding") or "").lower()
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            is_json = "json" in (self.headers.get("content-type") or "")
            message = request_type()
            if is_json:
                json_format.Parse(body, message, ignore_unknown_fields=True)
            else:
                message.ParseFromString(body)
            dump = hex_ids(json_format.MessageToDict(message))
            with lock:
                seq = next(counter)
            name = f"{seq:04d}-{path.rsplit('/', 1)[1]}.json"
            (out / name).write_text(json.dumps(dump, indent=1))
            response = response_type()
            if is_json:
                payload, content_type = json_format.MessageToJson(response).encode(), "application/json"
            else:
                payload, content_type = response.SerializeToString(), "application/x-protobuf"
            self.send_response(200)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    return Handler


def serve(out: Path, port: int) -> ThreadingHTTPServer:
    out.mkdir(parents=True, exist_ok=True)
    server = ThreadingHTTPServer(("127.0.0.1", port), make_handler(out))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _value(v: dict[str, Any]) -> Any:
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", [])]
    if "kvlistValue" in v:
        return {kv["key"]: _value(kv.get("value", {})) for kv in v["kvlistValue"].get("values", [])}
    for key in ("stringValue", "boolValue", "intValue", "doubleValue", "bytesValue"):
        if key in v:
            return v[key]
    return None


def _attrs(items: list[dict[str, Any]], width: int) -> str:
    parts = []
    for kv in items:
        text = json.dumps(_value(kv.get("value", {})), ensure_ascii=False)
        parts.append(f"{kv['key']}={text[:width]}{'…' if len(text) > width else ''}")
    return " ".join(parts)


def summary(out: Path, width: int = 160) -> None:
    for path in sorted(out.glob("*.json")):
        dump = json.loads(path.read_text())
        print(f"== {path.name}")
        for rs in dump.get("resourceSpans", []):
            print("  resource:", _attrs(rs.get("resource", {}).get("attributes", []), width))
            for ss in rs.get("scopeSpans", []):
                scope = ss.get("scope", {}).get("name")
                for s in ss.get("spans", []):
                    ms = (int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"])) / 1e6
                    print(
                        f"  span {s['traceId'][:8]} {s['spanId'][:6]}<-{s.get('parentSpanId', '')[:6]:6} "
                        f"{s.get('kind', '')} [{scope}] {s['name']!r} {ms:.1f}ms"
                    )
                    print("     ", _attrs(s.get("attributes", []), width))
                    for e in s.get("events", []):
                        print(f"      event {e['name']!r}", _attrs(e.get("attributes", []), width))
        for rl in dump.get("resourceLogs", []):
            for sl in rl.get("scopeLogs", []):
                for r in sl.get("logRecords", []):
                    print(
                        f"  log trace={r.get('traceId', '')[:8]} span={r.get('spanId', '')[:6]} "
                        f"event={r.get('eventName')!r} [{sl.get('scope', {}).get('name')}]",
                        _attrs(r.get("attributes", []), width),
                    )
                    body = json.dumps(_value(r.get("body", {})), ensure_ascii=False)
                    print(f"      body={body[: width * 2]}")
        for rm in dump.get("resourceMetrics", []):
            names = [m["name"] for sm in rm.get("scopeMetrics", []) for m in sm.get("metrics", [])]
            print("  metrics:", ", ".join(names))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    p_serve = sub.add_parser("serve")
    p_serve.add_argument("--port", type=int, default=4318)
    p_serve.add_argument("--out", type=Path, required=True)
    p_run = sub.add_parser("run", help="capture while COMMAND runs with OTEL_EXPORTER_OTLP_ENDPOINT set")
    p_run.add_argument("--port", type=int, default=4318)
    p_run.add_argument("--out", type=Path, required=True)
    p_run.add_argument("cmd", nargs=argparse.REMAINDER)
    p_sum = sub.add_parser("summary")
    p_sum.add_argument("out", type=Path)
    p_sum.add_argument("--width", type=int, default=160)
    args = parser.parse_args()
    if args.command == "summary":
        summary(args.out, args.width)
        return
    server = serve(args.out, args.port)
    if args.command == "serve":
        print(f"capturing on http://127.0.0.1:{args.port} into {args.out}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
        return
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{args.port}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
    }
    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    rc = subprocess.call(cmd, env=env)
    server.shutdown()
    sys.exit(rc)


if __name__ == "__main__":
    main()
