"""OTLP protobuf traces (HTTP and gRPC): screening a request on its path, and building its spans later.

Separate from `otlp.py`, whose rules it applies, and from `otlp_json.py`:
protobuf is read its own way, straight from the wire where the generated
classes are slow (all-double vectors; each span's bytes sliced from the body
by `protobuf_wire.py`), and in two steps.

On the request's path, `screen_protobuf` applies every rule that rejects a
span (ids, times, and the vectors of spans that carry one) and keeps each
accepted span as its wire bytes, a `WireSpan`; converting the attributes was
~70 % of decoding, and it waits until the trace is built (`span_from_wire`, in
a builder process, which parses the span with `lazy_arrays.LazySpan`: array
values stay serialized until read, and an embedding vector is read in one
numpy call instead of a message for each number). Two kinds of span are
decoded at screening all the same (`_repaired`): one over `MAX_SPAN_BYTES`
(its size is known), and one whose bytes may hold a number out of range
(`value_scan.py`: one regular expression over the body, ~4 us a trace).
Their dropped and cut values are counted in the answer, and the span travels
re-encoded without them, so the builder counts nothing twice; so the answer
names every number out of range
(`partial_success` with 0 rejected spans and a message is OTLP's warning).
What the scan cannot see (a count sent as the text "many", a key's index) is
dropped and counted when the trace is built, and logged there.
`decode_protobuf` does both steps at once. OTLP/JSON is decoded in one step
and its answer reports everything.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError as ProtobufDecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from service.conventions.attributes import EMBEDDING_MODEL_KEYS, VECTOR_KEY_SUFFIX
from service.conventions.spans import Attributes, AttrValue, Span, SpanEvent, WireSpan
from service.errors import DecodeError
from service.ingest.decoded import DROPPED_KEY, DecodedBatch, mark
from service.ingest.lazy_arrays import NESTED_VALUES, LazySpan, SpanArrays, WireKeyValues, span_key_values
from service.ingest.otlp import (
    ENTRY_OVERHEAD,
    EVENT_OVERHEAD,
    LIST_SLOT,
    MAX_COUNT,
    MAX_IDENTIFIER_CHARS,
    MAX_KEY_CHARS,
    MAX_NAME_CHARS,
    MAX_TIME_NS,
    MAX_VECTOR_LENGTH,
    NUMBER_SIZE,
    SPAN_OVERHEAD,
    STR_OVERHEAD,
    InvalidValue,
    VectorDims,
    add_checked,
    check_dims,
    check_interval,
    check_name,
    check_tenant,
    check_vector,
    drop_long_key,
    kind_of,
    resource_too_large,
    time_too_late,
)
from service.ingest.otlp_encode import span_bytes
from service.ingest.protobuf_wire import WireError, span_slices
from service.ingest.span_size import MAX_SPAN_BYTES, fit_span
from service.ingest.value_scan import suspect_values
from service.labels import RejectReason

__all__ = [
    "decode_protobuf",
    "decode_request",
    "pb_attributes",
    "pb_value",
    "screen_protobuf",
    "screen_request",
    "span_from_wire",
]

_WIRE_DOUBLE_ITEM = 11
# A key is stored verbatim in a span's wire bytes: a span without this in them has no vector.
_VECTOR_KEY_MARK = VECTOR_KEY_SUFFIX.encode()
_PB_SCALARS = frozenset({"string_value", "int_value", "double_value", "bool_value", "bytes_value"})


def pb_value(value: AnyValue) -> AttrValue:
    """A parsed AnyValue as an attribute value: one of the real classes, or of `lazy_arrays` where the
    real parser would hold the same (`SpanArrays`), its arrays serialized."""
    which = value.WhichOneof("value")
    if which in _PB_SCALARS:
        scalar: AttrValue = getattr(value, which)
        return scalar
    if which == "array_value":
        return _pb_array(value.array_value)
    if which == "kvlist_value":
        return {kv.key: pb_value(kv.value) for kv in value.kvlist_value.values}
    return None


def _pb_array(array: ArrayValue | bytes) -> list[AttrValue]:
    """An ArrayValue's items (given parsed, or serialized); all-double arrays (embedding vectors) are
    read straight from the wire.

    Touching each of 1,536 AnyValue messages from Python costs about 2 us apiece.
    An all-double array has a fixed wire layout, 11 bytes per item (tag 0x0a, length 9,
    tag 0x21, 8 little-endian bytes), so numpy can slice the doubles out in one step.
    """
    serialized = array if isinstance(array, bytes) else array.SerializeToString()
    doubles = _wire_doubles(serialized)
    if doubles is not None and doubles.size:
        values: list[AttrValue] = doubles.tolist()
        return values
    items = ArrayValue.FromString(array).values if isinstance(array, bytes) else array.values
    return [pb_value(item) for item in items]


def _double_items(raw: bytes) -> int | None:
    """How many numbers a serialized ArrayValue holds when it holds only doubles, each in the fixed
    11-byte layout; None for any other array."""
    n, rest = divmod(len(raw), _WIRE_DOUBLE_ITEM)
    if rest:
        return None
    tag, length, double_tag = _double_heads(n)
    step = _WIRE_DOUBLE_ITEM
    if raw[0::step] != tag or raw[1::step] != length or raw[2::step] != double_tag:
        return None
    return n


@functools.lru_cache(maxsize=32)
def _double_heads(n: int) -> tuple[bytes, bytes, bytes]:
    """The three header bytes of `n` double items, each repeated `n` times (made once a length:
    a request's vectors are all one length)."""
    return b"\x0a" * n, b"\x09" * n, b"\x21" * n


def _wire_doubles(raw: bytes) -> np.ndarray[Any, np.dtype[np.float64]] | None:
    """The numbers of a serialized ArrayValue that holds only doubles; None for any other array."""
    n = _double_items(raw)
    if n is None:
        return None
    if not n:  # the view below would start past the end
        return np.empty(0)
    # a strided view of the wire bytes: one numpy call where slicing, copying and viewing were five
    return np.ndarray((n,), dtype="<f8", buffer=raw, offset=3, strides=(_WIRE_DOUBLE_ITEM,))


def _may_hold_non_finite(raw: bytes) -> bool:
    """False when no double of an all-double serialized ArrayValue (`_double_items`) is NaN or
    infinite, read from one byte of each: the top byte of a little-endian double (its item's
    last) is 0x7f or 0xff for every NaN and infinity, and only for finite numbers above 2**1008
    in size, which then take the exact check."""
    tops = raw[_WIRE_DOUBLE_ITEM - 1 :: _WIRE_DOUBLE_ITEM]
    return b"\x7f" in tops or b"\xff" in tops


# Screening (which parses with the real classes) slices vectors this long or longer from their span's
# bytes and re-encodes shorter ones: the walk to a vector costs ~7 us whatever its length,
# re-encoding ~0.02 us a number (bench/ingest/vector_wire.py: 256 numbers re-encode faster than they
# are found, 1,536 do not; session 36 found the two level at 256, so 128 or 1 gained nothing).
WIRE_SLICE_MIN_ITEMS = 512


def pb_attributes(
    pairs: Sequence[KeyValue],
    batch: DecodedBatch,
    where: str,
    dims: set[int] | None,
    arrays: SpanArrays | None = None,
    event: int = -1,
) -> tuple[Attributes, int]:
    """`finish_attributes` over protobuf KeyValues, with the common cases read inline: a string
    value of a key that needs no check, a double score, an integer count, an all-double vector.

    A span carries dozens of attributes, and the calls per attribute were most of converting
    them. Each inline case keeps exactly the value, and adds exactly the size, that the general
    path (`add_checked`) would; any other value takes that path. `arrays`: where `pairs` are
    the attributes of a span parsed with `LazySpan` (`event` -1) or of its event `event`, what
    their array and map values are read through; None: `pairs` are the real classes'."""
    attributes: Attributes = {}
    size = 0
    for index, kv in enumerate(pairs):
        key, any_value = kv.key, kv.value
        if len(key) > MAX_KEY_CHARS:
            drop_long_key(key, batch, where)
            continue
        kind = kind_of(key)
        if kind is None or kind == "identifier":
            # `string_value` reads "" for any other type: only an empty text needs the type asked
            text = any_value.string_value
            if (text or any_value.WhichOneof("value") == "string_value") and (
                kind is None or len(text) <= MAX_IDENTIFIER_CHARS
            ):
                attributes[key] = text
                size += ENTRY_OVERHEAD + len(key) + STR_OVERHEAD + len(text)
                continue
        elif kind == "number":
            if any_value.WhichOneof("value") == "double_value":
                number = any_value.double_value
                if math.isfinite(number):
                    attributes[key] = number
                    size += ENTRY_OVERHEAD + len(key) + NUMBER_SIZE
                    continue
        elif kind == "count":
            if any_value.WhichOneof("value") == "int_value":
                count = any_value.int_value
                if 0 <= count <= MAX_COUNT:
                    attributes[key] = count
                    size += ENTRY_OVERHEAD + len(key) + NUMBER_SIZE
                    continue
        elif kind == "vector" and dims is not None and any_value.WhichOneof("value") == "array_value":
            doubles = _wire_doubles(
                arrays.array(event, index, any_value)
                if arrays is not None
                else any_value.array_value.SerializeToString()
            )
            if doubles is not None and 0 < doubles.size <= MAX_VECTOR_LENGTH:
                numbers = doubles.tolist()
                # a finite sum means no NaN or infinity (an overflowing sum takes the general path)
                if math.isfinite(sum(numbers)):
                    dims.add(len(numbers))
                    attributes[key] = numbers
                    size += (
                        ENTRY_OVERHEAD + len(key) + ENTRY_OVERHEAD + len(numbers) * (LIST_SLOT + NUMBER_SIZE)
                    )
                    continue
        if arrays is not None and any_value.WhichOneof("value") in NESTED_VALUES:
            any_value = arrays.value(event, index, any_value)
        size += add_checked(attributes, key, pb_value(any_value), kind, batch, where, dims)
    return attributes, size


def _checked_ids(span: PbSpan, where: str) -> tuple[bytes, bytes, bytes]:
    """The span's trace, span and parent ids; raises `InvalidValue` for bad ids, times or names."""
    raw_trace, raw_span, raw_parent = span.trace_id, span.span_id, span.parent_span_id
    if len(raw_trace) != 16 or not any(raw_trace):
        raise InvalidValue(
            RejectReason.INVALID_TRACE_ID, f"{where}: trace id {raw_trace.hex()!r} is not 16 non-zero bytes"
        )
    if len(raw_span) != 8 or not any(raw_span):
        raise InvalidValue(
            RejectReason.INVALID_SPAN_ID, f"{where}: span id {raw_span.hex()!r} is not 8 non-zero bytes"
        )
    if raw_parent and len(raw_parent) != 8:
        raise InvalidValue(
            RejectReason.INVALID_PARENT_SPAN_ID,
            f"{where}: parent span id {raw_parent.hex()!r} is not 8 bytes",
        )
    start, end = span.start_time_unix_nano, span.end_time_unix_nano
    if start == 0 or end < start or end > MAX_TIME_NS:  # inline: this runs for every span on the request path
        check_interval(start, end, where)
    if len(span.name) > MAX_NAME_CHARS:
        check_name(span.name, where)
    events = span.events
    if events:  # iterating an empty repeated field costs 3x asking its length
        for event in events:
            if event.time_unix_nano > MAX_TIME_NS:
                raise time_too_late(f"event {event.name!r:.40}", event.time_unix_nano, where)
            check_name(event.name, where)
    return raw_trace, raw_span, raw_parent


def _screen_span(
    span: PbSpan,
    raw: bytes | None,
    resource: Attributes,
    tenant: str,
    dims: VectorDims,
    where: str,
    batch: DecodedBatch,
    scan: bool,
) -> WireSpan:
    """Apply every rule that rejects a span, and keep the span as its wire bytes (`raw`, when
    the caller has them, else re-encoded).

    Only a span whose bytes contain an embedding-vector key has its vectors
    read here (NaN vectors and dimensions reject the span). A span over
    `MAX_SPAN_BYTES`, or (with `scan`) one whose bytes may hold a number out of
    range (`value_scan.py`), is decoded here too (`_repaired`); any other
    wrong-typed attribute value is dropped and counted later, by `span_from_wire`.
    """
    raw_trace, _, raw_parent = _checked_ids(span, where)
    if raw is None:
        raw = span.SerializeToString()
    # What the decoded span will weigh (see `value_size`): its wire bytes widened to Python objects, plus
    # a dict entry per attribute; within 2x of the decoded estimate for strings and numbers.
    size = SPAN_OVERHEAD + 2 * len(raw) + (ENTRY_OVERHEAD + STR_OVERHEAD) * len(span.attributes)
    if _VECTOR_KEY_MARK in raw:
        vector_size = _screen_vectors(span, raw, dims, where)
        # a vector's 11 wire bytes a number become ~40 in Python (see `value_size`)
        size += vector_size * (LIST_SLOT + NUMBER_SIZE)
    parent = raw_parent.hex() if any(raw_parent) else None
    wire = WireSpan(tenant, raw_trace.hex(), parent, size, raw, resource)
    if len(raw) > MAX_SPAN_BYTES or (scan and suspect_values(raw)):
        return _repaired(wire, batch)
    return wire


def _repaired(wire: WireSpan, batch: DecodedBatch) -> WireSpan:
    """`wire` decoded now with the builder's rules, its attribute values out of range dropped and
    counted in `batch` (so the answer names them), cut to fit `MAX_SPAN_BYTES` when it is over, and
    re-encoded when that changed it: the builder then finds nothing left to drop or cut. Raises
    `InvalidValue` (SPAN_TOO_LARGE) when it cannot fit; nothing of it is counted then but the rejection."""
    scratch = DecodedBatch()
    span = span_from_wire(wire, scratch)
    where = f"span {wire.trace_id}/{span.span_id}"
    if len(wire.raw) > MAX_SPAN_BYTES and fit_span(span, scratch, where) is None:
        raise InvalidValue(
            RejectReason.SPAN_TOO_LARGE,
            f"{where} of {len(wire.raw):,} bytes does not fit the {MAX_SPAN_BYTES:,}-byte limit "
            "even with its text truncated",
        )
    batch.absorb(scratch)
    if not scratch.rejections and not scratch.truncated:
        return wire
    raw = span_bytes(span)
    # the decoded estimate, less what was cut (a cut text's bytes are about its characters)
    size = max(SPAN_OVERHEAD + len(raw), span.size_bytes - max(0, len(wire.raw) - len(raw)))
    return wire._replace(raw=raw, size_bytes=size)


def _screen_vectors(span: PbSpan, raw: bytes, dims: VectorDims, where: str) -> int:
    """Check the span's embedding vectors as `span_from_wire` would, without converting them: raises
    `InvalidValue` for a non-finite number or a length mismatch; returns the numbers they hold.

    A vector that is not a list of numbers is left alone: it is an attribute value that
    `span_from_wire` drops and counts."""
    lengths: set[int] = set()
    numbers = 0
    models: Attributes = {}
    wire = span_key_values(raw, len(span.attributes))
    for index, kv in enumerate(span.attributes):
        key = kv.key
        if len(key) <= MAX_KEY_CHARS and kind_of(key) == "vector":
            length = _screened_vector_length(key, kv.value, wire, index)
            if length is not None:
                lengths.add(length)
                numbers += length
        elif key in EMBEDDING_MODEL_KEYS and kv.value.WhichOneof("value") == "string_value":
            models[key] = kv.value.string_value
    check_dims(models, lengths, dims, where)
    return numbers


def _screened_vector_length(key: str, value: AnyValue, wire: WireKeyValues, index: int) -> int | None:
    """The length of a usable vector (attribute `index` of a parsed span, its value `value`; `wire`:
    the span's bytes); None for one `check_vector` would drop; raises `InvalidValue` (NAN_VECTOR)
    where it would reject the span."""
    if value.WhichOneof("value") != "array_value":
        return None
    items = len(value.array_value.values)
    if items > MAX_VECTOR_LENGTH:
        return None
    serialized = wire.array(index) if items >= WIRE_SLICE_MIN_ITEMS else value.array_value.SerializeToString()
    n = _double_items(serialized)
    if n is not None:  # the usual case: all doubles, checked a byte each
        if not n:
            return None
        if _may_hold_non_finite(serialized):
            doubles = _wire_doubles(serialized)
            assert doubles is not None
            finite = np.isfinite(doubles)
            if not finite.all():
                raise InvalidValue(RejectReason.NAN_VECTOR, f"{key} holds {float(doubles[~finite][0])}")
        return n
    try:
        return len(check_vector(key, _pb_array(value.array_value)))
    except InvalidValue as problem:
        if problem.reason is RejectReason.INVALID_ATTRIBUTE:
            return None
        raise


def span_from_wire(wire: WireSpan, problems: DecodedBatch) -> Span:
    """The `Span` a screened protobuf span decodes to; attribute values that cannot be used are
    dropped and counted in `problems` (as `invalid_attribute`)."""
    raw = wire.raw
    span = LazySpan.FromString(raw)
    span_id = span.span_id.hex()
    where = f"span {wire.trace_id}/{span_id}"
    # Screened already (`_screen_span`): its ids, times and names passed `_checked_ids`, and the
    # trace and parent ids are the screen's hex of the same bytes. Nothing here rejects the span;
    # vectors were compared within its request.
    vector_dims: set[int] = set()
    dropped_from = len(problems.dropped_keys)
    arrays = SpanArrays(span, raw)
    attributes, size = pb_attributes(span.attributes, problems, where, vector_dims, arrays)
    events: list[SpanEvent] = []
    if span.events:  # iterating an empty repeated field costs 3x asking its length
        for index, event in enumerate(span.events):
            event_attributes, event_size = pb_attributes(
                event.attributes, problems, where, None, arrays, index
            )
            events.append(SpanEvent(event.name, event.time_unix_nano, event_attributes))
            size += EVENT_OVERHEAD + len(event.name) + event_size
    check_dims(attributes, vector_dims, VectorDims(), where)
    if len(problems.dropped_keys) > dropped_from:  # the span says what it lost (`decoded.DROPPED_KEY`)
        mark(attributes, DROPPED_KEY, problems.dropped_keys[dropped_from:])
        del problems.dropped_keys[dropped_from:]
    name = span.name
    return Span(
        wire.trace_id,
        span_id,
        wire.parent_span_id,
        name,
        span.start_time_unix_nano,
        span.end_time_unix_nano,
        attributes,
        events,
        wire.resource,
        span.kind,
        span.status.code,
        wire.tenant,
        SPAN_OVERHEAD + len(name) + size,
    )


def screen_request(
    msg: ExportTraceServiceRequest, tenant: str, raw_spans: list[bytes] | None = None, scan: bool = True
) -> DecodedBatch:
    """Screen an already-parsed request: its accepted spans come back as `WireSpan`s.

    `raw_spans`, when given, are the request's spans as sliced from its body
    (`protobuf_wire.span_slices`), one per span in order; without them each
    span is re-encoded. Rejected spans are counted as `decode_request` counts
    them; so are dropped attribute values of the spans `_screen_span` decodes
    (the rest are counted when `span_from_wire` decodes the span). `scan`
    False says that no span holds a number out of range (`value_scan`: the
    caller scanned the whole body)."""
    if not isinstance(msg, ExportTraceServiceRequest):
        raise TypeError(f"expected ExportTraceServiceRequest, got {type(msg).__name__}")
    check_tenant(tenant)
    batch = DecodedBatch()
    dims = VectorDims()
    raws = iter(raw_spans) if raw_spans is not None else None
    for r, resource_spans in enumerate(msg.resource_spans):
        resource, _ = pb_attributes(resource_spans.resource.attributes, batch, f"resource {r}", None)
        batch.dropped_keys.clear()  # a resource is not marked: what it lost is counted and logged
        too_large = resource_too_large(resource, resource_spans.resource.ByteSize(), batch, r)
        for s, scope_spans in enumerate(resource_spans.scope_spans):
            for i, span in enumerate(scope_spans.spans):
                where = f"resourceSpans[{r}].scopeSpans[{s}].spans[{i}]"
                raw = next(raws) if raws is not None else None
                try:
                    if too_large is not None:
                        raise InvalidValue(RejectReason.SPAN_TOO_LARGE, f"{where}: {too_large}")
                    batch.spans.append(_screen_span(span, raw, resource, tenant, dims, where, batch, scan))
                except InvalidValue as problem:
                    batch._reject(problem.reason, problem.detail)
    return batch


def decode_request(msg: ExportTraceServiceRequest, tenant: str) -> DecodedBatch:
    """Decode an already-parsed request into `Span`s; never raises for per-span problems.

    The same two steps as ingest, done at once: `screen_request`, then `span_from_wire`."""
    batch = screen_request(msg, tenant)
    batch.spans = [
        span_from_wire(span, batch) if isinstance(span, WireSpan) else span for span in batch.spans
    ]
    return batch


def _wire_bytes(body: bytes) -> bytes:
    """`body` as bytes, copied only when it is a bytearray or memoryview."""
    if not isinstance(body, bytes | bytearray | memoryview):
        raise TypeError(f"body must be bytes, got {type(body).__name__}")
    return bytes(body)


def _parsed(body: bytes) -> ExportTraceServiceRequest:
    try:
        request: ExportTraceServiceRequest = ExportTraceServiceRequest.FromString(body)
    except ProtobufDecodeError as exc:
        raise DecodeError(f"body is not a valid OTLP ExportTraceServiceRequest protobuf: {exc}") from exc
    return request


def screen_protobuf(body: bytes, tenant: str) -> DecodedBatch:
    """Screen an OTLP/HTTP protobuf body (`screen_request`), each span's bytes sliced from the body;
    raises `DecodeError` when it is not a valid request."""
    body = _wire_bytes(body)
    request = _parsed(body)
    try:
        raw_spans: list[bytes] | None = span_slices(body)
    except WireError:
        raw_spans = None  # parsed, yet not walked (unusual encodings): re-encode each span
    if raw_spans is not None and len(raw_spans) != sum(
        len(scope.spans) for resource in request.resource_spans for scope in resource.scope_spans
    ):
        raw_spans = None
    # one scan of the body: in the usual request nothing matches, and no span is scanned on its own
    return screen_request(request, tenant, raw_spans, scan=suspect_values(body))


def decode_protobuf(body: bytes, tenant: str) -> DecodedBatch:
    """Decode an OTLP/HTTP protobuf body into `Span`s; raises `DecodeError` when it is not a valid
    request."""
    return decode_request(_parsed(_wire_bytes(body)), tenant)
