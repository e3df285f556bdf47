"""Range checks of `service/ingest/otlp.py`: every number, string, time, index and vector is held to
the limits of its rule tables at decode, so nothing after ingest (semconv's datetime, `int()` of a
key's index, the store's BigInteger) can fail on it and cost a whole trace or batch."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from service.conventions.pricing import PriceTable
from service.conventions.semconv import build_trace
from service.conventions.spans import Span, WireSpan
from service.ingest import span_records
from service.ingest.otlp import (
    MAX_ATTRIBUTE_INDEX,
    MAX_COUNT,
    MAX_IDENTIFIER_CHARS,
    MAX_KEY_CHARS,
    MAX_NAME_CHARS,
    MAX_TEXT_CHARS,
    MAX_TIME_NS,
    MAX_VECTOR_LENGTH,
    DecodedBatch,
)
from service.ingest.otlp_encode import span_bytes
from service.ingest.otlp_json import decode_json
from service.ingest.otlp_protobuf import decode_protobuf, screen_protobuf, span_from_wire
from service.ingest.span_size import MAX_SPAN_BYTES, truncation_note

TENANT = "acme"
TRACE = "5b8efff798038103d269b633813fc60c"
ROOT = "eee19b7ec3c1b173"
START = 1_764_400_000_000_000_000
END = START + 500_000_000
HUGE_INDEX = "7" * 5000
VECTOR_KEY = "embedding.embeddings.0.embedding.vector"


# ---------------------------------------------------------------- bodies


def _json_value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, list):
        return {"arrayValue": {"values": [_json_value(item) for item in value]}}
    return {"stringValue": value}


def _json_span(span_id: str, attributes: dict[str, Any], **fields: Any) -> dict[str, Any]:
    span: dict[str, Any] = {
        "traceId": TRACE,
        "spanId": span_id,
        "parentSpanId": ROOT,
        "name": "step",
        "startTimeUnixNano": str(START),
        "endTimeUnixNano": str(END),
        "attributes": [{"key": k, "value": _json_value(v)} for k, v in attributes.items()],
    }
    span.update(fields)
    return span


def _json_body(*spans: dict[str, Any], service: str = "qa") -> bytes:
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]}
    return json.dumps(
        {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": list(spans)}]}]}
    ).encode()


def _set(target: AnyValue, value: Any) -> None:
    if isinstance(value, bool):
        target.bool_value = value
    elif isinstance(value, int):
        target.int_value = value
    elif isinstance(value, float):
        target.double_value = value
    elif isinstance(value, list):
        for item in value:
            _set(target.array_value.values.add(), item)
    else:
        target.string_value = value


def _pb_span(span_id: str, attributes: dict[str, Any], start: int = START, end: int = END) -> PbSpan:
    span = PbSpan(
        trace_id=bytes.fromhex(TRACE),
        span_id=bytes.fromhex(span_id),
        parent_span_id=bytes.fromhex(ROOT),
        name="step",
        start_time_unix_nano=start,
        end_time_unix_nano=end,
    )
    for key, value in attributes.items():
        kv = span.attributes.add()
        kv.key = key
        _set(kv.value, value)
    return span


def _pb_body(*spans: PbSpan, service: str = "qa") -> bytes:
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    kv = resource_spans.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", service
    resource_spans.scope_spans.add().spans.extend(spans)
    body: bytes = request.SerializeToString()
    return body


def _spans(batch: DecodedBatch) -> list[Span]:
    """The batch's spans, decoded (what `decode_json` and `decode_protobuf` give)."""
    spans = [span for span in batch.spans if isinstance(span, Span)]
    assert len(spans) == len(batch.spans)
    return spans


def _trace(batch: DecodedBatch) -> Any:
    return build_trace(_spans(batch), partial=False, prices=PriceTable.default())


def _root(decode: str) -> Any:
    attributes = {"openinference.span.kind": "CHAIN", "input.value": "a question"}
    if decode == "json":
        return _json_span(ROOT, attributes, parentSpanId="")
    span = _pb_span(ROOT, attributes)
    span.ClearField("parent_span_id")
    return span


