"""`service/ingest/span_records.py`: spans and log events onto spans-topic records and back."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from service.conventions.pricing import PriceTable
from service.conventions.semconv import build_trace
from service.conventions.spans import LogEvent, PackedSpan, Span, WireSpan
from service.errors import DecodeError, PayloadTooLarge
from service.ingest import otlp, otlp_protobuf, span_records
from service.ingest.otlp_encode import resource_bytes
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
    spans = otlp_protobuf.screen_protobuf(otlp_body(ids), "acme").spans
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
    decoded = otlp_protobuf.decode_protobuf(otlp_body([trace_id]), "default").spans
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
    spans = otlp_protobuf.screen_protobuf(otlp_body([trace_id] * 1), "default").spans
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


# ---- the framing as it was written before `encode_traces` (one copy of each item per level of
# framing): the reference the faster framing is held to, byte for byte


def _ref_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _ref_field(number: int, payload: bytes) -> bytes:
    return _ref_varint(number << 3 | 2) + _ref_varint(len(payload)) + payload


def _ref_value(items: list[tuple[bytes, Any]], resources: dict[int, bytes]) -> bytes:
    by_resource: dict[int, list[bytes]] = {}
    for raw, resource in items:
        by_resource.setdefault(id(resource), []).append(raw)
    parts = []
    for resource_id, raws in by_resource.items():
        scope = b"".join(_ref_field(2, raw) for raw in raws)
        parts.append(_ref_field(1, resources[resource_id] + _ref_field(2, scope)))
    return b"".join(parts)


def _ref_encode(spans: list[Any], max_bytes: int) -> list[tuple[bytes, bytes, tuple[Any, ...]]]:
    groups: dict[tuple[str, str, bool], list[tuple[bytes, Any]]] = {}
    resources: dict[int, bytes] = {}
    for span in spans:
        raw, resource = span_records._item(span)
        if id(resource) not in resources:
            resources[id(resource)] = _ref_field(1, resource_bytes(resource))
        groups.setdefault((span.tenant, span.trace_id, isinstance(span, LogEvent)), []).append(
            (raw, resource)
        )
    records = []
    for (tenant, trace_id, logs), items in groups.items():
        headers = (
            ("ragmon-format", span_records.FORMAT),
            ("ragmon-kind", b"logs" if logs else b"spans"),
            ("ragmon-tenant", tenant.encode()),
        )
        chunk: list[tuple[bytes, Any]] = []
        size = 0
        for raw, resource in items:
            cost = len(raw) + 16 + len(resources[id(resource)])
            if chunk and size + cost > max_bytes:
                records.append((trace_id.encode(), _ref_value(chunk, resources), headers))
                chunk, size = [], 0
            chunk.append((raw, resource))
            size += cost
        records.append((trace_id.encode(), _ref_value(chunk, resources), headers))
    return records


def _ref_encode_many(groups: list[list[Any]]) -> list[tuple[bytes, bytes]]:
    parts: dict[tuple[str, str], tuple[list[bytes], list[bytes]]] = {}
    for key, value, headers in _ref_encode([item for items in groups for item in items], 1 << 62):
        fields = dict(headers)
        spans, events = parts.setdefault((fields["ragmon-tenant"].decode(), key.decode()), ([], []))
        (events if fields["ragmon-kind"] == b"logs" else spans).append(value)
    out = []
    for items in groups:
        spans, events = parts.get((items[0].tenant, items[0].trace_id), ([], [])) if items else ([], [])
        out.append((b"".join(spans), b"".join(events)))
    return out


def _varied_items() -> list[list[Any]]:
    """Traces of screened spans from three requests (three resources), decoded and packed spans,
    events, and spans whose bytes need three- and four-byte lengths."""
    by_trace: dict[str, list[Any]] = {}
    for n, tenant in enumerate(("acme", "acme", "other")):
        ids = trace_ids(3 + n)[n:]
        for span in otlp_protobuf.screen_protobuf(otlp_body(ids), tenant).spans:
            by_trace.setdefault(span.trace_id + tenant, []).append(span)
    groups = list(by_trace.values())
    [json_trace] = trace_ids(1)
    decoded = [
        s for s in otlp_protobuf.decode_protobuf(otlp_body([json_trace]), "acme").spans if isinstance(s, Span)
    ]
    event = LogEvent(
        trace_id=json_trace,
        span_id=decoded[0].span_id,
        name="gen_ai.choice",
        time_ns=decoded[0].start_ns,
        attributes={"content": "é" * 300},
        resource={"service.name": "events-app"},
        tenant="acme",
    )
    groups.append([PackedSpan.pack(decoded[0]), event, *decoded[1:], event])
    first = groups[0][0]
    for size in (127, 128, 16_383, 16_384, 2_100_000):
        big = WireSpan(
            first.tenant, "f" * 31 + str(size % 10), None, size, bytes(range(256)) * (size // 256), {}
        )
        groups.append([big, first._replace(trace_id=big.trace_id)])
    groups.append([dataclasses.replace(event, trace_id="e" * 32)])  # events only
    return groups


def test_archive_framing_writes_what_the_per_level_framing_wrote() -> None:
    groups = _varied_items()
    assert span_records.encode_traces(groups) == _ref_encode_many(groups)
    # groups that break the one-trace-per-group rule: a repeated trace, a mixed group, an empty one
    odd = [groups[0], groups[1] + groups[2], [], groups[0], groups[3]]
    assert span_records.encode_traces(odd) == _ref_encode_many(odd)
    items = [item for group in groups for item in group]
    for limit in (1 << 62, 1_000_000, 8_192, 4_096):
        small = [i for i in items if len(span_records.item_bytes(i)) < limit - 512]
        records = span_records.encode(small, limit)
        assert [(r.key, r.value, r.headers) for r in records] == _ref_encode(small, limit)
