"""IngestPool: decoding and building in worker processes gives what the server process would,
errors keep their meaning across the process boundary, and a killed worker loses nothing."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import re
import signal
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from service.conventions.pricing import PriceTable
from service.conventions.semconv import build_trace
from service.conventions.spans import AnySpan, PackedSpan, Span, WireSpan
from service.errors import DecodeError, PayloadTooLarge, UnsupportedMediaType
from service.ingest import otlp, otlp_body, otlp_protobuf
from service.ingest.pool import IngestPool, _unpacked
from service.metrics import Metrics
from service.model import RagTrace
from service.processes import cgroup_cpus
from tests.live_server import live_server

TENANT = "acme"
PROTOBUF = {"content-type": "application/x-protobuf"}
LIMIT = 64 * 1024 * 1024
PRICES = PriceTable.default()


def _one_trace_request() -> ExportTraceServiceRequest:
    """A 4-span RAG trace as the OpenTelemetry SDK exports it (OpenInference attributes)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "pool-app"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("rag") as root:
        root.set_attribute("openinference.span.kind", "CHAIN")
        root.set_attribute("input.value", "how do I rotate the api key?")
        root.set_attribute("output.value", "Open settings, then API keys, then rotate.")
        with tracer.start_as_current_span("embed") as span:
            span.set_attribute("openinference.span.kind", "EMBEDDING")
            span.set_attribute("embedding.model_name", "text-embedding-3-small")
            span.set_attribute("embedding.embeddings.0.embedding.vector", [0.1, 0.2, 0.3, 0.4])
        with tracer.start_as_current_span("retrieve") as span:
            span.set_attribute("openinference.span.kind", "RETRIEVER")
            for i in range(3):
                span.set_attribute(f"retrieval.documents.{i}.document.id", f"doc-{i}")
                span.set_attribute(f"retrieval.documents.{i}.document.score", 0.9 - i / 10)
                span.set_attribute(f"retrieval.documents.{i}.document.content", f"chunk {i} about keys")
        with tracer.start_as_current_span("llm") as span:
            span.set_attribute("openinference.span.kind", "LLM")
            span.set_attribute("llm.model_name", "gpt-4o-mini")
            span.set_attribute("llm.token_count.prompt", 120)
            span.set_attribute("llm.token_count.completion", 30)
    provider.shutdown()
    return encode_spans(exporter.get_finished_spans())


def _body(traces: int) -> bytes:
    """`traces` copies of the trace above, each with its own trace id, in one request."""
    template = _one_trace_request()
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.CopyFrom(template.resource_spans[0].resource)
    scope_spans = resource_spans.scope_spans.add()
    spans = template.resource_spans[0].scope_spans[0].spans
    for n in range(traces):
        trace_id = (n + 1).to_bytes(16, "big")
        for span in spans:
            copy = scope_spans.spans.add()
            copy.CopyFrom(span)
            copy.trace_id = trace_id
    return request.SerializeToString()


def _otlp_json_body() -> bytes:
    """An OTLP/JSON request with a root span and a retriever span of one trace."""

    def span(span_id: str, parent: str, attributes: dict[str, Any]) -> dict[str, Any]:
        return {
            "traceId": "0000000000000000000000000000abcd",
            "spanId": span_id,
            "parentSpanId": parent,
            "name": f"span-{span_id}",
            "startTimeUnixNano": "1700000000000000000",
            "endTimeUnixNano": "1700000001000000000",
            "attributes": [{"key": k, "value": v} for k, v in attributes.items()],
        }

    spans = [
        span("00000000000000a1", "", {"input.value": {"stringValue": "a question"}}),
        span(
            "00000000000000a2",
            "00000000000000a1",
            {"retrieval.documents.0.document.id": {"stringValue": "d"}},
        ),
    ]
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "pool-app"}}]}
    return json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": spans}]}]}).encode()


def _groups(spans: Sequence[AnySpan]) -> list[tuple[list[AnySpan], bool]]:
    by_trace: dict[str, list[AnySpan]] = defaultdict(list)
    for span in spans:
        by_trace[span.trace_id].append(span)
    return [(group, False) for group in by_trace.values()]


def _unpack(spans: Sequence[AnySpan]) -> list[Span]:
    problems = otlp.DecodedBatch()
    unpacked = [_unpacked(s, problems) for s in spans]
    assert not problems.rejections
    return unpacked


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
async def pool(metrics: Metrics) -> Iterator[IngestPool]:
    workers = IngestPool(1, PRICES, metrics)
    await workers.start()
    yield workers
    await workers.stop()