def _decode(decode: str, attributes: dict[str, Any]) -> DecodedBatch:
    """A root span and one child span with `attributes`, through the JSON or the protobuf decoder."""
    child_id = "eee19b7ec3c1b174"
    if decode == "json":
        return decode_json(_json_body(_root("json"), _json_span(child_id, attributes)), TENANT)
    return decode_protobuf(_pb_body(_root("pb"), _pb_span(child_id, attributes)), TENANT)


def _child(batch: DecodedBatch) -> Span:
    assert batch.rejected_spans == 0 and len(batch.spans) == 2, batch.error_message
    return _spans(batch)[1]


BOTH = pytest.mark.parametrize("decode", ["json", "pb"])


# ---------------------------------------------------------------- times: the span is rejected


@pytest.mark.parametrize("start", [10**30, 1e30, str(10**30)])
def test_json_start_time_of_1e30_ns_rejects_that_span_alone(start: Any) -> None:
    """1e30 ns once passed, and `datetime(1970) + timedelta(...)` in semconv lost the whole trace after
    the 200 had been sent."""
    late = _json_span("eee19b7ec3c1b175", {}, startTimeUnixNano=start, endTimeUnixNano=start)
    batch = decode_json(_json_body(_root("json"), late), TENANT)
    assert batch.rejected_spans == 1 and batch.rejections == {"invalid_time": 1}
    assert [s.span_id for s in _spans(batch)] == [ROOT]
    assert "after the latest time ragmon keeps" in batch.error_message
    assert "rejected 1 of 2 spans (invalid_time=1)" in batch.error_message
    _trace(batch)


def test_json_end_time_past_2262_rejects_the_span() -> None:
    span = _json_span("eee19b7ec3c1b175", {}, endTimeUnixNano=str(MAX_TIME_NS + 1))
    batch = decode_json(_json_body(_root("json"), span), TENANT)
    assert batch.rejections == {"invalid_time": 1} and "end time" in batch.error_message
    at_the_limit = _json_span("eee19b7ec3c1b175", {}, endTimeUnixNano=str(MAX_TIME_NS))
    assert decode_json(_json_body(at_the_limit), TENANT).rejections == {}


@pytest.mark.parametrize("event_time", [str(10**30), "-5", str(MAX_TIME_NS + 1)])
def test_json_event_time_out_of_range_rejects_the_span(event_time: str) -> None:
    span = _json_span(
        "eee19b7ec3c1b175",
        {"input.value": 3.5, "llm.token_count.prompt": -1},
        events=[{"name": "First Token Stream Event", "timeUnixNano": event_time}],
    )
    batch = decode_json(_json_body(span), TENANT)
    # the span's own rule is checked first: its bad attribute value is not counted as dropped as well
    assert batch.rejections == {"invalid_time": 1} and batch.spans == []


def test_protobuf_times_past_2262_are_rejected_at_screening() -> None:
    """Protobuf's fixed64 reaches year 2554: within Python's datetime, but past what a signed 64-bit
    nanosecond count (and so every timestamp after ingest) holds."""
    late_start = _pb_span("eee19b7ec3c1b175", {}, start=2**64 - 1, end=2**64 - 1)
    late_end = _pb_span("eee19b7ec3c1b176", {}, end=MAX_TIME_NS + 1)
    late_event = _pb_span("eee19b7ec3c1b177", {})
    late_event.events.add(name="tick", time_unix_nano=2**64 - 1)
    body = _pb_body(_pb_span(ROOT, {}), late_start, late_end, late_event)
    for batch in (screen_protobuf(body, TENANT), decode_protobuf(body, TENANT)):
        assert batch.rejected_spans == 3 and batch.rejections == {"invalid_time": 3}
        assert len(batch.spans) == 1


