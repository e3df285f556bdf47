"""Spans and GenAI log events as Kafka records of the spans topic (distributed mode), and back.

Ingest replicas publish what they accepted; the sinks workers assemble it
(DESIGN.md, "Distributed assembly is keyed by trace id"). The format is
explicit and version-independent, never a pickle:

* key: the trace id (32 lower-case hex characters), so the default murmur2
  partitioner puts every record of one trace on one partition, whichever
  ingest replica published it;
* headers: `ragmon-format` = `otlp-protobuf-1`, `ragmon-kind` = `spans` or
  `logs`, `ragmon-tenant` = the tenant (UTF-8);
* value: an OTLP `ExportTraceServiceRequest` (kind `spans`) or
  `ExportLogsServiceRequest` (kind `logs`) holding spans (or events) of that
  one trace only, grouped by resource. A protobuf span that ingest screened
  travels as its own wire bytes (`WireSpan.raw`); a decoded one (OTLP/JSON)
  is encoded into the same message.

With redaction on, what ingest publishes is redacted already (`span_redaction.py`).

A record holds one trace's spans of one request, at most `max_bytes` of value:
a group that would be larger is split over several records. One span (or
event) never needs more: screening cut it to `span_size.MAX_SPAN_BYTES`, its
resource to `MAX_RESOURCE_BYTES`, and `kafka.max_record_bytes` is at least
`MIN_RECORD_BYTES`; a span over `max_bytes` raises `PayloadTooLarge` all the
same, should that ever break.

`decode` reads a record back into `WireSpan`s (screened again: a span that
ingest accepted passes the same rules) or `LogEvent`s; a record of an unknown
format or kind, or one that does not parse, raises `DecodeError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import NamedTuple

from service.conventions.spans import AnySpan, Attributes, LogEvent, PackedSpan, WireSpan
from service.errors import DecodeError, PayloadTooLarge
from service.ingest import otlp_logs, otlp_protobuf
from service.ingest.decoded import DecodedBatch
from service.ingest.otlp_encode import event_bytes, resource_bytes, span_bytes

__all__ = [
    "FORMAT",
    "RecordBatch",
    "SpanRecord",
    "as_records",
    "decode",
    "encode",
    "encode_traces",
    "item_bytes",
]

FORMAT = b"otlp-protobuf-1"
_SPANS, _LOGS = b"spans", b"logs"
# ExportTraceServiceRequest.resource_spans = 1, ResourceSpans.resource = 1 / scope_spans = 2,
# ScopeSpans.spans = 2; the logs messages number their fields the same way
_REQUEST_ITEMS, _RESOURCE, _SCOPE_ITEMS, _ITEMS = 1, 1, 2, 2
# one record holds a whole trace's items where no record limit applies (`encode_traces`)
_NO_LIMIT = 1 << 62


class SpanRecord(NamedTuple):
    """One record for the spans topic: its key (the trace id), headers and value.

    A named tuple: a decoder process hands a request's records to the server (`IngestPool.decode`),
    and a tuple unpickles in a quarter of a frozen dataclass's time."""

    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


@dataclass(slots=True)
class RecordBatch(DecodedBatch):
    """A decoded request whose accepted spans were encoded into spans-topic records where they were
    decoded (`as_records`: a decoder process in distributed mode, `IngestPool.max_record_bytes`):
    `spans` is empty, `record_spans` counts them; the rest answers the request as before."""

    records: list[SpanRecord] = field(default_factory=list)
    record_spans: int = 0

    @property
    def accepted(self) -> int:
        return self.record_spans


def as_records(batch: DecodedBatch, max_bytes: int) -> RecordBatch:
    """`batch` with its spans replaced by the records that hold them (`encode`)."""
    kept = {f.name: getattr(batch, f.name) for f in fields(DecodedBatch)}
    return RecordBatch(
        **{**kept, "spans": []}, records=encode(batch.spans, max_bytes), record_spans=len(batch.spans)
    )


def _varint(n: int) -> bytes:
    if n < _SMALL_VARINTS:
        return _SMALL[n]
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


# The varints of every length under 16 KiB, one or two bytes each (a span's bytes are ~2 KB): the
# archive frames each span of every flushed trace (`encode_traces`), four varints a span.
_SMALL_VARINTS = 1 << 14
_SMALL = [bytes([n]) if n < 0x80 else bytes([n & 0x7F | 0x80, n >> 7]) for n in range(_SMALL_VARINTS)]
_TAGS = {number: bytes([number << 3 | 2]) for number in (_REQUEST_ITEMS, _SCOPE_ITEMS)}


def _item(span: AnySpan) -> tuple[bytes, Attributes]:
    """(the item's wire bytes, its resource)."""
    if isinstance(span, WireSpan):
        return span.raw, span.resource
    if isinstance(span, PackedSpan):
        span = span.unpack()
    if isinstance(span, LogEvent):
        return event_bytes(span), span.resource
    return span_bytes(span), span.resource


def _resource_field(resource: Attributes) -> bytes:
    """The `resource` field of a ResourceSpans (ResourceLogs): a length-delimited protobuf field."""
    payload = resource_bytes(resource)
    return b"".join((_TAGS[_RESOURCE], _varint(len(payload)), payload))


def item_bytes(span: AnySpan) -> bytes:
    """The wire bytes of one span (an OTLP `Span`) or event (a `LogRecord`), as `encode` writes them."""
    return _item(span)[0]