def _restarts(metrics: Metrics, role: str) -> float:
    return metrics.registry.get_sample_value("ragmon_ingest_pool_restarts_total", {"role": role}) or 0.0


async def test_workers_decode_and_build_exactly_what_the_server_process_would(pool: IngestPool) -> None:
    body = _body(20)
    pids = pool.worker_pids()
    assert len(pids["decoder"]) == 1 and len(pids["builder"]) == 1
    assert os.getpid() not in pids["decoder"] | pids["builder"]

    decoded = await pool.decode(body, json_body=False, encoding="", tenant=TENANT, limit=LIMIT)
    here = otlp_body.decode_body(body, json_body=False, encoding="", tenant=TENANT, limit=LIMIT)
    # protobuf spans come back screened, as their wire bytes; decoding those is what decode_protobuf does
    assert decoded.spans and all(isinstance(s, WireSpan) for s in decoded.spans)
    assert decoded.spans == here.spans
    assert _unpack(decoded.spans) == otlp_protobuf.decode_protobuf(body, TENANT).spans

    # OTLP/JSON spans are decoded in the worker and come back pickled: routing fields in the clear
    json_body = _otlp_json_body()
    from_json = await pool.decode(json_body, json_body=True, encoding="", tenant=TENANT, limit=LIMIT)
    json_here = otlp_body.decode_body(json_body, json_body=True, encoding="", tenant=TENANT, limit=LIMIT)
    assert len(from_json.spans) == 2 and all(isinstance(s, PackedSpan) for s in from_json.spans)
    assert _unpack(from_json.spans) == json_here.spans
    assert [(s.tenant, s.trace_id, s.is_root, s.size_bytes) for s in from_json.spans] == [
        (s.tenant, s.trace_id, s.is_root, s.size_bytes) for s in json_here.spans
    ]

    built = await pool.build_traces(_groups(decoded.spans))
    expected = [build_trace(_unpack(spans), partial=False, prices=PRICES) for spans, _ in _groups(here.spans)]
    assert built == expected
    assert len(built) == 20 and all(t is not None and t.app == "pool-app" for t in built)
    first = built[0]
    assert first is not None and first.query == "how do I rotate the api key?"
    assert [c.id for c in first.retrieval.chunks] == ["doc-0", "doc-1", "doc-2"]


async def test_errors_keep_their_kind_and_reason_across_the_process_boundary(pool: IngestPool) -> None:
    with pytest.raises(DecodeError) as not_protobuf:
        await pool.decode(b"\xff\xff\xff", json_body=False, encoding="", tenant=TENANT, limit=LIMIT)
    assert not_protobuf.value.reason == "decode_error"
    bomb = gzip.compress(b"\0" * 2_000_000)
    with pytest.raises(PayloadTooLarge) as too_large:
        await pool.decode(bomb, json_body=False, encoding="gzip", tenant=TENANT, limit=1_000_000)
    assert too_large.value.status_code == 413 and "1000000" in too_large.value.message
    with pytest.raises(UnsupportedMediaType):
        await pool.decode(_body(1), json_body=False, encoding="br", tenant=TENANT, limit=LIMIT)
    with pytest.raises(DecodeError, match="not valid JSON"):
        await pool.decode(b"{nope", json_body=True, encoding="", tenant=TENANT, limit=LIMIT)
    # the pool is still whole afterwards
    decoded = await pool.decode(_body(2), json_body=False, encoding="", tenant=TENANT, limit=LIMIT)
    assert len(decoded.spans) == 8


async def test_a_trace_that_cannot_be_built_is_none_and_the_others_survive(pool: IngestPool) -> None:
    decoded = await pool.decode(_body(3), json_body=False, encoding="", tenant=TENANT, limit=LIMIT)
    groups = _groups(decoded.spans)
    broken = _unpack(groups[1][0])
    for span in broken:
        span.trace_id = "not-a-trace-id"  # RagTrace refuses it: the builder raises for this group
    built = await pool.build_traces([groups[0], (broken, False), groups[2]])
    assert [t is None for t in built] == [False, True, False]


async def test_a_body_larger_than_the_pipes_crosses_whole(pool: IngestPool) -> None:
    body = _body(3000)
    assert len(body) > 1 << 20  # pipes hold at most 1 MiB unless pipe-max-size is raised
    decoded = await pool.decode(body, json_body=False, encoding="", tenant=TENANT, limit=LIMIT)
    here = otlp_body.decode_body(body, json_body=False, encoding="", tenant=TENANT, limit=LIMIT)
    assert decoded.spans == here.spans


