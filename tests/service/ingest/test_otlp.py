"""Tests of the rules of `service/ingest/otlp.py` through both decoders (`otlp_protobuf.py`, `otlp_json.py`):
real exporter output, OTLP/JSON as the spec says, every bad input; protobuf's own readers are tested in
test_otlp_protobuf.py."""

from __future__ import annotations

import base64
import copy
import json
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import format_span_id, format_trace_id

from service.conventions.spans import WireSpan
from service.errors import DecodeError
from service.ingest.otlp import DecodedBatch, RejectReason
from service.ingest.otlp_json import decode_json
from service.ingest.otlp_protobuf import decode_protobuf, decode_request, screen_protobuf, span_from_wire

VECTOR_KEY = "embedding.embeddings.0.embedding.vector"
TENANT = "acme"


# ---------------------------------------------------------------- real SDK spans


@pytest.fixture
def sdk() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "qa-bot", "service.version": "2.1.0"})
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _rag_spans(provider: TracerProvider, vector: Sequence[float] = (0.1, 0.2, 0.3)) -> None:
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("rag") as root:
        root.set_attribute("openinference.span.kind", "CHAIN")
        root.set_attribute("input.value", "what is the refund window?")
        root.set_attribute("tag.tags", ["beta", "regenerate"])
        root.set_attribute("ragmon.regeneration", True)
        with tracer.start_as_current_span("embed") as span:
            span.set_attribute("openinference.span.kind", "EMBEDDING")
            span.set_attribute("embedding.model_name", "text-embedding-3-small")
            span.set_attribute(VECTOR_KEY, list(vector))
            span.set_attribute("llm.token_count.total", 7)
        with tracer.start_as_current_span("retrieve") as span:
            span.set_attribute("openinference.span.kind", "RETRIEVER")
            span.set_attribute("retrieval.documents.0.document.id", "doc-1")
            span.set_attribute("retrieval.documents.0.document.score", 0.91)
            span.add_event("cache miss", {"shard": 3})


def _body(spans: Sequence[ReadableSpan]) -> bytes:
    body: bytes = encode_spans(spans).SerializeToString()
    return body


def _to_spec_json(request: ExportTraceServiceRequest) -> dict[str, Any]:
    """Protobuf JSON mapping turned into OTLP/JSON: ids as hex instead of base64, enums as integers."""
    document: dict[str, Any] = json_format.MessageToDict(request, use_integers_for_enums=True)
    for resource_spans in document.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return document


