"""The serialized spans of an OTLP protobuf body, found by walking its wire format.

Screening (service/ingest/otlp_protobuf.py) hands every accepted span on as its own bytes, to
be decoded when its trace is built. Re-encoding each parsed span for that was
a quarter of screening's CPU; the bytes are already in the body. This walks
the three levels of length-delimited fields that lead to them:

    ExportTraceServiceRequest.resource_spans (1)
      -> ResourceSpans.scope_spans (2)
        -> ScopeSpans.spans (2)

A span's bytes sliced from the body parse to the same `Span` message as its
re-encoding (repeated message fields keep their wire order, which is the
order the parsed request lists them in). The walk reads only tags and
lengths, never field contents; anything it does not expect (a group, a
length past the end) makes it give up, and the caller re-encodes instead.

The same walk finds an array value's bytes in a span or one of its events
(`field_ranges`, `array_bytes`): ragmon builds spans with classes that keep
arrays serialized (`lazy_arrays.py`), and where a span's bytes do not re-encode
as they came, an array is read from them, where the walk can tell that it was
given once; the walk skips the message's other fields by their lengths (a few
microseconds whatever their size).
"""

from __future__ import annotations

# protobuf wire types (https://protobuf.dev/programming-guides/encoding/#structure)
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_REQUEST_RESOURCE_SPANS_FIELD = 1
_RESOURCE_SCOPE_SPANS_FIELD = 2
_SCOPE_SPANS_FIELD = 2
# Span.attributes = 9, Span.events = 11, Span.Event.attributes = 3, KeyValue.value = 2,
# AnyValue.array_value = 5
SPAN_ATTRIBUTES_FIELD, SPAN_EVENTS_FIELD, EVENT_ATTRIBUTES_FIELD = 9, 11, 3
_KEY_VALUE_VALUE_FIELD = 2
_ANY_VALUE_ARRAY_FIELD = 5


class WireError(ValueError):
    """The bytes are not the protobuf message the walk expects."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("varint longer than 10 bytes")


def field_ranges(buf: bytes, start: int, end: int, number: int) -> list[tuple[int, int]]:
    """The (start, end) offsets of every length-delimited field `number` in the message that
    occupies buf[start:end], in wire order; raises `WireError` when the message does not walk."""
    found: list[tuple[int, int]] = []
    pos = start
    try:
        while pos < end:
            tag = buf[pos]
            if tag < 0x80:
                pos += 1
            else:
                tag, pos = _varint(buf, pos)
            wire_type = tag & 7
            if wire_type == _LEN:
                length = buf[pos]
                if length < 0x80:
                    pos += 1
                else:
                    length, pos = _varint(buf, pos)
                if tag >> 3 == number:
                    found.append((pos, pos + length))
                pos += length
            elif wire_type == _VARINT:
                _, pos = _varint(buf, pos)
            elif wire_type == _I64:
                pos += 8
            elif wire_type == _I32:
                pos += 4
            else:
                raise WireError(f"wire type {wire_type} (groups are not used by OTLP)")
    except IndexError:
        raise WireError("a field runs past the end of its message") from None
    if pos != end:
        raise WireError("a field runs past the end of its message")
    return found


def span_slices(body: bytes) -> list[bytes]:
    """The bytes of every span in a serialized ExportTraceServiceRequest, in the order the parsed
    request lists them; raises `WireError` when the body does not walk."""
    return [
        body[start:end]
        for resource in field_ranges(body, 0, len(body), _REQUEST_RESOURCE_SPANS_FIELD)
        for scope in field_ranges(body, *resource, _RESOURCE_SCOPE_SPANS_FIELD)
        for start, end in field_ranges(body, *scope, _SCOPE_SPANS_FIELD)
    ]


def attribute_ranges(message: bytes, field: int = SPAN_ATTRIBUTES_FIELD) -> list[tuple[int, int]]:
    """The (start, end) offsets of each attribute (`KeyValue`) of a serialized message whose
    attributes are field `field` (a Span's 9, a Span.Event's 3), in the order the parsed message
    lists them; raises `WireError` when the message does not walk."""
    return field_ranges(message, 0, len(message), field)


def array_bytes(buf: bytes, key_value: tuple[int, int]) -> bytes | None:
    """The serialized `ArrayValue` of the KeyValue at `buf[start:end]` (from `attribute_ranges`), for
    a value the parser reads as an array; None where the bytes would not be what it holds: a
    value or array field given more than once (the parser merges them) or none, or a walk that fails.
    """
    try:
        values = field_ranges(buf, *key_value, _KEY_VALUE_VALUE_FIELD)
        if len(values) != 1:
            return None
        arrays = field_ranges(buf, *values[0], _ANY_VALUE_ARRAY_FIELD)
    except WireError:
        return None
    if len(arrays) != 1:
        return None
    start, end = arrays[0]
    return buf[start:end]
