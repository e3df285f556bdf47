"""`service/ingest/span_records.py`: spans and log events onto spans-topic records and back."""

from __future__ import annotations

import json

import pytest

from service.conventions.pricing import PriceTable
from service.conventions.semconv import build_trace
from service.conventions.spans import LogEvent, PackedSpan, Span, WireSpan
from service.errors import DecodeError, PayloadTooLarge
from service.ingest import otlp, span_records
from service.ingest.pool import _unpacked
from tests.distributed.traffic import otlp_body, trace_ids

PRICES = PriceTable.default()


def _built(spans: list[object]) -> dict[str, object]:
    problems = otlp.DecodedBatch()
    unpacked = [_unpacked(s, problems) for s in spans]  # type: ignore[arg-type]
    trace = build_trace(unpacked, partial=False, prices=PRICES)
    return trace.model_dump(exclude={"received_at"})


def test_screened_protobuf_spans_round_trip_as_their_wire_bytes_one_record_per_trace() -> None:
    ids = trace_ids(3)
    spans = otlp.screen_protobuf(otlp_body(ids), "acme").spans
    records = span_records.encode(spans, 1_000_000)
    assert [r.key.decode() for r in records] == ids
    assert dict(records[0].headers)["ragmon-tenant"] == b"acme"
    back = [span for r in records for span in span_records.decode(r.value, r.headers)]
    assert all(isinstance(s, WireSpan) for s in back)
    assert [(s.tenant, s.trace_id, s.raw, s.resource) for s in back] == [  # type: ignore[union-attr]
        (s.tenant, s.trace_id, s.raw, s.resource)
        for s in spans  # type: ignore[union-attr]
    ]


def test_decoded_spans_and_log_events_build_the_same_trace_after_the_trip() -> None:
    [trace_id] = trace_ids(1)
    decoded = otlp.decode_protobuf(otlp_body([trace_id]), "default").spans
    spans = [s for s in decoded if isinstance(s, Span)]
    event = LogEvent(
        trace_id=trace_id,
        span_id=spans[0].span_id,
        name="gen_ai.user.message",
        time_ns=spans[0].start_ns,
        attributes={"content": "hello", "n": 3, "ok": True, "nested": {"a": [1.5, "x"]}},
        resource={"service.name": "shop"},
    )
    records = span_records.encode([PackedSpan.pack(spans[0]), *spans[1:], event], 1_000_000)
    assert [dict(r.headers)["ragmon-kind"] for r in records] == [b"spans", b"logs"]
    back = [span for r in records for span in span_records.decode(r.value, r.headers)]
    [event_back] = [s for s in back if isinstance(s, LogEvent)]
    assert (event_back.name, event_back.attributes, event_back.span_id) == (
        event.name,
        event.attributes,
        event.span_id,
    )
    assert _built(back) == _built([*spans, event])


def test_a_large_trace_is_split_and_one_span_over_the_limit_is_refused() -> None:
    [trace_id] = trace_ids(1)
    spans = otlp.screen_protobuf(otlp_body([trace_id] * 1), "default").spans
    many = list(spans) * 40
    records = span_records.encode(many, 4096)
    assert len(records) > 1 and all(len(r.value) <= 4096 for r in records)
    assert sum(len(span_records.decode(r.value, r.headers)) for r in records) == len(many)
    with pytest.raises(PayloadTooLarge):
        span_records.encode(many, 560)


def test_records_of_another_format_do_not_decode() -> None:
    with pytest.raises(DecodeError):
        span_records.decode(json.dumps({"x": 1}).encode(), [("ragmon-format", b"pickle")])
    with pytest.raises(DecodeError):
        span_records.decode(
            b"\xff\xff",
            [("ragmon-format", span_records.FORMAT), ("ragmon-tenant", b"t"), ("ragmon-kind", b"spans")],
        )
