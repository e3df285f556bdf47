"""End to end through a real server: official OTLP exporters in, stored trace and metrics out."""

from __future__ import annotations

import asyncio
import gzip
import json
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from openinference.semconv.trace import (
    DocumentAttributes,
    EmbeddingAttributes,
    OpenInferenceSpanKindValues,
    SpanAttributes,
)
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from service.assemble import SpanGroups
from service.model import RagTrace
from tests.live_server import LiveServer, live_server

KIND = SpanAttributes.OPENINFERENCE_SPAN_KIND
PROTOBUF = {"content-type": "application/x-protobuf"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("ragmon"), assembler={"grace_s": 0.05}) as live:
        yield live


def rag_request(
    provider: TracerProvider,
    query: str,
    *,
    session: str = "s-1",
    regenerate: bool = False,
    vector: list[float] | None = None,
    llm_tokens: bool = True,
) -> str:
    """One RAG request as an OpenInference-instrumented app records it; returns the trace id (hex)."""
    tracer = provider.get_tracer("test-app")
    with tracer.start_as_current_span("rag") as root:
        root.set_attribute(KIND, OpenInferenceSpanKindValues.CHAIN.value)
        root.set_attribute(SpanAttributes.INPUT_VALUE, query)
        root.set_attribute(SpanAttributes.SESSION_ID, session)
        root.set_attribute(SpanAttributes.USER_ID, "alice@example.com")
        root.set_attribute(SpanAttributes.METADATA, json.dumps({"intent": "billing"}))
        if regenerate:
            root.set_attribute("ragmon.regeneration", True)
        with tracer.start_as_current_span("embed") as span:
            span.set_attribute(KIND, OpenInferenceSpanKindValues.EMBEDDING.value)
            span.set_attribute(SpanAttributes.EMBEDDING_MODEL_NAME, "text-embedding-3-small")
            prefix = f"{SpanAttributes.EMBEDDING_EMBEDDINGS}.0."
            span.set_attribute(prefix + EmbeddingAttributes.EMBEDDING_TEXT, query)
            span.set_attribute(prefix + EmbeddingAttributes.EMBEDDING_VECTOR, vector or [0.1, 0.2, 0.3, 0.4])
        with tracer.start_as_current_span("retrieve") as span:
            span.set_attribute(KIND, OpenInferenceSpanKindValues.RETRIEVER.value)
            span.set_attribute(SpanAttributes.INPUT_VALUE, query)
            for i, (doc, score) in enumerate([("doc-a", 0.91), ("doc-b", 0.72), ("doc-c", 0.40)]):
                prefix = f"{SpanAttributes.RETRIEVAL_DOCUMENTS}.{i}."
                span.set_attribute(prefix + DocumentAttributes.DOCUMENT_ID, doc)
                span.set_attribute(prefix + DocumentAttributes.DOCUMENT_SCORE, score)
                span.set_attribute(prefix + DocumentAttributes.DOCUMENT_CONTENT, f"content of {doc}")
        with tracer.start_as_current_span("generate") as span:
            span.set_attribute(KIND, OpenInferenceSpanKindValues.LLM.value)
            span.set_attribute(SpanAttributes.LLM_MODEL_NAME, "gpt-4o-mini")
            if llm_tokens:  # DSPy's LLM spans carry none
                span.set_attribute(SpanAttributes.LLM_TOKEN_COUNT_PROMPT, 1000)
                span.set_attribute(SpanAttributes.LLM_TOKEN_COUNT_COMPLETION, 200)
            span.set_attribute(SpanAttributes.OUTPUT_VALUE, "You can pay by card.")
        root.set_attribute(SpanAttributes.OUTPUT_VALUE, "You can pay by card.")
        trace_id = f"{root.get_span_context().trace_id:032x}"
    return trace_id


def provider_with(exporter: SpanExporter, app: str = "shop-assistant") -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": app, "service.version": "1.4.2"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def wait_for_trace(server: LiveServer, trace_id: str, headers: dict[str, str] | None = None) -> dict:
    server.flush()
    with server.client(headers=headers or {}) as client:
        deadline = time.monotonic() + 10
        while True:
            response = client.get(f"/api/v1/traces/{trace_id}")
            if response.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
            server.flush()
    assert response.status_code == 200, response.text
    record: dict = response.json()
    return record


