"""Decoded spans, log events and resources back to OTLP protobuf bytes.

Two users: the spans topic carries decoded spans (OTLP/JSON, log events) as
protobuf (`span_records.py`), and screening re-encodes a protobuf span it had
to change (a value dropped or truncated: `span_size.py`, `otlp.py`) so that the
builder reads the changed span. An encoded span keeps everything a `Span`
holds, which is everything `semconv` reads; what a `Span` does not hold
(links, trace state, status message) is not kept.
"""

from __future__ import annotations

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from service.conventions.spans import Attributes, AttrValue, LogEvent, Span

__all__ = ["any_value", "event_bytes", "key_values", "resource_bytes", "span_bytes"]


def any_value(value: AttrValue) -> AnyValue:
    """The OTLP AnyValue of an attribute value as `otlp` decodes it (bool before int: bool is an int)."""
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    out = AnyValue()
    if isinstance(value, list):
        out.array_value.values.extend(any_value(item) for item in value)
    elif isinstance(value, dict):
        out.kvlist_value.values.extend(KeyValue(key=k, value=any_value(v)) for k, v in value.items())
    return out  # None: an empty AnyValue, which decodes to None


def key_values(attributes: Attributes) -> list[KeyValue]:
    return [KeyValue(key=key, value=any_value(value)) for key, value in attributes.items()]


def span_bytes(span: Span) -> bytes:
    """The wire bytes of a `Span` message holding what `span` holds."""
    pb = PbSpan(
        trace_id=bytes.fromhex(span.trace_id),
        span_id=bytes.fromhex(span.span_id),
        parent_span_id=bytes.fromhex(span.parent_span_id) if span.parent_span_id else b"",
        name=span.name,
        kind=span.kind,  # type: ignore[arg-type]
        start_time_unix_nano=span.start_ns,
        end_time_unix_nano=span.end_ns,
        attributes=key_values(span.attributes),
        status=Status(code=span.status_code),  # type: ignore[arg-type]
    )
    for event in span.events:
        pb.events.add(name=event.name, time_unix_nano=event.time_ns, attributes=key_values(event.attributes))
    raw: bytes = pb.SerializeToString()
    return raw


def event_bytes(event: LogEvent) -> bytes:
    """The wire bytes of a `LogRecord` holding what `event` holds."""
    record = LogRecord(
        time_unix_nano=event.time_ns,
        trace_id=bytes.fromhex(event.trace_id),
        span_id=bytes.fromhex(event.span_id),
        event_name=event.name,
        attributes=key_values(event.attributes),  # the body's fields were merged in at decode
    )
    raw: bytes = record.SerializeToString()
    return raw


def resource_bytes(resource: Attributes) -> bytes:
    """The wire bytes of a `Resource` message with these attributes."""
    raw: bytes = Resource(attributes=key_values(resource)).SerializeToString()
    return raw