def _value(items: Sequence[tuple[bytes, Attributes]], resources: dict[int, bytes]) -> bytes:
    """A request message of `items`, one ResourceSpans (ResourceLogs) per distinct resource."""
    by_resource: dict[int, list[bytes]] = {}
    for raw, resource in items:
        by_resource.setdefault(id(resource), []).append(raw)
    # the pieces of the whole message, joined once: each item's bytes are copied once, not once
    # per level of framing
    pieces: list[bytes] = []
    scope_tag, item_tag = _TAGS[_SCOPE_ITEMS], _TAGS[_ITEMS]
    request_tag = _TAGS[_REQUEST_ITEMS]
    for resource_id, raws in by_resource.items():
        head = len(pieces)
        pieces += (request_tag, b"", resources[resource_id], scope_tag, b"")
        scope_size = 0
        for raw in raws:
            size = _varint(len(raw))
            pieces += (item_tag, size, raw)
            scope_size += 1 + len(size) + len(raw)
        scope_size_bytes = _varint(scope_size)
        pieces[head + 4] = scope_size_bytes
        pieces[head + 1] = _varint(len(resources[resource_id]) + 1 + len(scope_size_bytes) + scope_size)
    return b"".join(pieces)


def encode(spans: Sequence[AnySpan], max_bytes: int) -> list[SpanRecord]:
    """The records that carry `spans` (spans and log events, any mix of traces and tenants).

    Raises `PayloadTooLarge` when one span or event alone is over `max_bytes`."""
    groups: dict[tuple[str, str, bool], list[tuple[bytes, Attributes]]] = {}
    resources: dict[int, bytes] = {}
    for span in spans:
        raw, resource = _item(span)
        if len(raw) > max_bytes - 512:  # room for the framing and the resource's attributes
            raise PayloadTooLarge(
                f"a span of trace {span.trace_id} is {len(raw)} bytes, over the {max_bytes}-byte record limit"
            )
        if id(resource) not in resources:
            resources[id(resource)] = _resource_field(resource)
        groups.setdefault((span.tenant, span.trace_id, isinstance(span, LogEvent)), []).append(
            (raw, resource)
        )
    records: list[SpanRecord] = []
    for (tenant, trace_id, logs), items in groups.items():
        headers = (
            ("ragmon-format", FORMAT),
            ("ragmon-kind", _LOGS if logs else _SPANS),
            ("ragmon-tenant", tenant.encode()),
        )
        chunk: list[tuple[bytes, Attributes]] = []
        size = 0
        for raw, resource in items:
            # each item costs its bytes, a few bytes of framing and, at worst, its own resource
            cost = len(raw) + 16 + len(resources[id(resource)])
            if chunk and size + cost > max_bytes:
                records.append(SpanRecord(trace_id.encode(), _value(chunk, resources), headers))
                chunk, size = [], 0
            chunk.append((raw, resource))
            size += cost
        records.append(SpanRecord(trace_id.encode(), _value(chunk, resources), headers))
    return records


def encode_traces(groups: Sequence[Sequence[AnySpan]]) -> list[tuple[bytes, bytes]]:
    """(the spans' record value, the events' record value) of each group: what `encode` with no
    limit gives for the group's trace, b"" where it has none. A group holds one trace's items, and
    no two groups the same trace; otherwise this is `encode`'s records joined per group's first
    item, as the span archive reads them (service/ingest/span_codec.py)."""
    resources: dict[int, bytes] = {}
    out: list[tuple[bytes, bytes]] = []
    seen: set[tuple[str, str]] = set()
    for items in groups:
        if not items:
            out.append((b"", b""))
            continue
        tenant, trace_id = items[0].tenant, items[0].trace_id
        spans: list[tuple[bytes, Attributes]] = []
        events: list[tuple[bytes, Attributes]] = []
        for item in items:
            if item.tenant != tenant or item.trace_id != trace_id:
                return _encode_joined(groups)
            raw, resource = _item(item)
            if id(resource) not in resources:
                resources[id(resource)] = _resource_field(resource)
            (events if isinstance(item, LogEvent) else spans).append((raw, resource))
        if (tenant, trace_id) in seen:
            return _encode_joined(groups)
        seen.add((tenant, trace_id))
        out.append((_value(spans, resources) if spans else b"", _value(events, resources) if events else b""))
    return out


def _encode_joined(groups: Sequence[Sequence[AnySpan]]) -> list[tuple[bytes, bytes]]:
    """`encode_traces` of groups that mix traces or repeat one: `encode`'s records, joined per
    group's first item."""
    parts: dict[tuple[str, str], tuple[list[bytes], list[bytes]]] = {}
    for record in encode([item for items in groups for item in items], _NO_LIMIT):
        headers = dict(record.headers)
        spans, events = parts.setdefault((headers["ragmon-tenant"].decode(), record.key.decode()), ([], []))
        (events if headers["ragmon-kind"] == _LOGS else spans).append(record.value)
    out = []
    for items in groups:
        spans, events = parts.get((items[0].tenant, items[0].trace_id), ([], [])) if items else ([], [])
        out.append((b"".join(spans), b"".join(events)))
    return out


def decode(value: bytes, headers: Sequence[tuple[str, bytes]]) -> list[AnySpan]:
    """The spans (`WireSpan`) or events (`LogEvent`) of one record; raises `DecodeError` for a
    record that is not in this format."""
    fields = dict(headers)
    if fields.get("ragmon-format") != FORMAT:
        raise DecodeError(f"spans record of unknown format {fields.get('ragmon-format')!r}")
    try:
        tenant = fields["ragmon-tenant"].decode()
    except (KeyError, UnicodeDecodeError) as exc:
        raise DecodeError("spans record without a valid tenant header") from exc
    kind = fields.get("ragmon-kind")
    if kind == _SPANS:
        return list(otlp_protobuf.screen_protobuf(value, tenant).spans)
    if kind == _LOGS:
        return list(otlp_logs.decode_protobuf(value, tenant).log_events)
    raise DecodeError(f"spans record of unknown kind {kind!r}")