def test_official_http_exporter_trace_is_stored_and_counted(server: LiveServer) -> None:
    before = server.metric("ragmon_traces_total", app="shop-assistant")
    provider = provider_with(HttpExporter(endpoint=f"{server.url}/v1/traces", timeout=10))
    trace_id = rag_request(provider, "How can I pay for my order?")
    provider.shutdown()
    record = wait_for_trace(server, trace_id)
    text = json.dumps(record)
    assert "How can I pay for my order?" in text and "You can pay by card." in text
    assert "doc-a" in text and "alice@example.com" not in text  # user ids are stored hashed only
    assert server.metric("ragmon_traces_total", app="shop-assistant") == before + 1
    assert (
        server.metric("ragmon_tokens_total", app="shop-assistant", model="gpt-4o-mini", kind="input") >= 1000
    )
    assert server.metric("ragmon_cost_usd_total", app="shop-assistant", model="gpt-4o-mini") > 0
    assert server.metric("ragmon_retrieval_top1_score_count", app="shop-assistant") >= 1
    assert server.metric("ragmon_stage_duration_seconds_count", app="shop-assistant", stage="retrieval") >= 1


def test_llm_call_without_token_counts_is_unknown_usage_not_zero_cost(server: LiveServer) -> None:
    # A DSPy-style LLM span: a priced model, no token counts. Its tokens and cost are unknown, not 0
    # and not "unpriced"; the trace stays out of the cost-per-trace histogram and is counted as unknown.
    app = "no-token-app"
    provider = provider_with(HttpExporter(endpoint=f"{server.url}/v1/traces", timeout=10), app=app)
    trace_id = rag_request(provider, "Which plans include support?", llm_tokens=False)
    provider.shutdown()
    record = wait_for_trace(server, trace_id)
    # the embedding alone is priced; the trace's tokens are unknown, its model is not unpriced
    assert (record["cost_usd"], record["unpriced"], record["usage_unknown"]) == (None, False, True)
    assert (record["input_tokens"], record["output_tokens"]) == (None, None)
    llm = [u for u in record["context"]["usage"] if u["kind"] == "llm"]
    assert llm == [
        {
            "model": "gpt-4o-mini",
            "kind": "llm",
            "input_tokens": None,
            "output_tokens": None,
            "cost_usd": None,
            "cost_source": "unknown_usage",
        }
    ]
    assert server.metric("ragmon_usage_unknown_calls_total", app=app, model="gpt-4o-mini") == 1
    assert server.metric("ragmon_unpriced_calls_total", app=app, model="gpt-4o-mini") == 0
    assert server.metric("ragmon_cost_usd_total", app=app, model="gpt-4o-mini") == 0
    assert server.metric("ragmon_trace_cost_usd_count", app=app) == 0
    assert server.metric("ragmon_traces_total", app=app) == 1


def test_official_grpc_exporter(server: LiveServer) -> None:
    provider = provider_with(
        GrpcExporter(endpoint=server.grpc_target, insecure=True, timeout=10), app="grpc-app"
    )
    trace_id = rag_request(provider, "Where is my parcel?")
    provider.shutdown()
    record = wait_for_trace(server, trace_id)
    assert "Where is my parcel?" in json.dumps(record)
    assert server.metric("ragmon_spans_received_total", receiver="otlp_grpc") >= 4


def encoded_request(query: str, app: str = "raw-app", **kwargs: object) -> tuple[bytes, str]:
    memory = InMemorySpanExporter()
    provider = provider_with(memory, app=app)
    trace_id = rag_request(provider, query, **kwargs)  # type: ignore[arg-type]
    spans: list[ReadableSpan] = list(memory.get_finished_spans())
    return encode_spans(spans).SerializeToString(), trace_id


def test_gzip_protobuf_body(server: LiveServer) -> None:
    body, trace_id = encoded_request("gzip question")
    with server.client() as client:
        response = client.post(
            "/v1/traces", content=gzip.compress(body), headers={**PROTOBUF, "content-encoding": "gzip"}
        )
    assert response.status_code == 200
    assert "gzip question" in json.dumps(wait_for_trace(server, trace_id))


def otlp_json(trace_id: str, spans: list[dict]) -> dict:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "json-app"}}]},
                "scopeSpans": [{"scope": {"name": "t"}, "spans": spans}],
            }
        ]
    }


def json_span(trace_id: str, span_id: str, parent: str | None, attrs: list[dict]) -> dict:
    span = {
        "traceId": trace_id,
        "spanId": span_id,
        "name": "x",
        "kind": 1,
        "startTimeUnixNano": "1764400000000000000",
        "endTimeUnixNano": "1764400000500000000",
        "attributes": attrs,
    }
    if parent:
        span["parentSpanId"] = parent
    return span