@BOTH
def test_a_name_over_the_limit_rejects_the_span(decode: str) -> None:
    name = "n" * (MAX_NAME_CHARS + 1)
    if decode == "json":
        batch = decode_json(_json_body(_root("json"), _json_span("eee19b7ec3c1b175", {}, name=name)), TENANT)
    else:
        span = _pb_span("eee19b7ec3c1b175", {})
        span.name = name
        batch = screen_protobuf(_pb_body(_root("pb"), span), TENANT)
    assert batch.rejections == {"malformed_span": 1} and "4,096" in batch.error_message


# ---------------------------------------------------------------- attribute values: dropped, span kept


@BOTH
def test_a_5000_digit_attribute_index_is_dropped_and_the_trace_builds(decode: str) -> None:
    """`int()` of a 5,000-digit index raised in `content.py` and lost the trace in the builder."""
    attributes = {
        "openinference.span.kind": "RETRIEVER",
        "retrieval.documents.0.document.id": "doc-0",
        f"retrieval.documents.{HUGE_INDEX}.document.id": "doc-huge",
        f"retrieval.documents.{MAX_ATTRIBUTE_INDEX + 1}.document.id": "doc-over",
        f"retrieval.documents.{MAX_ATTRIBUTE_INDEX}.document.id": "doc-last",
        f"anything.{HUGE_INDEX}.else": "x",
        "build.20240101123456": "a last segment is not an index",
    }
    batch = _decode(decode, attributes)
    child = _child(batch)
    assert batch.rejections == {"invalid_attribute_index": 3}
    assert f"retrieval.documents.{MAX_ATTRIBUTE_INDEX}.document.id" in child.attributes
    assert "build.20240101123456" in child.attributes
    assert not any(HUGE_INDEX in key for key in child.attributes if key.startswith(("retrieval", "anything")))
    if decode == "json":
        assert "dropped 3 invalid attribute values (invalid_attribute_index=3)" in batch.error_message
    trace = _trace(batch)
    assert [c.id for c in trace.retrieval.chunks] == ["doc-0", "doc-last"]


@BOTH
def test_token_counts_over_the_cap_are_out_of_range(decode: str) -> None:
    batch = _decode(
        decode,
        {
            "openinference.span.kind": "LLM",
            "llm.model_name": "gpt-4o-mini",
            "llm.token_count.prompt": 10**13,
            "llm.token_count.completion": MAX_COUNT,
            "gen_ai.usage.input_tokens": 1e30,
        },
    )
    child = _child(batch)
    assert batch.rejections == {"out_of_range": 2}
    assert "llm.token_count.prompt" not in child.attributes
    assert child.attributes["llm.token_count.completion"] == MAX_COUNT
    trace = _trace(batch)
    assert trace.output_tokens == MAX_COUNT and trace.input_tokens == 0


@BOTH
def test_costs_must_be_within_zero_and_the_cap(decode: str) -> None:
    batch = _decode(
        decode,
        {
            "llm.cost.total": -1.0,
            "llm.cost.prompt": 2e6,
            "llm.cost.completion": 0.25,
            "ragmon.ttft_ms": 120.0,
        },
    )
    child = _child(batch)
    assert batch.rejections == {"out_of_range": 2}
    assert child.attributes["llm.cost.completion"] == 0.25
    assert child.attributes["ragmon.dropped"] == ["llm.cost.total", "llm.cost.prompt"]


def test_json_int_value_beyond_64_bits_is_out_of_range() -> None:
    span = _json_span("eee19b7ec3c1b175", {})
    span["attributes"] = [
        {"key": "custom.big", "value": {"intValue": str(2**64)}},
        {"key": "custom.fine", "value": {"intValue": str(2**63 - 1)}},
        {"key": "custom.list", "value": {"arrayValue": {"values": [{"intValue": str(-(2**63) - 1)}]}}},
    ]
    batch = decode_json(_json_body(span), TENANT)
    assert batch.rejections == {"out_of_range": 2}
    assert _spans(batch)[0].attributes == {
        "custom.fine": 2**63 - 1,
        "ragmon.dropped": ["custom.big", "custom.list"],
    }