async def _kill_during(pid: int, call: asyncio.Task[object]) -> None:
    await asyncio.sleep(0.15)  # the call is queued or running in that worker by now
    assert not call.done(), "the call finished before the worker could be killed; make it bigger"
    os.kill(pid, signal.SIGKILL)


def _pid(pool: IngestPool, role: str) -> int:
    (pid,) = pool.worker_pids()[role]
    return pid


async def test_a_decoder_killed_mid_request_loses_nothing(pool: IngestPool, metrics: Metrics) -> None:
    body = _body(8000)  # ~0.5 s of screening and sending spans back
    pid = _pid(pool, "decoder")
    call = asyncio.create_task(pool.decode(body, json_body=False, encoding="", tenant=TENANT, limit=LIMIT))
    await _kill_during(pid, call)
    decoded = await call
    assert len(decoded.spans) == 32_000 and decoded.rejected_spans == 0
    assert len({s.trace_id for s in decoded.spans}) == 8000
    assert _restarts(metrics, "decoder") == 1 and _restarts(metrics, "builder") == 0
    # a new decoder took over
    new_pid = _pid(pool, "decoder")
    assert new_pid != pid
    again = await pool.decode(_body(2), json_body=False, encoding="", tenant=TENANT, limit=LIMIT)
    assert len(again.spans) == 8


async def test_a_builder_killed_mid_build_loses_nothing(pool: IngestPool, metrics: Metrics) -> None:
    decoded = await pool.decode(_body(3000), json_body=False, encoding="", tenant=TENANT, limit=LIMIT)
    groups = _groups(decoded.spans)
    pid = _pid(pool, "builder")
    call = asyncio.create_task(pool.build_traces(groups))
    await _kill_during(pid, call)
    built = await call
    assert len(built) == 3000 and all(isinstance(t, RagTrace) for t in built)
    assert [t.trace_id for t in built if t is not None] == [spans[0].trace_id for spans, _ in groups]
    assert _restarts(metrics, "builder") == 1
    rebuilt = await pool.build_traces(groups[:5])
    assert rebuilt == built[:5]


async def test_zero_processes_decodes_and_builds_in_threads(metrics: Metrics) -> None:
    pool = IngestPool(0, PRICES, metrics)
    await pool.start()
    try:
        assert pool.worker_pids() == {"decoder": set(), "builder": set()}
        decoded = await pool.decode(_body(2), json_body=False, encoding="", tenant=TENANT, limit=LIMIT)
        assert all(type(s) is WireSpan for s in decoded.spans)
        built = await pool.build_traces(_groups(decoded.spans))
        assert [t.trace_id if t else None for t in built] == [f"{n:032x}" for n in (1, 2)]
    finally:
        await pool.stop()


@pytest.mark.parametrize("processes", [0, 1])
async def test_attribute_values_dropped_from_wire_spans_are_counted_when_built(
    metrics: Metrics, processes: int
) -> None:
    """A protobuf span's attributes are converted when its trace is built, so a wrong-typed value
    is dropped and counted then, and the rest of the trace is kept."""
    request = ExportTraceServiceRequest.FromString(_body(2))
    for span in request.resource_spans[0].scope_spans[0].spans:
        for attribute in span.attributes:
            if attribute.key == "llm.token_count.prompt":
                attribute.value.string_value = "lots"  # a count that is not a number
    pool = IngestPool(processes, PRICES, metrics)
    await pool.start()
    try:
        body = request.SerializeToString()
        decoded = await pool.decode(body, json_body=False, encoding="", tenant=TENANT, limit=LIMIT)
        assert decoded.rejections == {} and decoded.error_message == ""  # not known yet
        built = await pool.build_traces(_groups(decoded.spans))
    finally:
        await pool.stop()
    rejected = metrics.registry.get_sample_value(
        "ragmon_ingest_rejected_total", {"reason": "invalid_attribute"}
    )
    assert rejected == 2
    assert len(built) == 2 and all(t is not None and t.query == "how do I rotate the api key?" for t in built)
    # what decode_protobuf reports for the same body, at once
    assert otlp_protobuf.decode_protobuf(body, TENANT).rejections == {"invalid_attribute": 2}