def test_otlp_json_body_and_partial_success_keeps_good_spans(server: LiveServer) -> None:
    good = "5b8efff798038103d269b633813fc60c"
    bad = "5b8efff798038103d269b633813fc60d"
    root = json_span(
        good,
        "eee19b7ec3c1b174",
        None,
        [
            {"key": KIND, "value": {"stringValue": "CHAIN"}},
            {"key": SpanAttributes.INPUT_VALUE, "value": {"stringValue": "json question"}},
        ],
    )
    # an embedding span whose vector holds a NaN: this span alone is rejected
    nan_span = json_span(
        bad,
        "eee19b7ec3c1b175",
        None,
        [
            {"key": KIND, "value": {"stringValue": "EMBEDDING"}},
            {
                "key": f"{SpanAttributes.EMBEDDING_EMBEDDINGS}.0.{EmbeddingAttributes.EMBEDDING_VECTOR}",
                "value": {"arrayValue": {"values": [{"doubleValue": 0.5}, {"doubleValue": "NaN"}]}},
            },
        ],
    )
    before = server.metric("ragmon_ingest_rejected_total", reason="nan_vector")
    with server.client() as client:
        response = client.post("/v1/traces", json=otlp_json(good, [root, nan_span]))
    assert response.status_code == 200
    partial = response.json()["partialSuccess"]
    assert int(partial["rejectedSpans"]) == 1 and "nan" in partial["errorMessage"].lower()
    assert "json question" in json.dumps(wait_for_trace(server, good))
    assert server.metric("ragmon_ingest_rejected_total", reason="nan_vector") == before + 1
    with server.client() as client:
        assert client.get(f"/api/v1/traces/{bad}").status_code == 404


@pytest.mark.parametrize(
    ("body", "headers", "status", "reason"),
    [
        (b"\x0a\xff\xff\xff", PROTOBUF, 400, "decode_error"),
        (b'{"resourceSpans": [', {"content-type": "application/json"}, 400, "decode_error"),
        (b'{"resourceSpans": "\xff\xfe"}', {"content-type": "application/json"}, 400, "decode_error"),
        (b'{"resourceSpans": 7}', {"content-type": "application/json"}, 400, "decode_error"),
        (b"hello", {"content-type": "text/plain"}, 415, "unsupported_media_type"),
        (b"x", {**PROTOBUF, "content-encoding": "br"}, 415, "unsupported_media_type"),
        (b"not gzip", {**PROTOBUF, "content-encoding": "gzip"}, 400, "decode_error"),
    ],
)
def test_bad_otlp_bodies_get_clear_errors_and_are_counted(
    server: LiveServer, body: bytes, headers: dict[str, str], status: int, reason: str
) -> None:
    before = server.metric("ragmon_ingest_rejected_total", reason=reason)
    with server.client() as client:
        response = client.post("/v1/traces", content=body, headers=headers)
    assert response.status_code == status, response.text
    if headers["content-type"] == "application/json":
        assert response.json()["message"]
    assert server.metric("ragmon_ingest_rejected_total", reason=reason) == before + 1
    with server.client() as client:
        assert client.get("/healthz").status_code == 200  # the process is fine


def test_oversized_bodies_are_refused_with_413(tmp_path: Path) -> None:
    with live_server(tmp_path, server={"max_body_bytes": 1000}) as small:
        with small.client() as client:
            declared = client.post("/v1/traces", content=b"\0" * 5000, headers=PROTOBUF)

            def chunks() -> Iterator[bytes]:
                for _ in range(10):
                    yield b"\0" * 500

            streamed = client.post("/v1/traces", content=chunks(), headers=PROTOBUF)
            bomb = client.post(
                "/v1/traces",
                content=gzip.compress(b"\0" * 100_000),
                headers={**PROTOBUF, "content-encoding": "gzip"},
            )
        assert declared.status_code == 413 and streamed.status_code == 413 and bomb.status_code == 413
        assert small.metric("ragmon_ingest_rejected_total", reason="too_large") == 3