@BOTH
def test_huge_identifiers_keys_and_nested_strings_are_dropped_huge_text_is_truncated(decode: str) -> None:
    """An identifier cut short would name something else, and a list or map cannot be cut in a
    meaningful place: those are dropped. A span's own text is cut to fit `MAX_SPAN_BYTES`
    (`span_size.py`), the two long values to one common length."""
    big = "q" * (MAX_TEXT_CHARS + 1)
    batch = _decode(
        decode,
        {
            "input.value": big,
            "output.value": "a" * MAX_TEXT_CHARS,
            "custom.list": ["short", big],
            "session.id": "s" * (MAX_IDENTIFIER_CHARS + 1),
            "user.id": "u" * MAX_IDENTIFIER_CHARS,
            "retrieval.documents.0.document.id": "d" * (MAX_IDENTIFIER_CHARS + 1),
            "k" * (MAX_KEY_CHARS + 1): "a key over the limit",
        },
    )
    child = _child(batch)
    assert batch.rejections == {"string_too_long": 4} and batch.truncated == 2
    assert set(child.attributes) == {
        "input.value",
        "output.value",
        "user.id",
        "ragmon.dropped",
        "ragmon.truncated",
    }
    assert child.attributes["ragmon.truncated"] == ["input.value", "output.value"]
    question, answer = child.attributes["input.value"], child.attributes["output.value"]
    assert isinstance(question, str) and isinstance(answer, str)
    assert question.endswith(truncation_note(MAX_TEXT_CHARS + 1)) and question.startswith("q" * 400_000)
    assert answer.endswith(truncation_note(MAX_TEXT_CHARS))
    assert len(question) - len(truncation_note(MAX_TEXT_CHARS + 1)) == len(answer) - len(
        truncation_note(MAX_TEXT_CHARS)
    )
    assert len(span_bytes(child)) <= MAX_SPAN_BYTES
    message = batch.error_message
    assert "dropped 4 invalid attribute values (string_too_long=4)" in message
    assert "truncated 2 oversize attribute values" in message


@BOTH
def test_an_app_name_over_the_identifier_limit_is_dropped(decode: str) -> None:
    long_name = "x" * (MAX_IDENTIFIER_CHARS + 1)
    if decode == "json":
        batch = decode_json(_json_body(_json_span(ROOT, {}, parentSpanId=""), service=long_name), TENANT)
    else:
        span = _pb_span(ROOT, {})
        span.ClearField("parent_span_id")
        batch = decode_protobuf(_pb_body(span, service=long_name), TENANT)
    assert batch.rejections == {"string_too_long": 1}
    assert _trace(batch).app == "unknown"


@BOTH
def test_vectors_and_arrays_over_the_limit_are_dropped(decode: str) -> None:
    long_vector = [0.5] * (MAX_VECTOR_LENGTH + 1)
    batch = _decode(
        decode,
        {
            "openinference.span.kind": "EMBEDDING",
            "embedding.model_name": "e",
            VECTOR_KEY: long_vector,
            "embedding.embeddings.1.embedding.vector": [0.5] * MAX_VECTOR_LENGTH,
            "custom.numbers": list(range(MAX_VECTOR_LENGTH + 1)),
        },
    )
    child = _child(batch)
    assert batch.rejections == {"vector_too_long": 2}
    assert VECTOR_KEY not in child.attributes and "custom.numbers" not in child.attributes
    assert len(child.attributes["embedding.embeddings.1.embedding.vector"]) == MAX_VECTOR_LENGTH  # type: ignore[arg-type]