def test_real_exporter_output_decodes_exactly(sdk: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = sdk
    _rag_spans(provider)
    finished = exporter.get_finished_spans()
    batch = decode_protobuf(_body(finished), TENANT)

    assert batch.rejected_spans == 0 and batch.rejections == {} and batch.error_message == ""
    assert len(batch.spans) == 3
    by_name = {s.name: s for s in batch.spans}
    for sdk_span in finished:
        span = by_name[sdk_span.name]
        context = sdk_span.get_span_context()
        assert context is not None
        assert span.trace_id == format_trace_id(context.trace_id)
        assert span.span_id == format_span_id(context.span_id)
        assert span.parent_span_id == (format_span_id(sdk_span.parent.span_id) if sdk_span.parent else None)
        assert (span.start_ns, span.end_ns) == (sdk_span.start_time, sdk_span.end_time)
        assert span.tenant == TENANT
        expected = {k: list(v) if isinstance(v, tuple) else v for k, v in (sdk_span.attributes or {}).items()}
        assert span.attributes == expected
    assert by_name["rag"].is_root
    assert by_name["rag"].attributes["ragmon.regeneration"] is True
    assert by_name["embed"].attributes["llm.token_count.total"] == 7
    assert by_name["retrieve"].events[0].name == "cache miss"
    assert by_name["retrieve"].events[0].attributes == {"shard": 3}
    assert by_name["rag"].resource["service.name"] == "qa-bot"
    assert by_name["rag"].resource["service.version"] == "2.1.0"
    # one dict per resource, shared by its spans
    assert by_name["rag"].resource is by_name["embed"].resource is by_name["retrieve"].resource


def test_parsed_request_and_body_decode_the_same(sdk: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = sdk
    _rag_spans(provider)
    request = encode_spans(exporter.get_finished_spans())
    from_body = decode_protobuf(request.SerializeToString(), TENANT)
    from_message = decode_request(request, TENANT)
    assert from_body.spans == from_message.spans


def test_spec_json_decodes_like_protobuf(sdk: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = sdk
    _rag_spans(provider)
    request = encode_spans(exporter.get_finished_spans())
    document = _to_spec_json(request)
    span_json = document["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert isinstance(span_json["startTimeUnixNano"], str), "the JSON mapping sends int64 as strings"
    from_json = decode_json(json.dumps(document).encode(), TENANT)
    from_protobuf = decode_protobuf(request.SerializeToString(), TENANT)
    assert from_json.rejections == {}
    assert from_json.spans == from_protobuf.spans


def test_base64_ids_are_rejected_in_json(sdk: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = sdk
    _rag_spans(provider)
    # What protobuf's own JSON printer writes: base64 ids, which OTLP/JSON forbids.
    document = json_format.MessageToDict(encode_spans(exporter.get_finished_spans()))
    batch = decode_json(json.dumps(document).encode(), TENANT)
    assert batch.spans == []
    assert batch.rejections == {"invalid_trace_id": 3}
    assert "32 hex digits" in batch.error_message


def test_size_estimate_grows_with_content(sdk: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = sdk
    _rag_spans(provider, vector=[0.5] * 8)
    small_request = _body(exporter.get_finished_spans())
    exporter.clear()
    _rag_spans(provider, vector=[0.5] * 1536)
    spans = decode_protobuf(_body(exporter.get_finished_spans()), TENANT).spans
    (small,) = (s for s in decode_protobuf(small_request, TENANT).spans if s.name == "embed")
    (large,) = (s for s in spans if s.name == "embed")
    assert 0 < small.size_bytes < large.size_bytes
    # a 1,536-float vector is tens of KB in Python: the estimate must be of that order, not of the wire size
    assert large.size_bytes > 1536 * 24
    assert all(s.size_bytes > 0 for s in spans)


# ---------------------------------------------------------------- screening (ingest's request path)


def test_screened_spans_route_and_decode_like_decoded_ones(
    sdk: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = sdk
    _rag_spans(provider, vector=[0.25] * 1536)
    body = _body(exporter.get_finished_spans())
    screened = screen_protobuf(body, TENANT)
    decoded = decode_protobuf(body, TENANT)
    assert all(isinstance(s, WireSpan) for s in screened.spans)
    problems = DecodedBatch()
    assert [span_from_wire(s, problems) for s in screened.spans] == decoded.spans  # type: ignore[arg-type]
    assert problems.rejections == {}
    for wire, span in zip(screened.spans, decoded.spans, strict=True):
        assert (wire.tenant, wire.trace_id, wire.parent_span_id, wire.is_root) == (
            span.tenant,
            span.trace_id,
            span.parent_span_id,
            span.is_root,
        )
        # the buffer bound counts what the span will weigh decoded, not its wire bytes
        assert 0.5 <= wire.size_bytes / span.size_bytes <= 2, span.name


def test_screening_leaves_attribute_values_to_decoding(
    sdk: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = sdk
    with provider.get_tracer("t").start_as_current_span("llm") as span:
        span.set_attribute("llm.token_count.prompt", "many")
        span.set_attribute("output.value", "see embedding.embeddings.0.embedding.vector")  # not a vector
    body = _body(exporter.get_finished_spans())
    screened = screen_protobuf(body, TENANT)
    assert len(screened.spans) == 1 and screened.rejections == {}
    problems = DecodedBatch()
    (wire,) = screened.spans
    assert isinstance(wire, WireSpan)
    assert span_from_wire(wire, problems).attributes == {
        "output.value": "see embedding.embeddings.0.embedding.vector",
        "ragmon.dropped": ["llm.token_count.prompt"],
    }
    assert problems.rejections == {"invalid_attribute": 1}


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_screening_rejects_non_finite_vectors(
    sdk: tuple[TracerProvider, InMemorySpanExporter], bad: float
) -> None:
    provider, exporter = sdk
    _rag_spans(provider, vector=(0.1, bad, 0.3))
    screened = screen_protobuf(_body(exporter.get_finished_spans()), TENANT)
    assert screened.rejections == {"nan_vector": 1} and screened.rejected_spans == 1
    assert sorted(s.parent_span_id is None for s in screened.spans) == [False, True]


# ---------------------------------------------------------------- OTLP/JSON as the spec writes it

TRACE = "5b8efff798038103d269b633813fc60c"
ROOT = "eee19b7ec3c1b174"
CHILD = "eee19b7ec3c1b173"


def _json_span(span_id: str = CHILD, **overrides: Any) -> dict[str, Any]:
    span: dict[str, Any] = {
        "traceId": TRACE,
        "spanId": span_id,
        "parentSpanId": ROOT,
        "name": "retrieve",
        "startTimeUnixNano": "1544712660000000000",
        "endTimeUnixNano": "1544712661000000000",
        "kind": 1,
        "attributes": [{"key": "openinference.span.kind", "value": {"stringValue": "RETRIEVER"}}],
        "status": {"code": 1},
    }
    span.update(overrides)
    return span


def _json_body(*spans: Any, resource: list[dict[str, Any]] | None = None) -> bytes:
    document = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": resource or [{"key": "service.name", "value": {"stringValue": "qa"}}]
                },
                "scopeSpans": [{"scope": {"name": "manual"}, "spans": list(spans)}],
            }
        ]
    }
    return json.dumps(document).encode()


def _attr(key: str, value: dict[str, Any]) -> dict[str, Any]:
    return {"key": key, "value": value}


def test_json_any_values_of_every_kind() -> None:
    attributes = [
        _attr("s", {"stringValue": "text"}),
        _attr("b", {"boolValue": False}),
        _attr("i_str", {"intValue": "9007199254740993"}),
        _attr("i_num", {"intValue": 42}),
        _attr("d", {"doubleValue": 0.25}),
        _attr("d_int", {"doubleValue": 3}),
        _attr("raw", {"bytesValue": base64.b64encode(b"\x00\x01").decode()}),
        _attr("arr", {"arrayValue": {"values": [{"stringValue": "a"}, {"intValue": "2"}]}}),
        _attr("kv", {"kvlistValue": {"values": [{"key": "inner", "value": {"boolValue": True}}]}}),
        _attr("empty", {}),
        {"key": "missing_value"},
    ]
    span = _json_span(attributes=attributes, unknownField={"ignored": True}, droppedAttributesCount=0)
    batch = decode_json(_json_body(span), TENANT)
    assert batch.rejections == {}
    (decoded,) = batch.spans
    assert decoded.attributes == {
        "s": "text",
        "b": False,
        "i_str": 9007199254740993,  # beyond float precision: must stay an exact int
        "i_num": 42,
        "d": 0.25,
        "d_int": 3.0,
        "raw": b"\x00\x01",
        "arr": ["a", 2],
        "kv": {"inner": True},
        "empty": None,
        "missing_value": None,
    }
    assert (decoded.trace_id, decoded.span_id, decoded.parent_span_id) == (TRACE, CHILD, ROOT)
    assert (decoded.start_ns, decoded.end_ns) == (1544712660000000000, 1544712661000000000)
    assert (decoded.kind, decoded.status_code) == (1, 1)
    assert decoded.resource == {"service.name": "qa"}


def test_json_upper_case_hex_ids_are_normalized_and_zero_parent_is_root() -> None:
    span = _json_span(traceId=TRACE.upper(), spanId=ROOT.upper(), parentSpanId="0" * 16)
    (decoded,) = decode_json(_json_body(span), TENANT).spans
    assert (decoded.trace_id, decoded.span_id) == (TRACE, ROOT)
    assert decoded.is_root


def test_empty_requests_are_valid() -> None:
    assert decode_json(b"{}", TENANT).spans == []
    assert decode_json(b'{"resourceSpans": []}', TENANT).spans == []
    assert decode_protobuf(b"", TENANT).spans == []


# ---------------------------------------------------------------- whole-body failures


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"\x0a\xff\xff\xff", "not a valid OTLP"),
        (b"not protobuf at all \xff", "not a valid OTLP"),
    ],
)
def test_malformed_protobuf_raises_decode_error(body: bytes, needle: str) -> None:
    with pytest.raises(DecodeError, match=needle) as caught:
        decode_protobuf(body, TENANT)
    assert caught.value.reason == "decode_error"


def test_invalid_utf8_in_protobuf_string_raises_decode_error(
    sdk: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = sdk
    with provider.get_tracer("t").start_as_current_span("caf\u00e9"):
        pass
    body = _body(exporter.get_finished_spans())
    corrupted = body.replace("caf\u00e9".encode(), b"caf\xff\xfe")
    assert corrupted != body
    with pytest.raises(DecodeError, match="UTF-8"):
        decode_protobuf(corrupted, TENANT)


def test_malformed_json_raises_decode_error() -> None:
    with pytest.raises(DecodeError, match="not valid JSON"):
        decode_json(b'{"resourceSpans": [', TENANT)


def test_invalid_utf8_json_raises_decode_error() -> None:
    body = _json_body(_json_span(name="x")).replace(b'"x"', b'"\xff\xfe"')
    with pytest.raises(DecodeError, match="not valid UTF-8"):
        decode_json(body, TENANT)


@pytest.mark.parametrize(
    ("document", "needle"),
    [
        ([], "request must be a JSON object"),
        ("text", "request must be a JSON object"),
        ({"resourceSpans": {}}, "resourceSpans must be a JSON array"),
        ({"resourceSpans": [7]}, r"resourceSpans\[0\] must be a JSON object"),
        ({"resourceSpans": [{"scopeSpans": "x"}]}, "scopeSpans must be a JSON array"),
        ({"resourceSpans": [{"scopeSpans": [{"spans": {}}]}]}, "spans must be a JSON array"),
        (
            {"resourceSpans": [{"resource": {"attributes": 5}, "scopeSpans": []}]},
            "attributes must be a JSON array",
        ),
    ],
)
def test_wrong_top_level_types_raise_decode_error(document: Any, needle: str) -> None:
    with pytest.raises(DecodeError, match=needle):
        decode_json(json.dumps(document).encode(), TENANT)


def test_non_bytes_body_and_empty_tenant_are_programming_errors() -> None:
    with pytest.raises(TypeError):
        decode_json("{}", TENANT)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        decode_protobuf("", TENANT)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        decode_json(b"{}", "")
    with pytest.raises(TypeError):
        decode_request(b"", TENANT)  # type: ignore[arg-type]


# ---------------------------------------------------------------- per-span rejections, protobuf from the SDK


def _sdk_request(
    provider: TracerProvider, exporter: InMemorySpanExporter, *vectors: Any
) -> ExportTraceServiceRequest:
    """One good span named 'good', then one span per vector (named 'v0', 'v1', ...)."""
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("good") as span:
        span.set_attribute("input.value", "kept")
    for i, vector in enumerate(vectors):
        model, values = vector if isinstance(vector, tuple) else ("m", vector)
        with tracer.start_as_current_span(f"v{i}") as span:
            span.set_attribute("embedding.model_name", model)
            span.set_attribute(VECTOR_KEY, values)
    return encode_spans(exporter.get_finished_spans())


def _names(batch: DecodedBatch) -> set[str]:
    return {s.name for s in batch.spans}


@pytest.mark.parametrize(("bad", "label"), [(math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf")])
def test_non_finite_vector_rejects_only_its_span(
    sdk: tuple[TracerProvider, InMemorySpanExporter], bad: float, label: str
) -> None:
    provider, exporter = sdk
    request = _sdk_request(provider, exporter, [0.1, bad, 0.3], [0.1, 0.2, 0.3])
    batch = decode_protobuf(request.SerializeToString(), TENANT)
    assert _names(batch) == {"good", "v1"}
    assert batch.rejected_spans == 1
    assert batch.rejections == {"nan_vector": 1}
    assert label in batch.error_message and "rejected 1 of 3 spans" in batch.error_message


def test_vector_lengths_must_agree_within_a_span(sdk: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = sdk
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("good"):
        pass
    with tracer.start_as_current_span("mixed") as span:
        span.set_attribute("embedding.embeddings.0.embedding.vector", [0.1, 0.2])
        span.set_attribute("embedding.embeddings.1.embedding.vector", [0.1, 0.2, 0.3])
    batch = decode_protobuf(_body(exporter.get_finished_spans()), TENANT)
    assert _names(batch) == {"good"}
    assert batch.rejections == {"vector_dimension_mismatch": 1}
    assert "[2, 3]" in batch.error_message


def test_vector_lengths_must_agree_per_model_within_a_request(
    sdk: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = sdk
    request = _sdk_request(
        provider,
        exporter,
        ("small", [0.1, 0.2, 0.3]),
        ("small", [0.1, 0.2]),  # later span, same model, other length: rejected
        ("large", [0.1, 0.2, 0.3, 0.4, 0.5]),  # another model may differ
        ("small", [0.4, 0.5, 0.6]),
    )
    batch = decode_protobuf(request.SerializeToString(), TENANT)
    assert _names(batch) == {"good", "v0", "v2", "v3"}
    assert batch.rejections == {"vector_dimension_mismatch": 1}
    assert "'small'" in batch.error_message


def _raw_request(mutate: Callable[[Any], None]) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for i, name in enumerate(("good", "bad")):
        span = scope.spans.add()
        span.name = name
        span.trace_id = bytes.fromhex(TRACE)
        span.span_id = bytes([0, 0, 0, 0, 0, 0, 0, i + 1])
        span.start_time_unix_nano = 1_000
        span.end_time_unix_nano = 2_000
    mutate(scope.spans[1])
    return request


@pytest.mark.parametrize(
    ("mutate", "reason", "needle"),
    [
        (lambda s: setattr(s, "trace_id", b"\x00" * 16), "invalid_trace_id", "trace id"),
        (lambda s: setattr(s, "trace_id", b"\x01" * 8), "invalid_trace_id", "trace id"),
        (lambda s: setattr(s, "trace_id", b""), "invalid_trace_id", "trace id"),
        (lambda s: setattr(s, "span_id", b"\x00" * 8), "invalid_span_id", "span id"),
        (lambda s: setattr(s, "span_id", b"\x01" * 16), "invalid_span_id", "span id"),
        (lambda s: setattr(s, "parent_span_id", b"\x01" * 3), "invalid_parent_span_id", "parent span id"),
        (lambda s: setattr(s, "end_time_unix_nano", 500), "invalid_time", "not a valid interval"),
        (lambda s: setattr(s, "start_time_unix_nano", 0), "invalid_time", "not a valid interval"),
    ],
)
def test_bad_ids_and_times_reject_only_their_span(
    mutate: Callable[[Any], None], reason: str, needle: str
) -> None:
    batch = decode_request(_raw_request(mutate), TENANT)
    assert _names(batch) == {"good"}
    assert batch.rejected_spans == 1
    assert batch.rejections == {reason: 1}
    assert RejectReason(reason) in RejectReason
    assert needle in batch.error_message


# ---------------------------------------------------------------- per-span rejections, JSON


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"traceId": "zz" * 16}, "invalid_trace_id"),
        ({"traceId": "0" * 32}, "invalid_trace_id"),
        ({"traceId": 5}, "invalid_trace_id"),
        ({"spanId": "abc"}, "invalid_span_id"),
        ({"parentSpanId": "xyz"}, "invalid_parent_span_id"),
        ({"startTimeUnixNano": "soon"}, "invalid_time"),
        ({"endTimeUnixNano": "1"}, "invalid_time"),
        ({"attributes": {"key": "x"}}, "malformed_span"),
        ({"events": [3]}, "malformed_span"),
    ],
)
def test_json_bad_spans_are_rejected_alone(overrides: dict[str, Any], reason: str) -> None:
    good = _json_span(span_id=ROOT, name="good", parentSpanId="")
    bad = _json_span(name="bad", **overrides)
    batch = decode_json(_json_body(good, bad), TENANT)
    assert _names(batch) == {"good"}
    assert batch.rejections == {reason: 1}
    assert batch.rejected_spans == 1


def test_json_span_that_is_not_an_object_is_rejected_alone() -> None:
    batch = decode_json(_json_body(_json_span(name="good"), "span?"), TENANT)
    assert _names(batch) == {"good"}
    assert batch.rejections == {"malformed_span": 1}


@pytest.mark.parametrize("special", ["NaN", "Infinity", "-Infinity"])
def test_json_special_doubles_in_a_vector_reject_the_span(special: str) -> None:
    vector = {"arrayValue": {"values": [{"doubleValue": 0.1}, {"doubleValue": special}]}}
    bad = _json_span(name="bad", attributes=[_attr(VECTOR_KEY, vector)])
    batch = decode_json(_json_body(_json_span(span_id=ROOT, name="good"), bad), TENANT)
    assert _names(batch) == {"good"}
    assert batch.rejections == {"nan_vector": 1}


def test_json_vector_dimension_mismatch_across_spans() -> None:
    def embed(span_id: str, n: int) -> dict[str, Any]:
        values = [{"doubleValue": 0.5}] * n
        return _json_span(
            span_id=span_id,
            name=f"embed{n}",
            attributes=[
                _attr("embedding.model_name", {"stringValue": "m"}),
                _attr(VECTOR_KEY, {"arrayValue": {"values": values}}),
            ],
        )

    batch = decode_json(_json_body(embed("00000000000000a1", 4), embed("00000000000000a2", 3)), TENANT)
    assert _names(batch) == {"embed4"}
    assert batch.rejections == {"vector_dimension_mismatch": 1}


# ---------------------------------------------------------------- invalid attributes: dropped, span kept


def test_wrong_typed_semconv_numbers_are_dropped_and_counted() -> None:
    attributes = [
        _attr("retrieval.documents.0.document.id", {"stringValue": "d0"}),
        _attr("retrieval.documents.0.document.score", {"stringValue": "high"}),
        _attr("retrieval.documents.1.document.score", {"stringValue": "0.83"}),
        _attr("retrieval.documents.2.document.score", {"boolValue": True}),
        _attr("llm.token_count.prompt", {"intValue": "-5"}),
        _attr("llm.token_count.completion", {"doubleValue": 12.0}),
        _attr("gen_ai.usage.input_tokens", {"doubleValue": 1.5}),
        _attr("llm.cost.total", {"stringValue": "free"}),
        _attr("ragmon.ttft_ms", {"intValue": "250"}),
        _attr(VECTOR_KEY, {"arrayValue": {"values": [{"doubleValue": 0.1}, {"stringValue": "x"}]}}),
        _attr("bad_int", {"intValue": "12abc"}),
        _attr("bad_bytes", {"bytesValue": "***"}),
        _attr("bad_array", {"arrayValue": {"values": "nope"}}),
        {"value": {"stringValue": "no key"}},
    ]
    batch = decode_json(_json_body(_json_span(attributes=attributes)), TENANT)
    (span,) = batch.spans
    assert batch.rejected_spans == 0
    # a negative count is a number out of its range; the rest are not numbers of their kind
    assert batch.rejections == {"invalid_attribute": 9, "out_of_range": 1}
    assert span.attributes == {
        "retrieval.documents.0.document.id": "d0",
        "retrieval.documents.1.document.score": 0.83,
        "llm.token_count.completion": 12,
        "ragmon.ttft_ms": 250.0,
        "ragmon.dropped": [
            "retrieval.documents.0.document.score",
            "retrieval.documents.2.document.score",
            "llm.token_count.prompt",
            "gen_ai.usage.input_tokens",
            "llm.cost.total",
            VECTOR_KEY,
            "bad_int",
            "bad_bytes",
            "bad_array",
            "?",
        ],
    }
    assert "dropped 10 invalid attribute values" in batch.error_message
    assert "retrieval.documents.0.document.score is not a number" in batch.error_message


def test_invalid_attribute_in_protobuf_is_dropped(sdk: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = sdk
    with provider.get_tracer("t").start_as_current_span("llm") as span:
        span.set_attribute("llm.token_count.prompt", "many")
        span.set_attribute("llm.token_count.completion", 3)
        span.set_attribute("retrieval.documents.0.document.score", math.nan)
    batch = decode_protobuf(_body(exporter.get_finished_spans()), TENANT)
    (decoded,) = batch.spans
    assert decoded.attributes == {
        "llm.token_count.completion": 3,
        "ragmon.dropped": ["llm.token_count.prompt", "retrieval.documents.0.document.score"],
    }
    assert batch.rejections == {"invalid_attribute": 1, "out_of_range": 1}


def test_error_message_combines_span_and_attribute_problems() -> None:
    attributes = [_attr("retrieval.documents.0.document.score", {"stringValue": "?"})]
    body = _json_body(_json_span(attributes=attributes), _json_span(name="bad", traceId="0" * 32))
    batch = decode_json(body, TENANT)
    assert batch.rejections == {"invalid_attribute": 1, "invalid_trace_id": 1}
    message = batch.error_message
    assert message.startswith("rejected 1 of 2 spans (invalid_trace_id=1); dropped 1 invalid attribute value")


def test_details_are_bounded() -> None:
    spans = [_json_span(span_id=f"{i + 1:016x}", traceId="0" * 32) for i in range(50)]
    batch = decode_json(_json_body(*spans), TENANT)
    assert batch.rejections == {"invalid_trace_id": 50}
    assert len(batch.details) == 5
    assert len(batch.error_message) < 1000


def test_decoding_does_not_mutate_the_parsed_request(
    sdk: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = sdk
    _rag_spans(provider)
    request = encode_spans(exporter.get_finished_spans())
    before = copy.deepcopy(request)
    decode_request(request, TENANT)
    assert request == before


def _any(item: object) -> AnyValue:
    if isinstance(item, bool):
        return AnyValue(bool_value=item)
    if isinstance(item, int):
        return AnyValue(int_value=item)
    if isinstance(item, float):
        return AnyValue(double_value=item)
    return AnyValue(string_value=str(item))


@pytest.mark.parametrize(
    "items",
    [
        [1, 2.5, 3],  # ints among doubles: off the all-double fast path, accepted as floats
        [0.1, "x", math.nan],  # a non-number first: the value is dropped, the span kept
        [0.1, math.nan, "x"],  # a NaN first: the span is rejected
        [],  # empty: dropped
        [True, 0.5],  # a boolean is not a number: dropped
        [0.1, math.inf],  # all doubles, one infinite: rejected
        [0.25] * 300,
    ],
)
def test_protobuf_vectors_are_judged_as_the_json_decoder_judges_them(items: list[object]) -> None:
    """The screening path reads vectors its own way (numpy on the wire bytes); the OTLP/JSON decoder
    converts every value first. Both must accept, drop and reject the same vectors."""
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.name, span.trace_id, span.span_id = "embed", bytes.fromhex(TRACE), bytes.fromhex(ROOT)
    span.start_time_unix_nano, span.end_time_unix_nano = 1, 2
    span.attributes.add(key="embedding.model_name", value=AnyValue(string_value="m"))
    vector = span.attributes.add(key=VECTOR_KEY)
    vector.value.array_value.values.extend(_any(item) for item in items)
    from_protobuf = decode_protobuf(request.SerializeToString(), TENANT)
    from_json = decode_json(json.dumps(_to_spec_json(request)).encode(), TENANT)
    assert from_protobuf.rejections == from_json.rejections
    assert from_protobuf.rejected_spans == from_json.rejected_spans
    assert [s.attributes for s in from_protobuf.spans] == [s.attributes for s in from_json.spans]  # type: ignore[union-attr]