def test_api_keys_map_to_tenants_and_isolate_them(tmp_path: Path) -> None:
    keys = {"key-acme-123": "acme", "key-globex-456": "globex"}
    with live_server(tmp_path, auth={"api_keys": keys}) as keyed:
        body, trace_id = encoded_request("tenant question", app="tenant-app")
        with keyed.client() as client:
            missing = client.post("/v1/traces", content=body, headers=PROTOBUF)
            wrong = client.post("/v1/traces", content=body, headers={**PROTOBUF, "x-api-key": "nope"})
            ok = client.post(
                "/v1/traces", content=body, headers={**PROTOBUF, "authorization": "Bearer key-acme-123"}
            )
        assert (missing.status_code, wrong.status_code, ok.status_code) == (401, 403, 200)
        record = wait_for_trace(keyed, trace_id, {"x-api-key": "key-acme-123"})
        assert record.get("tenant", "acme") == "acme"
        with keyed.client(headers={"x-api-key": "key-globex-456"}) as other:
            assert other.get(f"/api/v1/traces/{trace_id}").status_code == 404
            assert other.get("/api/v1/traces").json()["items"] == []
        assert keyed.metric("ragmon_ingest_rejected_total", reason="unauthenticated") == 1
        assert keyed.metric("ragmon_ingest_rejected_total", reason="bad_api_key") == 1


def test_json_api_partial_batch_and_feedback_before_trace(server: LiveServer) -> None:
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    with server.client() as client:
        # feedback first: the trace does not exist yet
        fb = client.post(
            "/api/v1/feedback",
            json={"trace_id": trace_id, "kind": "down", "reason": "wrong", "event_id": "ev-1"},
        )
        assert fb.status_code == 200
        good = {
            "trace_id": trace_id,
            "app": "json-api-app",
            "query": "What is the refund window?",
            "answer": "30 days.",
            "retrieval": {"chunks": [{"id": "policy-1", "score": 0.8}]},
            "timings": {"total_s": 1.2, "retrieval_s": 0.1},
            "usage": [
                {"model": "gpt-4o-mini", "input_tokens": 500, "output_tokens": 20},
                {"model": "my-private-llm", "input_tokens": 10, "output_tokens": 10},
                {"model": "gpt-4o", "kind": "llm"},  # no counts: unknown usage, not 0 tokens at 0 USD
            ],
        }
        bad_type = {"trace_id": "1af7651916cd43dd8448eb211c80319c", "timings": {"total_s": "slow"}}
        bad_id = {"trace_id": "xyz"}
        nan = {"trace_id": "2af7651916cd43dd8448eb211c80319c", "query_embedding": {"vector": [1.0, math.nan]}}
        body = json.dumps({"traces": [good, bad_type, bad_id]})
        response = client.post("/api/v1/traces", content=body, headers={"content-type": "application/json"})
        assert response.status_code == 200, response.text
        out = response.json()
        assert out["accepted"] == 1 and [r["index"] for r in out["rejected"]] == [1, 2]
        assert "timings.total_s" in out["rejected"][0]["error"]
        nan_response = client.post(
            "/api/v1/traces",
            content=json.dumps({"traces": [nan]}),
            headers={"content-type": "application/json"},
        )
        assert nan_response.status_code == 422
        # the same feedback event again is stored once
        client.post("/api/v1/feedback", json={"trace_id": trace_id, "kind": "down", "event_id": "ev-1"})
    record = wait_for_trace(server, trace_id)
    text = json.dumps(record)
    assert "What is the refund window?" in text and text.count("ev-1") == 1
    assert (
        server.metric("ragmon_feedback_total", app="none", rating="down")
        + server.metric("ragmon_feedback_total", app="json-api-app", rating="down")
        == 1
    )
    assert server.metric("ragmon_unpriced_calls_total", app="json-api-app", model="my-private-llm") == 1
    assert server.metric("ragmon_usage_unknown_calls_total", app="json-api-app", model="gpt-4o") == 1
    assert server.metric("ragmon_cost_usd_total", app="json-api-app", model="gpt-4o") == 0
    assert record["cost_usd"] is None


def test_bad_json_api_bodies(server: LiveServer) -> None:
    with server.client() as client:
        malformed = client.post("/api/v1/traces", content=b"{", headers={"content-type": "application/json"})
        wrong_type = client.post("/api/v1/feedback", json={"trace_id": "0" * 32, "kind": "meh"})
        utf8 = client.post(
            "/api/v1/feedback", content=b'{"trace_id": "\xff"}', headers={"content-type": "application/json"}
        )
    assert malformed.status_code == 400 and malformed.json()["error"] == "decode_error"
    assert wrong_type.status_code == 422 and "kind" in wrong_type.json()["detail"]
    assert utf8.status_code in (400, 422)