def test_protobuf_screening_keeps_a_span_whose_only_problem_is_a_long_vector() -> None:
    """Screening rejects spans only; the long vector is dropped, and counted, when the span is decoded."""
    span = _pb_span("eee19b7ec3c1b175", {VECTOR_KEY: [0.5] * (MAX_VECTOR_LENGTH + 1)})
    screened = screen_protobuf(_pb_body(span), TENANT)
    assert screened.rejected_spans == 0 and screened.rejections == {}
    decoded = decode_protobuf(_pb_body(span), TENANT)
    assert decoded.rejections == {"vector_too_long": 1} and VECTOR_KEY not in _spans(decoded)[0].attributes


def test_huge_numbers_and_indices_inside_json_payloads_do_not_fail_the_build() -> None:
    """What the decoder cannot see (keys and numbers inside a JSON string) the readers skip: a message
    part under a 5,000-digit index, a document score of 400 digits (`float()` of it overflows)."""
    messages = json.dumps(
        [
            {"role": "user", f"message.contents.{HUGE_INDEX}.message_content.text": "hidden"},
            {"role": "user", "content": "the question"},
        ]
    )
    documents = json.dumps([{"id": "d1", "content": "c", "score": 10**400}])
    span = _json_span(
        ROOT,
        {"gen_ai.operation.name": "chat", "gen_ai.input.messages": messages},
        parentSpanId="",
    )
    retriever = _json_span(
        "eee19b7ec3c1b175", {"gen_ai.operation.name": "retrieval", "gen_ai.retrieval.documents": documents}
    )
    batch = decode_json(_json_body(span, retriever), TENANT)
    assert batch.rejections == {}
    trace = _trace(batch)
    assert trace.query == "the question"
    assert [(c.id, c.score) for c in trace.retrieval.chunks] == [("d1", None)]


# ---------------------------------------------------------------- screening names them in the answer


def test_protobuf_numbers_out_of_range_are_dropped_at_screening_and_named_in_the_answer() -> None:
    """The issue's request: a token count of 1e30 was stored as 0 and a NaN score as null, and the
    answer said nothing. Now each such field is dropped at screening (the answer names it), the span
    says which it lost, its cost is not computed from the counts left, and the builder has nothing
    left to drop (nothing is counted twice)."""
    child = _pb_span(
        "eee19b7ec3c1b174",
        {
            "openinference.span.kind": "LLM",
            "llm.model_name": "gpt-4o-mini",
            "llm.token_count.prompt": 1e30,
            "llm.token_count.completion": 40,
            "ragmon.ttft_ms": -math.inf,
            "gen_ai.usage.output_tokens": -5,
            "output.value": "an answer",
        },
    )
    retriever = _pb_span(
        "eee19b7ec3c1b175",
        {
            "openinference.span.kind": "RETRIEVER",
            "retrieval.documents.0.document.id": "d0",
            "retrieval.documents.0.document.score": math.nan,
            "retrieval.documents.1.document.id": "d1",
            "retrieval.documents.1.document.score": 0.5,
        },
    )
    body = _pb_body(_root("pb"), child, retriever)
    screened = screen_protobuf(body, TENANT)
    assert screened.rejected_spans == 0 and len(screened.spans) == 3
    assert screened.rejections == {"out_of_range": 4}
    assert "dropped 4 invalid attribute values (out_of_range=4)" in screened.error_message
    message = screened.error_message
    assert f"span {TRACE}/eee19b7ec3c1b174: llm.token_count.prompt is not a count within 0.." in message
    assert [key for _, key, _ in screened.drops] == [
        "llm.token_count.prompt",
        "ragmon.ttft_ms",
        "gen_ai.usage.output_tokens",
        "retrieval.documents.0.document.score",
    ]
    builder = DecodedBatch()
    spans = [span_from_wire(wire, builder) for wire in screened.spans]  # type: ignore[arg-type]
    assert builder.rejections == {}
    attributes = spans[1].attributes
    assert attributes["ragmon.dropped"] == [key for _, key, _ in screened.drops[:3]]
    assert spans[2].attributes["ragmon.dropped"] == ["retrieval.documents.0.document.score"]
    assert attributes["llm.token_count.completion"] == 40 and attributes["output.value"] == "an answer"
    trace = build_trace(spans, partial=False, prices=PriceTable.default())
    assert [(c.id, c.score) for c in trace.retrieval.chunks] == [("d0", None), ("d1", 0.5)]
    assert trace.timings.ttft_s is None and trace.answer == "an answer"
    (usage,) = trace.usage
    assert (usage.output_tokens, usage.cost_usd, usage.cost_source) == (40, None, "unpriced")


