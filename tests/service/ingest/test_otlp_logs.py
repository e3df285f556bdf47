"""Tests of service/ingest/otlp_logs.py and the logs and metrics receivers: GenAI events sent as OTLP log
records (as the OTel GenAI instrumentations send message content) join their spans, whichever arrives
first; other records and app metrics are answered, counted and not stored; bad input is refused."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator

import grpc
import httpx
import pytest
from google.protobuf import json_format
from opentelemetry._logs import LogRecord
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue, KeyValueList
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord as PbLogRecord
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanContext, TraceFlags

from service.conventions.spans import LogEvent, Span
from service.errors import DecodeError
from service.ingest import otlp_logs, span_records
from service.ingest.otlp_metrics import check_metrics_body
from service.ingest.span_size import MAX_SPAN_BYTES, truncation_note
from tests.live_server import LiveServer, live_server

TRACE = "5b8efff798038103d269b633813fc60c"
SPAN = "eee19b7ec3c1b174"
PROTOBUF = {"content-type": "application/x-protobuf"}
QUESTION = "How do I reset my password?"
ANSWER = "Open Settings, then Security, then Reset password."


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # a grace long enough for the "after" case: its events are sent after the spans
    with live_server(tmp_path_factory.mktemp("ragmon"), assembler={"grace_s": 1.0}) as live:
        yield live


def _kv(key: str, value: AnyValue) -> KeyValue:
    return KeyValue(key=key, value=value)


def _text(value: str) -> AnyValue:
    return AnyValue(string_value=value)


def _record(
    name: str,
    body: AnyValue | None,
    *,
    trace_id: str = TRACE,
    span_id: str = SPAN,
    use_attribute: bool = False,
) -> PbLogRecord:
    record = PbLogRecord(
        time_unix_nano=1_700_000_000_000_000_000,
        trace_id=bytes.fromhex(trace_id) if trace_id else b"",
        span_id=bytes.fromhex(span_id) if span_id else b"",
        attributes=[_kv("gen_ai.system", _text("openai"))],
    )
    if use_attribute:
        record.attributes.append(_kv("event.name", _text(name)))
    else:
        record.event_name = name
    if body is not None:
        record.body.CopyFrom(body)
    return record


def _request(*records: PbLogRecord) -> ExportLogsServiceRequest:
    request = ExportLogsServiceRequest()
    resource_logs = request.resource_logs.add()
    resource_logs.resource.attributes.append(_kv("service.name", _text("helpdesk")))
    resource_logs.scope_logs.add().log_records.extend(records)
    return request


def _choice(text: str) -> AnyValue:
    message = KeyValueList(values=[_kv("role", _text("assistant")), _kv("content", _text(text))])
    return AnyValue(
        kvlist_value=KeyValueList(
            values=[_kv("index", AnyValue(int_value=0)), _kv("message", AnyValue(kvlist_value=message))]
        )
    )


def _user(text: str) -> AnyValue:
    return AnyValue(kvlist_value=KeyValueList(values=[_kv("content", _text(text))]))


# ---------------------------------------------------------------- decoding


def test_genai_events_are_kept_with_their_body_and_other_records_ignored() -> None:
    app_log = PbLogRecord(body=_text("GET /health 200"), trace_id=bytes.fromhex(TRACE))
    request = _request(
        _record("gen_ai.user.message", _user(QUESTION)), _record("gen_ai.choice", _choice(ANSWER)), app_log
    )
    decoded = otlp_logs.decode_protobuf(request.SerializeToString(), "t1")
    assert decoded.ignored == 1 and decoded.rejected_spans == 0 and decoded.error_message == ""
    user, choice = decoded.log_events
    assert (user.trace_id, user.span_id, user.name, user.tenant) == (TRACE, SPAN, "gen_ai.user.message", "t1")
    assert user.attributes == {"gen_ai.system": "openai", "content": QUESTION}
    assert choice.attributes["message"] == {"role": "assistant", "content": ANSWER}
    assert user.resource == {"service.name": "helpdesk"} and user.size_bytes > 0


def test_the_event_name_attribute_of_older_sdks_is_read() -> None:
    decoded = otlp_logs.decode_protobuf(
        _request(_record("gen_ai.user.message", _user(QUESTION), use_attribute=True)).SerializeToString(), "t"
    )
    assert [e.name for e in decoded.log_events] == ["gen_ai.user.message"]


def test_json_body_decodes_like_protobuf() -> None:
    request = _request(
        _record("gen_ai.user.message", _user(QUESTION)), _record("gen_ai.choice", _choice(ANSWER))
    )
    as_json = json_format.MessageToDict(request)
    # OTLP/JSON writes ids as hex, where protobuf's JSON mapping writes base64
    for record in as_json["resourceLogs"][0]["scopeLogs"][0]["logRecords"]:
        record["traceId"], record["spanId"] = TRACE, SPAN
    from_json = otlp_logs.decode_json(json.dumps(as_json).encode(), "t")
    from_pb = otlp_logs.decode_protobuf(request.SerializeToString(), "t")
    assert from_json.log_events == from_pb.log_events


def test_an_event_that_cannot_be_joined_is_rejected_alone() -> None:
    request = _request(
        _record("gen_ai.user.message", _user(QUESTION), trace_id=""),
        _record("gen_ai.choice", _choice(ANSWER), span_id="0000000000000000"),
        _record("gen_ai.choice", _choice(ANSWER)),
    )
    decoded = otlp_logs.decode_protobuf(request.SerializeToString(), "t")
    assert len(decoded.log_events) == 1
    assert decoded.rejected_spans == 2
    assert decoded.rejections == {"invalid_trace_id": 1, "invalid_span_id": 1}
    assert decoded.error_message.startswith("rejected 2 of 3 log records")


def test_an_event_over_the_span_size_limit_is_truncated_where_its_text_is_nested() -> None:
    """A 10 MB answer in a `gen_ai.choice` sits in the body's `message.content`: that is what is cut,
    so the event fits a spans-topic record and keeps its role and index."""
    answer = "a" * 10 * 2**20
    request = _request(
        _record("gen_ai.user.message", _user(QUESTION)), _record("gen_ai.choice", _choice(answer))
    )
    decoded = otlp_logs.decode_protobuf(request.SerializeToString(), "t")
    assert decoded.rejected_spans == 0 and decoded.truncated == 1
    assert "truncated 1 oversize attribute value" in decoded.error_message
    user, choice = decoded.log_events
    assert user.attributes["content"] == QUESTION
    message = choice.attributes["message"]
    assert isinstance(message, dict) and message["role"] == "assistant"
    assert isinstance(message["content"], str) and message["content"].endswith(truncation_note(len(answer)))
    assert choice.attributes["ragmon.truncated"] == ["message.content"]
    records = span_records.encode(decoded.log_events, 1_000_000)
    assert all(len(record.value) <= MAX_SPAN_BYTES + 1024 for record in records)


@pytest.mark.parametrize(
    ("body", "json_body", "message"),
    [
        (b"\x0a\xff\xff\xff", False, "not a valid OTLP ExportLogsServiceRequest"),
        (b"{not json", True, "not valid JSON"),
        (b"\xff\xfe", True, "not valid UTF-8"),
        (b'{"resourceLogs": {}}', True, "must be a JSON array"),
    ],
)
def test_unreadable_bodies_raise_decode_error(body: bytes, json_body: bool, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        otlp_logs.decode_logs_body(body, json_body=json_body, encoding="", tenant="t", limit=1 << 20)


def test_metrics_bodies_are_checked_not_kept() -> None:
    check_metrics_body(b"", json_body=False, encoding="", limit=100)  # an empty request is a valid one
    check_metrics_body(b'{"resourceMetrics": []}', json_body=True, encoding="", limit=100)
    with pytest.raises(DecodeError, match="ExportMetricsServiceRequest"):
        check_metrics_body(b"\x0a\xff\xff", json_body=False, encoding="", limit=100)
    with pytest.raises(DecodeError, match="gzip"):
        check_metrics_body(b"not gzip", json_body=False, encoding="gzip", limit=100)


# ---------------------------------------------------------------- joined when the trace is built


def _llm_span(span_id: str = SPAN, parent: str | None = None) -> Span:
    return Span(
        trace_id=TRACE,
        span_id=span_id,
        parent_span_id=parent,
        name="chat gpt-4o-mini",
        start_ns=1_700_000_000_000_000_000,
        end_ns=1_700_000_000_500_000_000,
        attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o-mini"},
        resource={"service.name": "helpdesk"},
    )


def _events(span_id: str = SPAN) -> list[LogEvent]:
    request = _request(
        _record("gen_ai.user.message", _user(QUESTION), span_id=span_id),
        _record("gen_ai.choice", _choice(ANSWER), span_id=span_id),
    )
    return otlp_logs.decode_protobuf(request.SerializeToString(), "default").log_events


def test_events_give_the_trace_its_question_and_answer_in_any_order() -> None:
    from service.conventions.pricing import PriceTable
    from service.conventions.semconv import build_trace

    prices = PriceTable.default()
    span = _llm_span()
    events = _events()
    without = build_trace([span], partial=False, prices=prices)
    assert (without.query, without.answer) == (None, None)
    for order in ([span, *events], [*events, span], [events[1], span, events[0]], [span, *events, *events]):
        trace = build_trace(order, partial=False, prices=prices)
        assert (trace.query, trace.answer, trace.span_count) == (QUESTION, ANSWER, 1)
    assert span.events == []  # the buffered span is not changed: a second build gives the same trace


def test_events_whose_span_never_came_keep_their_content() -> None:
    from service.conventions.pricing import PriceTable
    from service.conventions.semconv import build_trace

    trace = build_trace(_events("aaaaaaaaaaaaaaaa"), partial=True, prices=PriceTable.default())
    assert (trace.query, trace.answer) == (QUESTION, ANSWER)


def test_the_newer_single_details_event_is_read() -> None:
    from service.conventions.pricing import PriceTable
    from service.conventions.semconv import build_trace

    def message(role: str, text: str) -> AnyValue:
        part = KeyValueList(values=[_kv("type", _text("text")), _kv("content", _text(text))])
        parts = AnyValue(array_value={"values": [AnyValue(kvlist_value=part)]})
        return AnyValue(kvlist_value=KeyValueList(values=[_kv("role", _text(role)), _kv("parts", parts)]))

    record = _record("gen_ai.client.inference.operation.details", None)
    record.attributes.append(
        _kv("gen_ai.input.messages", AnyValue(array_value={"values": [message("user", QUESTION)]}))
    )
    record.attributes.append(
        _kv("gen_ai.output.messages", AnyValue(array_value={"values": [message("assistant", ANSWER)]}))
    )
    events = otlp_logs.decode_protobuf(_request(record).SerializeToString(), "default").log_events
    trace = build_trace([_llm_span(), *events], partial=False, prices=PriceTable.default())
    assert (trace.query, trace.answer) == (QUESTION, ANSWER)


# ---------------------------------------------------------------- through a real server


def _emit_events(logs: LoggerProvider, trace_id: int, span_id: int, question: str, answer: str) -> None:
    logger = logs.get_logger("opentelemetry.instrumentation.openai_v2")
    context = SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(1))
    for name, body in (
        ("gen_ai.user.message", {"content": question}),
        (
            "gen_ai.choice",
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": answer}},
        ),
    ):
        logger.emit(
            LogRecord(
                timestamp=time.time_ns(),
                trace_id=context.trace_id,
                span_id=context.span_id,
                trace_flags=context.trace_flags,
                body=body,
                attributes={"gen_ai.system": "openai"},
                event_name=name,
            )
        )


def _chat_call(tracer_provider: TracerProvider) -> tuple[int, int]:
    tracer = tracer_provider.get_tracer("opentelemetry.instrumentation.openai_v2")
    with tracer.start_as_current_span("chat gpt-4o-mini") as span:
        span.set_attribute("gen_ai.operation.name", "chat")
        span.set_attribute("gen_ai.request.model", "gpt-4o-mini")
        span.set_attribute("gen_ai.usage.input_tokens", 40)
        span.set_attribute("gen_ai.usage.output_tokens", 12)
        context = span.get_span_context()
    return context.trace_id, context.span_id


def _stored(server: LiveServer, trace_id: int) -> dict:
    with server.client() as client:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            server.flush()
            response = client.get(f"/api/v1/traces/{trace_id:032x}")
            if response.status_code == 200:
                return response.json()  # type: ignore[no-any-return]
            time.sleep(0.1)
    raise AssertionError(f"trace {trace_id:032x} was not stored")


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_real_exporters_events_join_their_span(server: LiveServer, transport: str, when: str) -> None:
    app = f"events-{transport}-{when}"
    resource = Resource.create({"service.name": app})
    if transport == "http":
        span_exporter, log_exporter = (
            OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", timeout=10),
            OTLPLogExporter(endpoint=f"{server.url}/v1/logs", timeout=10),
        )
    else:
        span_exporter, log_exporter = (
            GrpcSpanExporter(endpoint=server.grpc_target, insecure=True, timeout=10),
            GrpcLogExporter(endpoint=server.grpc_target, insecure=True, timeout=10),
        )
    events_before = server.metric("ragmon_log_events_received_total", receiver=f"otlp_{transport}")
    # spans held back until the events went out ("before"), or sent first ("after")
    tracer_provider = TracerProvider(resource=resource)
    logs = LoggerProvider(resource=resource)
    logs.add_log_record_processor(SimpleLogRecordProcessor(log_exporter))
    if when == "after":
        tracer_provider.add_span_processor(SimpleSpanProcessor(span_exporter))
        trace_id, span_id = _chat_call(tracer_provider)
        _emit_events(logs, trace_id, span_id, QUESTION, ANSWER)
    else:
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        held = InMemorySpanExporter()
        tracer_provider.add_span_processor(SimpleSpanProcessor(held))
        trace_id, span_id = _chat_call(tracer_provider)
        _emit_events(logs, trace_id, span_id, QUESTION, ANSWER)
        assert span_exporter.export(held.get_finished_spans()).name == "SUCCESS"
    logs.shutdown()
    tracer_provider.shutdown()
    record = _stored(server, trace_id)
    assert (record["query"], record["answer"], record["app"]) == (QUESTION, ANSWER, app)
    assert (
        server.metric("ragmon_log_events_received_total", receiver=f"otlp_{transport}") == events_before + 2
    )


def test_http_logs_answer_partial_success_in_the_callers_encoding(server: LiveServer) -> None:
    request = _request(
        _record("gen_ai.user.message", _user(QUESTION), trace_id=""), PbLogRecord(body=_text("app log line"))
    )
    ignored = server.metric("ragmon_ignored_log_records_total", receiver="otlp_http")
    rejected = server.metric("ragmon_ingest_rejected_total", reason="invalid_trace_id")
    with server.client() as client:
        answer = client.post(
            "/v1/logs",
            content=gzip.compress(request.SerializeToString()),
            headers={**PROTOBUF, "content-encoding": "gzip"},
        )
        as_json = json_format.MessageToDict(request)
        json_answer = client.post("/v1/logs", json=as_json)
    assert answer.status_code == 200
    parsed = ExportLogsServiceResponse.FromString(answer.content)
    assert parsed.partial_success.rejected_log_records == 1
    assert "invalid_trace_id" in parsed.partial_success.error_message
    assert json_answer.status_code == 200
    assert json_answer.json()["partialSuccess"]["rejectedLogRecords"] == "1"
    assert server.metric("ragmon_ignored_log_records_total", receiver="otlp_http") == ignored + 2
    assert server.metric("ragmon_ingest_rejected_total", reason="invalid_trace_id") == rejected + 2


@pytest.mark.parametrize("path", ["/v1/logs", "/v1/metrics"])
def test_bad_bodies_get_a_clear_otlp_error_and_are_counted(server: LiveServer, path: str) -> None:
    before = server.metric("ragmon_ingest_rejected_total", reason="decode_error")
    with server.client() as client:
        garbage = client.post(path, content=b"\x0a\xff\xff\xff", headers=PROTOBUF)
        bad_gzip = client.post(path, content=b"plain", headers={**PROTOBUF, "content-encoding": "gzip"})
        wrong_type = client.post(path, content=b"x", headers={"content-type": "text/plain"})
    assert garbage.status_code == 400 and bad_gzip.status_code == 400
    assert wrong_type.status_code == 415
    assert b"gzip" in bad_gzip.content
    assert server.metric("ragmon_ingest_rejected_total", reason="decode_error") == before + 2


def test_app_metrics_are_answered_and_counted_over_both_transports(server: LiveServer) -> None:
    http_before = server.metric("ragmon_ignored_metrics_requests_total", receiver="otlp_http")
    grpc_before = server.metric("ragmon_ignored_metrics_requests_total", receiver="otlp_grpc")
    for exporter in (
        OTLPMetricExporter(endpoint=f"{server.url}/v1/metrics", timeout=10),
        GrpcMetricExporter(endpoint=server.grpc_target, insecure=True, timeout=10),
    ):
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=60_000)
        meters = MeterProvider(metric_readers=[reader], resource=Resource.create({"service.name": "m"}))
        meters.get_meter("app").create_histogram("gen_ai.client.token.usage").record(12)
        meters.shutdown()  # one export: the final collection
    assert server.metric("ragmon_ignored_metrics_requests_total", receiver="otlp_http") == http_before + 1
    assert server.metric("ragmon_ignored_metrics_requests_total", receiver="otlp_grpc") == grpc_before + 1


def test_grpc_logs_need_a_key_like_traces(tmp_path_factory: pytest.TempPathFactory) -> None:
    keys = {"sk-good": "acme"}
    with live_server(tmp_path_factory.mktemp("keys"), auth={"api_keys": keys}) as live:
        channel = grpc.insecure_channel(live.grpc_target)
        export = channel.unary_unary(
            "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
            request_serializer=ExportLogsServiceRequest.SerializeToString,
            response_deserializer=ExportLogsServiceResponse.FromString,
        )
        request = _request(_record("gen_ai.user.message", _user(QUESTION)))
        with pytest.raises(grpc.RpcError) as refused:
            export(request, timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        answer = export(request, metadata=[("authorization", "Bearer sk-good")], timeout=10)
        assert answer.partial_success.rejected_log_records == 0
        channel.close()
        with httpx.Client(base_url=live.url) as client:
            assert (
                client.post("/v1/logs", content=request.SerializeToString(), headers=PROTOBUF).status_code
                == 401
            )