def test_explicit_and_implicit_regenerations_are_counted(server: LiveServer) -> None:
    memory = InMemorySpanExporter()
    provider = provider_with(memory, app="regen-app")
    rag_request(provider, "How do I cancel my subscription?", session="regen-s")
    rag_request(provider, "how do I cancel my subscription", session="regen-s")
    rag_request(provider, "Totally different question", session="regen-s", regenerate=True)
    body = encode_spans(list(memory.get_finished_spans())).SerializeToString()
    with server.client() as client:
        assert client.post("/v1/traces", content=body, headers=PROTOBUF).status_code == 200
    server.flush()
    assert server.metric("ragmon_regenerations_total", app="regen-app", intent="billing", source="reask") == 1
    assert (
        server.metric("ragmon_regenerations_total", app="regen-app", intent="billing", source="attribute")
        == 1
    )


def test_full_bus_answers_503_with_retry_after(tmp_path: Path) -> None:
    with live_server(tmp_path, bus={"capacity": 2}) as busy:
        busy.call(busy.pipeline.bus.stop())  # the bus stops delivering: what is queued stays queued
        with busy.client() as client:
            statuses = []
            for i in range(4):
                record = {"trace_id": f"{i + 1:032x}", "query": f"q{i}"}
                response = client.post("/api/v1/traces", json={"traces": [record]})
                statuses.append(response.status_code)
            assert statuses[:2] == [200, 200] and statuses[2:] == [503, 503]
            assert response.headers["retry-after"] == "1"
            # it answers (503 + Retry-After), so it stays ready: out of a Service, callers would get
            # connection errors instead
            ready = client.get("/readyz")
            assert ready.status_code == 200
            assert ready.json()["detail"] == "degraded: backlog at capacity; answering 503 + Retry-After"
        assert busy.metric("ragmon_ingest_rejected_total", reason="queue_full") == 2


def test_traces_waiting_to_be_built_count_against_capacity(tmp_path: Path) -> None:
    """A build that falls behind is back-pressure (503), not a queue that grows in memory."""
    started, release = threading.Event(), threading.Event()

    def otlp_trace_body(n: int) -> bytes:
        memory = InMemorySpanExporter()
        rag_request(provider_with(memory, app="backlog-app"), f"question {n}")
        return encode_spans(list(memory.get_finished_spans())).SerializeToString()

    with live_server(tmp_path, bus={"capacity": 2}, assembler={"grace_s": 0.0}) as busy:
        assembler = busy.pipeline.assembler
        real_build = assembler.build

        async def stalled_build(groups: SpanGroups) -> list[RagTrace | None]:
            started.set()
            await asyncio.to_thread(release.wait, 30)
            return await real_build(groups)

        assembler.build = stalled_build
        try:
            with busy.client() as client:
                first = otlp_trace_body(1)
                assert client.post("/v1/traces", content=first, headers=PROTOBUF).status_code == 200
                assert started.wait(10)
                second = otlp_trace_body(2)
                assert client.post("/v1/traces", content=second, headers=PROTOBUF).status_code == 200
                # one trace in the stalled build, one complete behind it; the bus itself is empty
                assert assembler.backlog == 2 and busy.pipeline.bus.depth == 0
                refused = client.post("/v1/traces", content=otlp_trace_body(3), headers=PROTOBUF)
                assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
                assert busy.metric("ragmon_build_backlog_traces") == 2
        finally:
            release.set()
        busy.flush()
        assert busy.metric("ragmon_ingest_rejected_total", reason="queue_full") == 1
        assert busy.metric("ragmon_traces_total", app="backlog-app") == 2


def test_metrics_endpoint_and_probes(server: LiveServer) -> None:
    with server.client() as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.get("/readyz").status_code == 200
        text = client.get("/metrics").text
    for name in (
        "ragmon_traces_total",
        "ragmon_stage_duration_seconds_bucket",
        "ragmon_open_traces",
        "ragmon_bus_queue_depth",
        "ragmon_ingest_rejected_total",
    ):
        assert name in text
    assert "alice" not in text and "session" not in text


def test_list_traces_paginates_and_filters(server: LiveServer) -> None:
    with server.client() as client:
        records = [
            {"trace_id": f"{0xABC000 + i:032x}", "app": "page-app", "query": f"q{i}"} for i in range(7)
        ]
        assert client.post("/api/v1/traces", json={"traces": records}).status_code == 200
        server.flush()
        seen: list[str] = []
        cursor = None
        while True:
            params: dict[str, str | int] = {"app": "page-app", "limit": 3}
            if cursor:
                params["cursor"] = cursor
            page = client.get("/api/v1/traces", params=params).json()
            seen += [item["trace_id"] for item in page["items"]]
            cursor = page["next_cursor"]
            if not cursor:
                break
    assert sorted(seen) == sorted(r["trace_id"] for r in records)