def test_a_clean_span_keeps_its_wire_bytes() -> None:
    """A span whose bytes match the scan but hold nothing out of range (a negative score) is decoded
    once at screening and kept as it came."""
    span = _pb_span("eee19b7ec3c1b174", {"retrieval.documents.0.document.score": -0.25})
    body = _pb_body(span)
    (wire,) = screen_protobuf(body, TENANT).spans
    assert isinstance(wire, WireSpan) and wire.raw == span.SerializeToString()


def test_a_span_over_the_limit_that_cannot_be_cut_is_rejected_alone() -> None:
    numbers = _pb_span("eee19b7ec3c1b175", {f"custom.n{i}": i for i in range(120_000)})
    body = _pb_body(_root("pb"), numbers)
    for batch in (screen_protobuf(body, TENANT), decode_protobuf(body, TENANT)):
        assert batch.rejected_spans == 1 and batch.rejections == {"span_too_large": 1}
        assert [s.trace_id for s in batch.spans] == [TRACE]
        assert "rejected 1 of 2 spans (span_too_large=1)" in batch.error_message
        assert "does not fit the 900,000-byte limit" in batch.error_message


@pytest.mark.parametrize("decode", ["json", "pb"])
def test_a_10_mb_answer_is_truncated_its_span_kept_and_its_records_fit(decode: str) -> None:
    answer = "a" * 10 * 2**20
    if decode == "json":
        root = _json_span(ROOT, {"output.value": answer}, parentSpanId="")
        batch = decode_json(_json_body(root, _json_span("eee19b7ec3c1b174", {})), TENANT)
    else:
        pb_root = _pb_span(ROOT, {"output.value": answer})
        pb_root.ClearField("parent_span_id")
        batch = screen_protobuf(_pb_body(pb_root, _pb_span("eee19b7ec3c1b174", {})), TENANT)
    assert batch.rejected_spans == 0 and batch.rejections == {} and batch.truncated == 1
    assert len(batch.spans) == 2 and "truncated 1 oversize attribute value" in batch.error_message
    records = span_records.encode(batch.spans, 1_000_000)
    assert all(len(record.value) <= 1_000_000 for record in records)
    back = [span for record in records for span in span_records.decode(record.value, record.headers)]
    decoded = [span_from_wire(s, DecodedBatch()) if isinstance(s, WireSpan) else s for s in back]
    trace = build_trace(decoded, partial=False, prices=PriceTable.default())  # type: ignore[arg-type]
    assert trace.answer is not None and trace.answer.endswith(truncation_note(len(answer)))
    assert trace.answer.startswith("a" * 800_000)


def test_a_span_that_fits_once_its_bad_values_are_dropped_is_kept_with_a_bounded_mark() -> None:
    """60,000 NaN counts make a 2 MB span: dropped, they leave a small one, whose mark names 63 of them
    and how many more (the names of all would not fit the span size limit)."""
    nans = _pb_span("eee19b7ec3c1b175", {f"llm.token_count.k{i}": math.nan for i in range(60_000)})
    nans.attributes.add(key="output.value").value.string_value = "kept"
    batch = screen_protobuf(_pb_body(_root("pb"), nans), TENANT)
    assert batch.rejected_spans == 0 and batch.rejections == {"out_of_range": 60_000}
    span = span_from_wire(batch.spans[1], DecodedBatch())  # type: ignore[arg-type]
    assert span.attributes["output.value"] == "kept"
    dropped = span.attributes["ragmon.dropped"]
    assert isinstance(dropped, list) and len(dropped) == 64 and dropped[-1] == "... and 59937 more"
