"""End to end through a real server: one out-of-range record or span never costs another.

Before the range checks, a JSON-API record with 10**30 input tokens was answered 200, failed the
whole bus batch at insert, and took every other record of that batch (of any tenant) with it; an
OTLP/JSON span starting at 1e30 ns, or carrying a 5,000-digit list index in a key, lost its whole
trace in the builder after the 200.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from service.ingest.otlp import MAX_IDENTIFIER_CHARS, MAX_TEXT_CHARS, MAX_VECTOR_LENGTH
from tests.live_server import LiveServer, live_server

JSON = {"content-type": "application/json"}
PROTOBUF = {"content-type": "application/x-protobuf"}
REJECTED = "ragmon_ingest_rejected_total"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("ragmon"), assembler={"grace_s": 0.05}) as live:
        yield live


def _record(n: int, app: str, **fields: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "trace_id": f"{n:032x}",
        "app": app,
        "query": f"question {n}",
        "answer": "an answer",
        "usage": [{"model": "gpt-4o-mini", "input_tokens": 100, "output_tokens": 10}],
    }
    record.update(fields)
    return record


def _poison(n: int, app: str) -> dict[str, Any]:
    return _record(n, app, usage=[{"model": "gpt-4o-mini", "input_tokens": 10**30}])


def _failures(live: LiveServer) -> float:
    return live.metric("ragmon_sink_failures_total", sink="traces", kind="permanent")


def _rejected(live: LiveServer, *reasons: str) -> float:
    return sum(live.metric(REJECTED, reason=reason) for reason in reasons)


# The receiver counts a record it rejects as `invalid_input`, or under `wire.rejection_reason`
# once it uses it; either way exactly once.
RECORD_REASONS = (
    "invalid_input",
    "out_of_range",
    "string_too_long",
    "vector_too_long",
    "invalid_time",
    "too_large",
)


def test_json_api_50_good_and_one_with_1e30_input_tokens(server: LiveServer) -> None:
    app = "range-a"
    records = [_record(0xA000 + i, app) for i in range(50)]
    records.insert(25, _poison(0xA0FF, app))
    rejected_before, failures_before = _rejected(server, *RECORD_REASONS), _failures(server)
    with server.client() as client:
        response = client.post("/api/v1/traces", content=json.dumps({"traces": records}), headers=JSON)
    assert response.status_code == 200, response.text
    out = response.json()
    assert out["accepted"] == 50
    assert out["rejected"] == [
        {"index": 25, "error": "usage.0.input_tokens: Input should be less than or equal to 1000000000000"}
    ]
    server.flush()
    assert server.pipeline.store.count_traces("default", app=app) == 50
    assert server.pipeline.store.get_trace("default", f"{0xA0FF:032x}") is None
    assert _rejected(server, *RECORD_REASONS) == rejected_before + 1
    assert _failures(server) == failures_before  # nothing reached the store that it refused
    assert server.metric("ragmon_traces_total", app=app) == 50


def test_another_tenants_traces_survive_out_of_range_records(tmp_path: Path) -> None:
    """The measured case: 200 traces of one tenant while 5 poison records of another arrive
    (140 of the 200 were lost)."""
    keys = {"key-acme": "acme", "key-globex": "globex"}
    with live_server(tmp_path, auth={"api_keys": keys}, assembler={"grace_s": 0.05}) as live:
        answers: list[int] = []

        def send(key: str, batches: list[list[dict[str, Any]]]) -> None:
            with live.client(headers={"x-api-key": key, **JSON}) as client:
                for batch in batches:
                    answers.append(
                        client.post("/api/v1/traces", content=json.dumps({"traces": batch})).status_code
                    )

        globex = [[_record(0xB000 + 40 * b + i, "globex-app") for i in range(40)] for b in range(5)]
        acme = [[_record(0xC000 + b, "acme-app"), _poison(0xC100 + b, "acme-app")] for b in range(5)]
        threads = [
            threading.Thread(target=send, args=args) for args in (("key-globex", globex), ("key-acme", acme))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        live.flush()
        assert answers == [200] * 10
        assert live.pipeline.store.count_traces("globex") == 200
        assert live.pipeline.store.count_traces("acme") == 5
        assert _rejected(live, *RECORD_REASONS) == 5
        assert _failures(live) == 0


def _span(
    trace_id: str, span_id: str, parent: str | None, attributes: list[dict[str, Any]], **fields: Any
) -> dict[str, Any]:
    span: dict[str, Any] = {
        "traceId": trace_id,
        "spanId": span_id,
        "name": "step",
        "startTimeUnixNano": "1764400000000000000",
        "endTimeUnixNano": "1764400000500000000",
        "attributes": attributes,
    }
    if parent:
        span["parentSpanId"] = parent
    span.update(fields)
    return span


def _otlp(*spans: dict[str, Any]) -> dict[str, Any]:
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "range-otlp"}}]}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": list(spans)}]}]}


def _text(key: str, value: str) -> dict[str, Any]:
    return {"key": key, "value": {"stringValue": value}}


def test_otlp_json_start_1e30_and_a_5000_digit_index_among_good_spans(server: LiveServer) -> None:
    good, late = "6b8efff798038103d269b633813fc60c", "6b8efff798038103d269b633813fc60d"
    root = _span(
        good,
        "fee19b7ec3c1b174",
        None,
        [_text("openinference.span.kind", "CHAIN"), _text("input.value", "range q")],
    )
    retriever = _span(
        good,
        "fee19b7ec3c1b175",
        "fee19b7ec3c1b174",
        [
            _text("openinference.span.kind", "RETRIEVER"),
            _text("retrieval.documents.0.document.id", "doc-0"),
            _text(f"retrieval.documents.{'9' * 5000}.document.id", "doc-huge"),
        ],
    )
    # a JSON number, as a hand-written exporter sends it; the span is a trace of its own
    far = _span(
        late,
        "fee19b7ec3c1b176",
        None,
        [_text("input.value", "late q")],
        startTimeUnixNano=1e30,
        endTimeUnixNano=1e30,
    )
    reasons = ("invalid_time", "invalid_attribute_index")
    before = {reason: server.metric(REJECTED, reason=reason) for reason in reasons}
    failures_before = server.metric("ragmon_assembly_failures_total")
    with server.client() as client:
        response = client.post("/v1/traces", json=_otlp(root, retriever, far))
    assert response.status_code == 200, response.text
    partial = response.json()["partialSuccess"]
    assert int(partial["rejectedSpans"]) == 1
    message = partial["errorMessage"]
    assert "rejected 1 of 3 spans (invalid_time=1)" in message
    assert "dropped 1 invalid attribute value (invalid_attribute_index=1)" in message
    server.flush()
    record = server.pipeline.store.get_trace("default", good)
    assert record is not None and record["span_count"] == 2 and record["chunk_ids"] == ["doc-0"]
    assert server.pipeline.store.get_trace("default", late) is None
    assert {reason: server.metric(REJECTED, reason=reason) - before[reason] for reason in reasons} == {
        "invalid_time": 1,
        "invalid_attribute_index": 1,
    }
    assert server.metric("ragmon_assembly_failures_total") == failures_before


def test_otlp_protobuf_index_is_dropped_in_the_builder_and_counted(server: LiveServer) -> None:
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    span = spans.add(
        trace_id=bytes.fromhex("7b8efff798038103d269b633813fc60c"),
        span_id=bytes.fromhex("fee19b7ec3c1b177"),
        name="retrieve",
        start_time_unix_nano=1_764_400_000_000_000_000,
        end_time_unix_nano=1_764_400_000_500_000_000,
    )
    for key, value in (
        ("openinference.span.kind", "RETRIEVER"),
        ("input.value", "pb range q"),
        (f"retrieval.documents.{'9' * 5000}.document.id", "doc-huge"),
        ("retrieval.documents.0.document.id", "doc-0"),
    ):
        kv = span.attributes.add()
        kv.key, kv.value.string_value = key, value
    before = server.metric(REJECTED, reason="invalid_attribute_index")
    with server.client() as client:
        response = client.post("/v1/traces", content=request.SerializeToString(), headers=PROTOBUF)
    assert response.status_code == 200
    server.flush()
    record = server.pipeline.store.get_trace("default", "7b8efff798038103d269b633813fc60c")
    assert record is not None and record["chunk_ids"] == ["doc-0"]
    assert server.metric(REJECTED, reason="invalid_attribute_index") == before + 1


def test_json_api_huge_strings_and_vectors_are_rejected_with_clear_errors(server: LiveServer) -> None:
    app = "range-d"
    records = [
        _record(0xD000, app),
        _record(0xD001, app, query="q" * (MAX_TEXT_CHARS + 1)),
        _record(0xD002, app, query_embedding={"model": "e", "vector": [0.5] * (MAX_VECTOR_LENGTH + 1)}),
        _record(0xD003, app, session_id="s" * (MAX_IDENTIFIER_CHARS + 1)),
        _record(0xD004, app, retrieval={"chunks": [{"id": "c", "content": "x" * (MAX_TEXT_CHARS + 1)}]}),
        _record(0xD005, app, start_time="2300-01-01T00:00:00Z"),
        _record(0xD006, app, timings={"total_s": 1e300}),
        _record(0xD007, app, usage=[{"model": "m", "cost_usd": 1e9}]),
        _record(0xD008, app, query="q" * 500_000, query_embedding={"vector": [0.5] * MAX_VECTOR_LENGTH}),
        # each field within its limit, the whole over what one trace may weigh (`span_size.MAX_SPAN_BYTES`)
        _record(0xD009, app, query="q" * MAX_TEXT_CHARS),
    ]
    before = _rejected(server, *RECORD_REASONS)
    with server.client() as client:
        response = client.post("/api/v1/traces", content=json.dumps({"traces": records}), headers=JSON)
    assert response.status_code == 200, response.text
    out = response.json()
    assert out["accepted"] == 2
    errors = {r["index"]: r["error"] for r in out["rejected"]}
    assert errors == {
        1: "query: String should have at most 1048576 characters",
        2: "query_embedding.vector: List should have at most 65536 items after validation, not 65537",
        3: "session_id: String should have at most 512 characters",
        4: "retrieval.chunks.0.content: String should have at most 1048576 characters",
        5: "start_time: time 2300-01-01 00:00:00+00:00 is outside the range ragmon keeps, "
        "1970-01-01T00:00:00+00:00 to 2262-04-11T23:47:16.854775+00:00",
        6: "timings.total_s: Input should be less than or equal to 9223372036.854776",
        7: "usage.0.cost_usd: Input should be less than or equal to 1000000",
        9: errors[9],  # its size depends on the time of arrival's digits
    }
    assert re.fullmatch(
        r"the trace is 1,04\d,\d\d\d bytes stored, over the 900,000-byte limit of one trace: send its "
        r"longest texts \(chunk contents, answer\) shorter",
        errors[9],
    )
    assert _rejected(server, *RECORD_REASONS) == before + 8
    server.flush()
    assert server.pipeline.store.count_traces("default", app=app) == 2


def test_otlp_grpc_answers_the_out_of_range_fields_and_counts_them_once(server: LiveServer) -> None:
    """gRPC answers OK with `partial_success` naming the fields dropped at screening; after the trace is
    built the count has not moved (the builder found nothing left to drop)."""
    import grpc
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    span = spans.add(
        trace_id=bytes.fromhex("7b8efff798038103d269b633813fc60d"),
        span_id=bytes.fromhex("fee19b7ec3c1b178"),
        name="llm",
        start_time_unix_nano=1_764_400_000_000_000_000,
        end_time_unix_nano=1_764_400_000_500_000_000,
    )
    span.attributes.add(key="openinference.span.kind").value.string_value = "LLM"
    span.attributes.add(key="llm.token_count.prompt").value.double_value = 1e30
    span.attributes.add(key="llm.token_count.completion").value.int_value = -3
    span.attributes.add(key="output.value").value.string_value = "grpc answer"
    before = server.metric(REJECTED, reason="out_of_range")
    with grpc.insecure_channel(server.grpc_target) as channel:
        export = channel.unary_unary(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            request_serializer=ExportTraceServiceRequest.SerializeToString,
            response_deserializer=ExportTraceServiceResponse.FromString,
        )
        answer = export(request, timeout=30)
    assert answer.partial_success.rejected_spans == 0
    message = answer.partial_success.error_message
    assert message.startswith("dropped 2 invalid attribute values (out_of_range=2)")
    assert "llm.token_count.prompt" in message and "llm.token_count.completion" in message
    server.flush()
    record = server.pipeline.store.get_trace("default", "7b8efff798038103d269b633813fc60d")
    assert record is not None and record["answer"] == "grpc answer"
    assert server.metric(REJECTED, reason="out_of_range") == before + 2
