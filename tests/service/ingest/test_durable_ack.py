"""A 200 is a promise, embedded mode: `ragmon serve` SIGKILLed right after its last 200, restarted on the
same data dir, stores exactly what it acknowledged (OTLP protobuf and JSON, the JSON API, feedback) and
nothing twice; a clean stop leaves an empty write-ahead log."""

from __future__ import annotations

import gzip
import signal
import sqlite3
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.live_server import free_port
from tests.processes import descendants, wait_gone
from tests.serve_process import start_serve, wait_ready

pytestmark = pytest.mark.slow

SETTINGS = {"RAGMON_SERVER__INGEST_PROCESSES": "1", "RAGMON_ASSEMBLER__GRACE_S": "1"}
PROTOBUF = {"content-type": "application/x-protobuf"}
TRACES_PER_REQUEST = 50
OTLP_REQUESTS = 56  # 2,800 traces by OTLP
JSON_REQUESTS = 4  # 200 by the JSON API: 3,000 in all
FEEDBACK_REQUESTS = 4


def _template() -> ExportTraceServiceRequest:
    """One 4-span RAG request as the OpenTelemetry SDK exports it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "durable-app"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("rag") as root:
        root.set_attribute("openinference.span.kind", "CHAIN")
        root.set_attribute("input.value", "how long do refunds take?")
        root.set_attribute("output.value", "Five working days.")
        with tracer.start_as_current_span("retrieve") as span:
            span.set_attribute("openinference.span.kind", "RETRIEVER")
            span.set_attribute("retrieval.documents.0.document.id", "refunds")
        with tracer.start_as_current_span("llm") as span:
            span.set_attribute("openinference.span.kind", "LLM")
            span.set_attribute("llm.model_name", "gpt-4o-mini")
    provider.shutdown()
    return encode_spans(exporter.get_finished_spans())


def _otlp_body(template: ExportTraceServiceRequest, first: int) -> tuple[bytes, list[str]]:
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.CopyFrom(template.resource_spans[0].resource)
    scope = resource_spans.scope_spans.add()
    ids = []
    for n in range(first, first + TRACES_PER_REQUEST):
        trace_id = n.to_bytes(16, "big")
        ids.append(trace_id.hex())
        for span in template.resource_spans[0].scope_spans[0].spans:
            scope.spans.add().CopyFrom(span)
            scope.spans[-1].trace_id = trace_id
    return request.SerializeToString(), ids


def _json_traces(first: int) -> tuple[dict, list[str]]:
    ids = [f"{n:032x}" for n in range(first, first + TRACES_PER_REQUEST)]
    records = [
        {
            "trace_id": t,
            "app": "durable-json",
            "query": "q",
            "answer": "a",
            "retrieval": {"chunks": [{"id": "c"}]},
        }
        for t in ids
    ]
    return {"traces": records}, ids


def _rows(db: Path, query: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(query).fetchall()


def test_sigkill_right_after_the_last_200_loses_nothing_acknowledged(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_serve(data_dir, port, SETTINGS)
    wait_ready(url, server)
    template = _template()
    acked_traces: set[str] = set()
    acked_feedback: set[str] = set()
    refused = 0

    def send(job: tuple[str, int]) -> None:
        nonlocal refused
        kind, n = job
        with httpx.Client(base_url=url, timeout=30) as client:
            if kind == "otlp":
                body, ids = _otlp_body(template, 1 + n * TRACES_PER_REQUEST)
                zipped = n % 2 == 0
                response = client.post(
                    "/v1/traces",
                    content=gzip.compress(body) if zipped else body,
                    headers={**PROTOBUF, "content-encoding": "gzip"} if zipped else PROTOBUF,
                )
            elif kind == "json":
                payload, ids = _json_traces(1_000_000 + n * TRACES_PER_REQUEST)
                response = client.post("/api/v1/traces", json=payload)
            else:
                ids = [f"fb-{n}-{i}-{uuid.uuid4().hex[:6]}" for i in range(25)]
                events = [
                    {"trace_id": f"{1 + i:032x}", "kind": "down", "event_id": e} for i, e in enumerate(ids)
                ]
                response = client.post("/api/v1/feedback", json=events)
            if response.status_code == 200:
                (acked_feedback if kind == "feedback" else acked_traces).update(ids)
            else:
                assert response.status_code == 503, response.text
                refused += 1

    jobs = (
        [("otlp", n) for n in range(OTLP_REQUESTS)]
        + [("json", n) for n in range(JSON_REQUESTS)]
        + [("feedback", n) for n in range(FEEDBACK_REQUESTS)]
    )
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(send, jobs))
    workers = descendants(server.pid)
    server.send_signal(signal.SIGKILL)  # right after the last 200: no drain, no flush
    server.wait(timeout=30)
    assert wait_gone(workers, timeout_s=20) == set()
    db = data_dir / "ragmon.db"
    stored_before = _rows(db, "SELECT count(*) FROM traces")[0][0] if db.exists() else 0
    assert len(acked_traces) + refused * TRACES_PER_REQUEST >= 3_000 - FEEDBACK_REQUESTS * TRACES_PER_REQUEST
    assert len(acked_traces) > 2_500, f"only {len(acked_traces)} acknowledged ({refused} refused)"

    server = start_serve(data_dir, port, SETTINGS)
    try:
        wait_ready(url, server)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            stored = {r[0] for r in _rows(db, "SELECT trace_id FROM traces")}
            if stored >= acked_traces:
                break
            time.sleep(0.5)
        time.sleep(1.5)  # anything more (a duplicate, a stray) would show up by now
        stored_rows = _rows(db, "SELECT trace_id FROM traces")
        feedback_rows = _rows(db, "SELECT event_id FROM feedback")
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    assert len(stored_rows) == len({r[0] for r in stored_rows}) == len(acked_traces)
    assert {r[0] for r in stored_rows} == acked_traces
    assert {r[0] for r in feedback_rows} == acked_feedback
    assert stored_before < len(acked_traces), "nothing was in flight at the kill: the test proves nothing"
    replayed = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("ragmon_wal_replayed_records_total{")
    )
    assert replayed > 0
    # a clean stop stores everything and deletes every segment
    assert list((data_dir / "wal").glob("*.wal")) == []