@pytest.mark.parametrize("processes", [0, 1])
def test_server_stores_the_same_traces_with_and_without_worker_processes(
    tmp_path: Path, processes: int
) -> None:
    """Through the HTTP (protobuf and gzip) and gRPC receivers, with and without workers."""
    body = _body(5)
    with live_server(tmp_path, server={"ingest_processes": processes}, assembler={"grace_s": 0.0}) as server:
        assert server.metric("ragmon_ingest_processes") == processes
        with server.client() as client:
            plain = client.post("/v1/traces", content=body, headers=PROTOBUF)
            zipped = client.post(
                "/v1/traces",
                content=gzip.compress(body),
                headers={**PROTOBUF, "content-encoding": "gzip"},
            )
            assert plain.status_code == zipped.status_code == 200
            bad = client.post("/v1/traces", content=b"\xff\xfe", headers=PROTOBUF)
            assert bad.status_code == 400
        grpc_request = ExportTraceServiceRequest.FromString(_body(6))
        grpc_request.resource_spans[0].scope_spans[0].spans[0].trace_id = (99).to_bytes(16, "big")
        with grpc.insecure_channel(server.grpc_target) as channel:
            export = channel.unary_unary(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                request_serializer=ExportTraceServiceRequest.SerializeToString,
                response_deserializer=ExportTraceServiceResponse.FromString,
            )
            answer = export(grpc_request, timeout=10)
        assert answer.partial_success.rejected_spans == 0
        server.flush()
        with server.client() as client:
            stored = client.get("/api/v1/traces/" + f"{1:032x}").json()
            listed = client.get("/api/v1/traces", params={"limit": 100}).json()
    assert stored["query"] == "how do I rotate the api key?" and stored["app"] == "pool-app"
    # 5 traces by HTTP (sent twice: stored once), 6 by gRPC of which trace 1's first span moved to trace 99
    assert server.metric("ragmon_spans_received_total", receiver="otlp_http") == 40
    assert server.metric("ragmon_spans_received_total", receiver="otlp_grpc") == 24
    assert server.metric("ragmon_ingest_rejected_total", reason="decode_error") == 1
    # trace 99 is that lone first span, an embedding call: not a user request, counted apart
    assert {t["trace_id"] for t in listed["items"]} == {f"{n:032x}" for n in (1, 2, 3, 4, 5, 6)}
    assert server.metric("ragmon_non_request_traces_total", app="pool-app", kind="embedding") == 1


@pytest.mark.parametrize(
    ("cpu_max", "cpus"), [("max 100000\n", None), ("100000 100000\n", 1), ("250000 100000\n", 3)]
)
def test_a_container_cpu_quota_caps_the_default_worker_count(
    tmp_path: Path, cpu_max: str, cpus: int | None
) -> None:
    quota_file = tmp_path / "cpu.max"
    quota_file.write_text(cpu_max)
    assert cgroup_cpus(quota_file) == cpus
    assert cgroup_cpus(tmp_path / "absent") is None


@pytest.mark.parametrize("processes", [0, 1])
async def test_with_redaction_on_decoders_return_redacted_spans_and_events_and_count_them(
    metrics: Metrics, processes: int
) -> None:
    """The decoder (a worker process, or a thread) gets the span redaction with each call: what it
    returns is redacted, and what it redacted is counted here (`account`)."""
    from service.config import RedactionConfig
    from service.ingest.span_redaction import SpanRedaction
    from tests.rag_spans import RagRequest

    request = ExportTraceServiceRequest.FromString(_body(2))
    for span in request.resource_spans[0].scope_spans[0].spans:
        for attribute in span.attributes:
            if attribute.key == "input.value":
                attribute.value.string_value = "rotate the key for ann@example.com?"
    genai = RagRequest(duration_s=2, genai=True, answer="Mail bob@example.com.")
    redaction = SpanRedaction(RedactionConfig(enabled=True), b"k" * 32)
    pool = IngestPool(processes, PRICES, metrics, redaction=redaction)
    await pool.start()
    try:
        decoded = await pool.decode(
            request.SerializeToString(), json_body=False, encoding="", tenant=TENANT, limit=LIMIT
        )
        pool.account(decoded)
        logs = await pool.decode_logs(
            genai.choice_body(), json_body=False, encoding="", tenant=TENANT, limit=LIMIT
        )
        pool.account(logs)
        built = await pool.build_traces(_groups(decoded.spans))
    finally:
        await pool.stop()
    assert all(type(s) is WireSpan for s in decoded.spans) and b"example.com" not in b"".join(
        s.raw  # type: ignore[union-attr]
        for s in decoded.spans
    )
    queries = {t.query if t else None for t in built}
    assert len(built) == 2 and len(queries) == 1  # one address, one mark
    assert re.fullmatch(r"rotate the key for \[REDACTED:email:[a-p]{16}\]\?", str(queries.pop()))
    [event] = logs.log_events
    assert "example.com" not in repr(event.attributes) and "[REDACTED:email:" in repr(event.attributes)
    # the root span of each of two traces held the address, and the log record one
    assert metrics.registry.get_sample_value("ragmon_redactions_total", {"kind": "email"}) == 3


