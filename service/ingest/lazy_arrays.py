"""OTLP spans parsed with their array values left serialized (`LazySpan`), for building traces, and
those values read as the real classes read them (`SpanArrays`).

The classes generated from opentelemetry-proto build one `AnyValue` message for
every item of an `ArrayValue`. For a span that carries an embedding vector that
is most of its parse: 1,536 numbers cost ~60 us to parse, though ragmon reads
such a vector from its serialized form in one numpy call
(`otlp_protobuf._wire_doubles`). `LazySpan` comes from the same descriptors (the
installed opentelemetry-proto's) with one change: the `array_value` member of
the `AnyValue.value` oneof is a `bytes` field, so parsing copies an array's
bytes and reads none of its items (6.6 us for that span). Everything else
parses as before: which member of the oneof is set (the last one given, in
both), texts, numbers, booleans, bytes.

Two things the real classes do that these do not, and how `otlp_protobuf`
keeps to the real classes' result:

* Validation. Parsing does not look inside an array, so an invalid one (a text
  that is not UTF-8, a truncated item) is not refused. Only screened spans are
  parsed with `LazySpan` (`span_from_wire`): their bytes were parsed whole by
  the real classes when their request was screened, so every slice of them
  parses.
* Merging. The real parser merges an array field given twice in one
  `AnyValue` (the items of both); here the last one wins, and a map value
  (`kvlist_value`) may hold such arrays. So `SpanArrays` reads an array or a
  map value from a `LazySpan` only where the span re-encodes to the very bytes
  it came in (no field was given twice); otherwise from the span's bytes
  (`WireKeyValues`: `protobuf_wire.array_bytes` refuses a field given twice)
  or, failing that, through the real classes from its attribute's bytes.

Screening, which parses with the real classes, uses `WireKeyValues` too, to
slice long vectors from their span's bytes instead of re-encoding them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from service.ingest.protobuf_wire import (
    EVENT_ATTRIBUTES_FIELD,
    SPAN_ATTRIBUTES_FIELD,
    SPAN_EVENTS_FIELD,
    WireError,
    array_bytes,
    field_ranges,
)

__all__ = ["NESTED_VALUES", "LazySpan", "SpanArrays", "WireKeyValues", "span_key_values"]

# common.proto's AnyValue.array_value: the one field whose type changes
_ANY_VALUE = "AnyValue"
_ARRAY_FIELD = "array_value"


def _lazy_pool() -> descriptor_pool.DescriptorPool:
    """A descriptor pool of the OTLP trace and common files, `AnyValue.array_value` retyped as bytes."""
    pool = descriptor_pool.DescriptorPool()
    retyped = 0
    # dependencies first: a file is added after those it imports
    for module in (common_pb2, resource_pb2, trace_pb2):
        proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        if module is common_pb2:
            for message in proto.message_type:
                for field in message.field if message.name == _ANY_VALUE else ():
                    if field.name == _ARRAY_FIELD:
                        field.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
                        field.ClearField("type_name")  # still a member of the oneof
                        retyped += 1
        pool.Add(proto)
    if retyped != 1:  # a future opentelemetry-proto without that field: fail at import, not on data
        raise RuntimeError(f"opentelemetry-proto's AnyValue has {retyped} fields named {_ARRAY_FIELD!r}")
    return pool


_POOL = _lazy_pool()


def _message_class(full_name: str) -> Any:
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(full_name))


# Typed Any: the class is made at run time (the generated stubs would claim an ArrayValue where it
# holds bytes).
LazySpan: Any = _message_class(trace_pb2.Span.DESCRIPTOR.full_name)


# the values of an attribute that `LazySpan` does not hold as the real classes would
NESTED_VALUES = frozenset({"array_value", "kvlist_value"})


class WireKeyValues:
    """The array and map values of a serialized message's attributes, as the real classes read them.

    `array(index)` is the serialized ArrayValue of attribute `index` (an array): sliced from the
    message's bytes where the walk finds the field given once (`protobuf_wire.array_bytes`), else
    re-encoded from the attribute parsed by the real classes; `value(index)` is that parsed value.
    `message` is the message's bytes, or a function giving them (called once, when first needed);
    where they do not walk to `count` attributes, `canonical` gives the real classes' encoding of
    the message without the fields they do not know, which does.
    """

    __slots__ = ("_canonical", "_count", "_field", "_message", "_ranges", "_wire")

    def __init__(
        self, message: bytes | Callable[[], bytes], field: int, count: int, canonical: Callable[[], bytes]
    ) -> None:
        self._message = message
        self._field = field
        self._count = count
        self._canonical = canonical
        self._wire = b""
        self._ranges: list[tuple[int, int]] | None = None

    def _walked(self) -> list[tuple[int, int]]:
        if self._ranges is None:
            wire = self._message if isinstance(self._message, bytes) else self._message()
            ranges = _walked_to(wire, self._field, self._count)
            if ranges is None:  # an encoding the walk does not follow
                wire = self._canonical()
                ranges = field_ranges(wire, 0, len(wire), self._field)
            self._wire, self._ranges = wire, ranges
        return self._ranges

    def array(self, index: int) -> bytes:
        ranges = self._walked()
        found = array_bytes(self._wire, ranges[index])
        return found if found is not None else self.value(index).array_value.SerializeToString()

    def value(self, index: int) -> AnyValue:
        start, end = self._walked()[index]
        value: AnyValue = KeyValue.FromString(self._wire[start:end]).value
        return value


def _walked_to(message: bytes, field: int, count: int) -> list[tuple[int, int]] | None:
    """Where the `count` occurrences of field `field` are in the serialized message; None where its
    bytes do not walk, or walk to another number of them than the parser found."""
    try:
        ranges = field_ranges(message, 0, len(message), field)
    except WireError:
        return None
    return ranges if len(ranges) == count else None


def _known_fields(raw: bytes) -> Any:
    """The serialized span `raw` parsed by the real classes, without the fields they do not know (a
    group among them would stop the walk: the re-encoding keeps unknown fields as they came)."""
    span = PbSpan.FromString(raw)
    span.DiscardUnknownFields()
    return span


def span_key_values(raw: bytes, count: int) -> WireKeyValues:
    """The attributes of the serialized span `raw`, which has `count` of them."""
    return WireKeyValues(raw, SPAN_ATTRIBUTES_FIELD, count, lambda: _known_fields(raw).SerializeToString())


class SpanArrays:
    """The array and map values of a span parsed with `LazySpan`, as the real classes read them (for
    `otlp_protobuf.pb_attributes`): attribute `index` of the span (`event` -1) or of its event `event`.

    A span that re-encodes to the very bytes it came in (what a protobuf library writes) was given
    each array field once, and its lazily parsed values are the real ones; the check costs a
    serialization in C, once a span, and only for a span with such a value. Otherwise (another
    encoder's field order or explicit zeros, or a field given twice) each value is found in the
    span's bytes (`WireKeyValues`).
    """

    __slots__ = ("_exact", "_raw", "_span", "_walks")

    def __init__(self, span: Any, raw: bytes) -> None:
        self._span = span
        self._raw = raw
        self._exact: bool | None = None
        self._walks: dict[int, WireKeyValues] = {}

    def _is_exact(self) -> bool:
        if self._exact is None:
            self._exact = self._span.SerializeToString() == self._raw
        return self._exact

    def array(self, event: int, index: int, value: Any) -> bytes:
        """The serialized ArrayValue of the attribute, whose lazily parsed value is `value`."""
        if self._is_exact():
            array: bytes = value.array_value
            return array
        return self._walk(event).array(index)

    def value(self, event: int, index: int, value: Any) -> AnyValue:
        """The attribute's value for `pb_value`, whose lazily parsed value is `value`."""
        if self._is_exact():
            exact: AnyValue = value
            return exact
        return self._walk(event).value(index)

    def _walk(self, event: int) -> WireKeyValues:
        walk = self._walks.get(event)
        if walk is None:
            if event < 0:
                walk = span_key_values(self._raw, len(self._span.attributes))
            else:
                walk = _event_key_values(
                    self._raw, event, len(self._span.events), len(self._span.events[event].attributes)
                )
            self._walks[event] = walk
        return walk


def _event_key_values(span: bytes, index: int, events: int, count: int) -> WireKeyValues:
    """Event `index` of `events` in the serialized span `span`, which has `count` attributes."""

    def canonical() -> bytes:
        event: bytes = _known_fields(span).events[index].SerializeToString()
        return event

    def event() -> bytes:
        ranges = _walked_to(span, SPAN_EVENTS_FIELD, events)
        if ranges is None:
            return canonical()
        start, end = ranges[index]
        return span[start:end]

    return WireKeyValues(event, EVENT_ATTRIBUTES_FIELD, count, canonical)