def _with_bad_span(body: bytes) -> bytes:
    """`body` with one more span whose trace id is all zeros: screening rejects it."""
    request = ExportTraceServiceRequest.FromString(body)
    bad = request.resource_spans[0].scope_spans[0].spans.add()
    bad.CopyFrom(request.resource_spans[0].scope_spans[0].spans[0])
    bad.trace_id = bytes(16)
    return request.SerializeToString()


@pytest.mark.parametrize("processes", [1, 0])
@pytest.mark.parametrize("redacted", [False, True])
async def test_decoders_encode_the_records_the_server_would_publish(
    metrics: Metrics, processes: int, redacted: bool
) -> None:
    """Distributed mode: a decoder returns the spans-topic records (`max_record_bytes` set), byte for
    byte what the server made from the spans it returned before (`span_records.encode`), with the
    same answer: rejections, message, and the accepted count the message's total counts."""
    from service.config import RedactionConfig
    from service.ingest import span_records
    from service.ingest.span_redaction import SpanRedaction

    redaction = (
        SpanRedaction(RedactionConfig(enabled=True), b"pool-test-key-0123456789abcdef") if redacted else None
    )
    max_record_bytes = 64 * 1024
    spans_pool = IngestPool(processes, PRICES, metrics, redaction=redaction)
    records_pool = IngestPool(
        processes, PRICES, metrics, redaction=redaction, max_record_bytes=max_record_bytes
    )
    await spans_pool.start()
    await records_pool.start()
    try:
        for body, json_body in ((_with_bad_span(_body(40)), False), (_otlp_json_body(), True)):
            kwargs: dict[str, Any] = {
                "json_body": json_body,
                "encoding": "",
                "tenant": TENANT,
                "limit": LIMIT,
            }
            as_spans = await spans_pool.decode(body, **kwargs)
            as_records = await records_pool.decode(body, **kwargs)
            expected = span_records.encode(as_spans.spans, max_record_bytes)
            assert isinstance(as_records, span_records.RecordBatch) and as_records.spans == []
            if json_body and processes:
                # decoded spans that came packed each unpack with a resource of their own, which the
                # server framed apart; the decoder frames spans sharing theirs once: same spans
                assert [
                    (r.key, r.headers, span_records.decode(r.value, r.headers)) for r in as_records.records
                ] == [(r.key, r.headers, span_records.decode(r.value, r.headers)) for r in expected]
                assert sum(len(r.value) for r in as_records.records) < sum(len(r.value) for r in expected)
            else:
                assert as_records.records == expected
            assert as_records.accepted == as_records.record_spans == len(as_spans.spans) > 0
            assert len(as_records.records) == len({s.trace_id for s in as_spans.spans})
            assert (as_records.rejected_spans, as_records.rejections, as_records.redactions) == (
                as_spans.rejected_spans,
                as_spans.rejections,
                as_spans.redactions,
            )
            assert as_records.error_message == as_spans.error_message
        assert as_spans.rejected_spans == 0 and as_records.error_message == ""  # the JSON body
    finally:
        await spans_pool.stop()
        await records_pool.stop()


async def test_the_rejected_count_is_of_all_spans_when_records_are_encoded(metrics: Metrics) -> None:
    pool = IngestPool(0, PRICES, metrics, max_record_bytes=1 << 20)
    decoded = await pool.decode(
        _with_bad_span(_body(3)), json_body=False, encoding="", tenant=TENANT, limit=LIMIT
    )
    from service.ingest.span_records import RecordBatch

    assert isinstance(decoded, RecordBatch) and len(decoded.records) == 3 and decoded.record_spans == 12
    assert decoded.error_message.startswith("rejected 1 of 13 spans (invalid_trace_id=1)")
