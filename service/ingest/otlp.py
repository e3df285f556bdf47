"""OTLP trace decoding: an `ExportTraceServiceRequest` (protobuf, OTLP/JSON or parsed gRPC) -> `Span`s.

The entry points return a `DecodedBatch` and share one set of rules:

* A body that cannot be read at all (malformed protobuf, malformed JSON,
  invalid UTF-8, wrong types down to the `spans` lists) raises
  `service.errors.DecodeError`. Nothing of it is kept.
* A span that breaks the rules below is rejected alone; the good spans of the
  same request are kept. Each rejection is counted under one `RejectReason`
  (the first rule it breaks), and `error_message` summarises them for the
  OTLP `partial_success` answer.

  ===========================  ================================================
  reason                       the span is rejected when
  ===========================  ================================================
  invalid_trace_id             trace id is not 16 bytes, or all zero
  invalid_span_id              span id is not 8 bytes, or all zero
  invalid_parent_span_id       parent span id is set but not 8 bytes
  invalid_time                 start is 0 or missing, end < start, or the end
                               or an event's time is after `MAX_TIME_NS`;
                               (JSON) a time is not an integer, or an event's
                               time is negative
  nan_vector                   an embedding vector holds NaN or +-infinity
  vector_dimension_mismatch    its vectors differ in length, or differ from the
                               first vector of the same embedding model earlier
                               in the request (the earlier span is kept)
  malformed_span               (JSON) the span is not an object, or its
                               attributes/events are not lists; its name or an
                               event's name is over `MAX_NAME_CHARS`
  span_too_large               it is over `span_size.MAX_SPAN_BYTES` even with
                               all of its text cut (tens of thousands of
                               numbers, huge arrays), or its resource is over
                               `span_size.MAX_RESOURCE_BYTES` the same way
  ===========================  ================================================

* An attribute value that breaks the rules below is dropped and counted; its
  span is kept, because a bad score should not cost the trace its latency,
  tokens and answer, and says which keys it lost (`ragmon.dropped`): a field
  out of range is absent, never changed into another value (`usage.py` does
  not price a call on the counts left). The reasons of this table
  (`labels.ATTRIBUTE_REASONS`) count attribute values, every other reason
  counts spans, and `rejected_spans` is the sum of the span reasons. Numbers
  sent as strings ("0.83", "120", "1e3") are accepted and stored as numbers.

  ===========================  ================================================
  reason                       the attribute value is dropped when
  ===========================  ================================================
  invalid_attribute            it is not the kind of value `semconv` reads
                               from it: a score, count, cost or duration that
                               is not a number (text, a boolean), a fractional
                               token count, a vector with a non-number in it,
                               an undecodable JSON AnyValue
  out_of_range                 a number outside what its field holds: NaN or
                               +-infinity anywhere; a count (tokens, top-k)
                               negative or over `MAX_COUNT`; a cost
                               (`llm.cost.*`) negative or over `MAX_COST_USD`;
                               a duration (`ragmon.ttft_ms`,
                               `gen_ai.response.time_to_first_chunk`) negative
                               or over `MAX_SECONDS` in its unit; (JSON) an
                               `intValue` outside the signed 64-bit range
  string_too_long              a string or bytes value inside an array or
                               kvlist is over `MAX_TEXT_CHARS`; an identifier
                               (`attributes.is_identifier`: app, release,
                               intent, session, user, model, document id) is
                               over `MAX_IDENTIFIER_CHARS` (a cut id would name
                               something else); the key itself is over
                               `MAX_KEY_CHARS`
  vector_too_long              an array or kvlist (an embedding vector too)
                               holds more than `MAX_VECTOR_LENGTH` items
  invalid_attribute_index      its key holds a list index (a decimal segment
                               that is not the last one, as in
                               `retrieval.documents.<i>.document.id`) over
                               `MAX_ATTRIBUTE_INDEX` or of more than 5 digits
  ===========================  ================================================

* A span's own text is never dropped for its length: a span (or log event)
  over `span_size.MAX_SPAN_BYTES` has its longest text values cut to fit,
  each ending with a note of its size, counted in `truncated` and listed under
  `ragmon.truncated` (`span_size.py`); so one span fits a spans-topic record,
  and embedded and distributed ingest keep the same bytes the same way.

  The limits are this module's constants. The JSON API (`wire.py`) holds its
  records to the same ones; there a record that breaks one is rejected alone
  (`wire.rejection_reason` names the reason) and the rest of the batch kept.

  ======================  ===========================  ========================
  limit                   value                        JSON API fields
  ======================  ===========================  ========================
  `MAX_TIME_NS`           2**63-1 ns after 1970:       `start_time`, feedback
                          2262-04-11T23:47:16.85Z      `time`: 1970..2262
  `MAX_SECONDS`           `MAX_TIME_NS` in seconds     every `timings` value
  `MAX_COUNT`             10**12                       token counts, `k`
  `MAX_COST_USD`          1,000,000                    `usage[].cost_usd`
  `MAX_TEXT_CHARS`        2**20 characters (1 Mi):     query, answer, chunk
                          OTLP text in arrays and      content, filter, and
                          kvlists                      strings in metadata
  `MAX_IDENTIFIER_CHARS`  512 characters               ids, names, models,
                                                       release, intent,
                                                       metadata keys
  `MAX_VECTOR_LENGTH`     65,536 items                 `query_embedding.vector`
  `MAX_NAME_CHARS`        4,096 characters             (span and event names)
  `MAX_KEY_CHARS`         1,024 characters             (attribute keys)
  `MAX_ATTRIBUTE_INDEX`   65,535 (`attribute_values`)  (attribute keys)
  ======================  ===========================  ========================

  Each limit is far beyond real traffic, and keeps every value within what
  comes after ingest: the store's BigInteger and timestamp columns (a trace
  sums its calls' tokens: 10**12 a call leaves room for 9 million calls),
  Python's datetime (`semconv` dates a trace 1970 + its start in ns),
  int-to-float conversion, metric label sizes, and memory (the decoder's
  per-key cache holds keys).

Ingest decodes protobuf (HTTP and gRPC) in two steps. On the request's path,
`screen_protobuf` applies every rule that rejects a span (ids, times, and the
vectors of spans that carry one) and keeps each accepted span as its wire
bytes, a `WireSpan`; converting the attributes was ~70 % of decoding, and it
waits until the trace is built (`span_from_wire`, in a builder process). Two
kinds of span are decoded at screening all the same (`_repaired`): one over
`MAX_SPAN_BYTES` (its size is known), and one whose bytes may hold a number
out of range (`value_scan.py`: one regular expression over the body, ~4 us a
trace). Their dropped and cut values are counted in the answer, and the span
travels re-encoded without them, so the builder counts nothing twice; so the
answer names every number out of range (`partial_success` with 0 rejected
spans and a message is OTLP's warning). What the scan cannot see (a count
sent as the text "many", a key's index) is dropped and counted when the trace
is built, and logged there. `decode_protobuf` does both steps at once. OTLP/JSON
is decoded in one step and its answer reports everything.

OTLP/JSON is read as the OTLP specification writes it: lowerCamelCase field
names, trace and span ids as hex (not base64), enums as integers, 64-bit
integers as strings or numbers, `doubleValue` also as "NaN"/"Infinity",
`bytesValue` as base64, and unknown fields ignored. The JSON tree is walked
directly: `json_format.Parse` would read the hex ids as base64, and on a
200-span request it alone took ~6x as long as all of `decode_json`.

Each span's `size_bytes` is a cheap estimate of its Python memory (string
lengths plus a constant per attribute and per element), computed while the
values are converted (for a `WireSpan`, from its wire size: within 2x); the
resource dict is shared by the spans of one `ResourceSpans` and not counted
per span.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import zlib
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any, Literal

import numpy as np
from google.protobuf.message import DecodeError as ProtobufDecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from service.conventions.attribute_values import MAX_ATTRIBUTE_INDEX
from service.conventions.attributes import (
    COST_KEY_PREFIX,
    EMBEDDING_MODEL_KEYS,
    VECTOR_KEY_SUFFIX,
    GenAIAttributes,
    RagmonAttributes,
    is_identifier,
)
from service.conventions.semconv import AttributeKind, attribute_kind, embedding_model_of
from service.conventions.spans import Attributes, AttrValue, Span, SpanEvent, WireSpan
from service.errors import DecodeError, PayloadTooLarge, UnsupportedMediaType
from service.ingest.decoded import DROPPED_KEY, DecodedBatch, mark
from service.ingest.otlp_encode import resource_bytes, span_bytes
from service.ingest.protobuf_wire import WireError, span_slices
from service.ingest.span_size import MAX_RESOURCE_BYTES, MAX_SPAN_BYTES, fit_resource, fit_span
from service.ingest.value_scan import suspect_values
from service.labels import ATTRIBUTE_REASONS, RejectReason

__all__ = [
    "MAX_ATTRIBUTE_INDEX",
    "MAX_COST_USD",
    "MAX_COUNT",
    "MAX_IDENTIFIER_CHARS",
    "MAX_KEY_CHARS",
    "MAX_NAME_CHARS",
    "MAX_SECONDS",
    "MAX_TEXT_CHARS",
    "MAX_TIME_NS",
    "MAX_VECTOR_LENGTH",
    "DecodedBatch",
    "RejectReason",
    "decode_json",
    "decode_protobuf",
    "decode_request",
    "screen_protobuf",
    "screen_request",
    "span_from_wire",
]

# The limits of the module docstring's tables, shared with the JSON API (wire.py); the index limit
# is `attribute_values.MAX_ATTRIBUTE_INDEX`, where keys' indices are read.
MAX_TIME_NS = 2**63 - 1
MAX_SECONDS = MAX_TIME_NS / 1e9
MAX_COUNT = 10**12
MAX_COST_USD = 1_000_000.0
MAX_TEXT_CHARS = 2**20
MAX_IDENTIFIER_CHARS = 512
MAX_VECTOR_LENGTH = 65_536
MAX_NAME_CHARS = 4096
MAX_KEY_CHARS = 1024
_MAX_INDEX_DIGITS = len(str(MAX_ATTRIBUTE_INDEX))
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# Size-estimate constants: rough CPython object sizes, enough to bound a buffer.
_SPAN_OVERHEAD = 400
_EVENT_OVERHEAD = 120
_ENTRY_OVERHEAD = 100
_STR_OVERHEAD = 50
_NUMBER_SIZE = 32
_LIST_SLOT = 8

HEX32 = re.compile(r"[0-9a-fA-F]{32}")
HEX16 = re.compile(r"[0-9a-fA-F]{16}")
ZERO_TRACE = "0" * 32
ZERO_SPAN = "0" * 16
_WIRE_DOUBLE_ITEM = 11
# A key is stored verbatim in a span's wire bytes: a span without this in them has no vector.
_VECTOR_KEY_MARK = VECTOR_KEY_SUFFIX.encode()
_VECTOR_TYPES = frozenset({float, int})
_FLOAT_ONLY = frozenset({float})
_SPECIAL_DOUBLES = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
# What the decoder checks an attribute's value for: `attribute_kind`'s kinds, costs apart from other
# numbers, identifiers, and keys whose list index is out of range (their value is dropped whatever it is).
_Kind = AttributeKind | Literal["cost", "duration", "identifier", "bad_index"]
# Durations, by key, and the most each may be in its unit (what a trace's time span can hold).
_DURATION_LIMITS = {
    RagmonAttributes.TTFT_MS: MAX_SECONDS * 1e3,
    GenAIAttributes.TIME_TO_FIRST_CHUNK: MAX_SECONDS,
}


def _key_kind(key: str) -> _Kind | None:
    if _bad_index(key):
        return "bad_index"
    kind = attribute_kind(key)
    if kind == "number" and key.startswith(COST_KEY_PREFIX):
        return "cost"
    if kind == "number" and key in _DURATION_LIMITS:
        return "duration"
    if kind is None and is_identifier(key):
        return "identifier"
    return kind


def _bad_index(key: str) -> bool:
    """Whether a key holds a list index over `MAX_ATTRIBUTE_INDEX`: a decimal segment that is not the
    last (`content.py` and `attribute_values.indexed` read `prefix.N.rest`; `int()` of 5,000 digits
    raises, and a huge index would be kept as a huge int)."""
    segments = key.split(".")
    for segment in segments[:-1]:
        if segment.isdecimal() and (len(segment) > _MAX_INDEX_DIGITS or int(segment) > MAX_ATTRIBUTE_INDEX):
            return True
    return False


# Attribute keys repeat from span to span; the kind of each is looked up once. Bounded, because
# keys come from clients: an LRU of at most 4,096 keys, each at most `MAX_KEY_CHARS` (callers
# drop longer keys before they get here).
_kind_of = lru_cache(maxsize=4096)(_key_kind)


class _Invalid(Exception):
    """An attribute value that cannot be used; carries the reason and a short description."""

    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class _VectorDims:
    """The first vector length seen per embedding model within one request."""

    __slots__ = ("_dims",)

    def __init__(self) -> None:
        self._dims: dict[str, int] = {}

    def check(self, model: str, dims: set[int]) -> str | None:
        if len(dims) > 1:
            return f"vectors of lengths {sorted(dims)} in one span"
        (dim,) = dims
        first = self._dims.setdefault(model, dim)
        if first != dim:
            return (
                f"vector length {dim} differs from {first} earlier in the request for model {model or '?'!r}"
            )
        return None


# ---------------------------------------------------------------- values and sizes


def value_size(value: AttrValue) -> int:
    if isinstance(value, str | bytes):
        return _STR_OVERHEAD + len(value)
    if isinstance(value, list):
        if value and isinstance(value[0], int | float):
            # Vectors are homogeneous; do not walk 1,536 floats to size them.
            return _ENTRY_OVERHEAD + len(value) * (_LIST_SLOT + _NUMBER_SIZE)
        return _ENTRY_OVERHEAD + sum(_LIST_SLOT + value_size(item) for item in value)
    if isinstance(value, dict):
        return _ENTRY_OVERHEAD + sum(_ENTRY_OVERHEAD + len(k) + value_size(v) for k, v in value.items())
    return _NUMBER_SIZE


def _as_number(value: AttrValue) -> float | int:
    """A number, or a numeric string's number; raises ValueError for anything else. Not range-checked:
    NaN and infinities come back as they are."""
    if isinstance(value, bool):
        raise ValueError
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            return float(text)  # raises ValueError for what is not a number either
    raise ValueError


def _check_vector(key: str, value: AttrValue) -> list[AttrValue]:
    if not isinstance(value, list) or not value:
        raise _Invalid(RejectReason.INVALID_ATTRIBUTE, f"{key} is not a non-empty list of numbers")
    if len(value) > MAX_VECTOR_LENGTH:
        raise _too_many(key, len(value))
    # Fast path for the usual all-float vector: C-level type scan and sum; a finite sum
    # means no NaN or infinity. Anything else takes the exact per-element path below.
    types = set(map(type, value))
    if types <= _VECTOR_TYPES and math.isfinite(sum(value)):  # type: ignore[arg-type]
        return value if types == _FLOAT_ONLY else [float(item) for item in value]  # type: ignore[arg-type]
    vector: list[AttrValue] = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int | float):
            raise _Invalid(RejectReason.INVALID_ATTRIBUTE, f"{key} holds a non-number {item!r:.40}")
        number = float(item)
        if not math.isfinite(number):
            raise _Invalid(RejectReason.NAN_VECTOR, f"{key} holds {item}")
        vector.append(number)
    return vector


def _too_many(key: str, items: int) -> _Invalid:
    return _Invalid(
        RejectReason.VECTOR_TOO_LONG, f"{key} holds {items:,} items, over the limit of {MAX_VECTOR_LENGTH:,}"
    )


def _too_long(key: str, chars: int, limit: int, what: str = "a string") -> _Invalid:
    return _Invalid(
        RejectReason.STRING_TOO_LONG,
        f"{key} holds {what} of {chars:,} characters, over the limit of {limit:,}",
    )


def _check_size(key: str, value: AttrValue) -> None:
    """Raise `_Invalid` for a value over the size limits: a string or bytes over `MAX_TEXT_CHARS`, an
    array or kvlist over `MAX_VECTOR_LENGTH` items, or such a value anywhere inside one."""
    if isinstance(value, str | bytes):
        if len(value) > MAX_TEXT_CHARS:
            raise _too_long(key, len(value), MAX_TEXT_CHARS)
    elif isinstance(value, list):
        if len(value) > MAX_VECTOR_LENGTH:
            raise _too_many(key, len(value))
        if not set(map(type, value)) <= _VECTOR_TYPES:  # numbers need no walk: vectors are long
            for item in value:
                _check_size(key, item)
    elif isinstance(value, dict):
        if len(value) > MAX_VECTOR_LENGTH:
            raise _too_many(key, len(value))
        for name, item in value.items():
            if len(name) > MAX_TEXT_CHARS:
                raise _too_long(key, len(name), MAX_TEXT_CHARS, "a kvlist key")
            _check_size(key, item)


def _checked_number(key: str, kind: _Kind, value: AttrValue) -> float | int:
    """A count, score, cost or duration within its range; raises `_Invalid`: `invalid_attribute` for a
    value that is not a number of the kind (text, a boolean, a fractional count), `out_of_range` for
    a number outside what the kind holds (NaN, infinite, negative where it cannot be, over the cap).
    The message names the key and the value's kind, never the value: it is logged."""
    shown = "count" if kind == "count" else "number"
    try:
        number = _as_number(value)
    except (ValueError, TypeError, OverflowError):
        raise _Invalid(RejectReason.INVALID_ATTRIBUTE, f"{key} is not a {shown}") from None
    if isinstance(number, float) and not math.isfinite(number):
        raise _Invalid(RejectReason.OUT_OF_RANGE, f"{key} is {number} (not a finite {shown})")
    if kind == "count":
        if isinstance(number, float):
            if not number.is_integer():
                raise _Invalid(RejectReason.INVALID_ATTRIBUTE, f"{key} is a fraction, not a count")
            number = int(number)
        if not 0 <= number <= MAX_COUNT:
            raise _Invalid(RejectReason.OUT_OF_RANGE, f"{key} is not a count within 0..{MAX_COUNT:,}")
        return number
    try:
        number = float(number)
    except OverflowError:  # an integer of hundreds of digits, sent as text
        raise _Invalid(RejectReason.OUT_OF_RANGE, f"{key} is not a finite {shown}") from None
    if kind == "cost" and not 0 <= number <= MAX_COST_USD:
        raise _Invalid(RejectReason.OUT_OF_RANGE, f"{key} is not a cost within 0..{MAX_COST_USD:,.0f} USD")
    if kind == "duration" and not 0 <= number <= _DURATION_LIMITS[key]:
        raise _Invalid(
            RejectReason.OUT_OF_RANGE, f"{key} is not a duration within 0..{_DURATION_LIMITS[key]:g}"
        )
    return number


def _normalize(key: str, kind: _Kind, value: AttrValue) -> AttrValue:
    """The value `semconv` can rely on for an attribute of `kind`; raises `_Invalid`."""
    if kind == "count" or kind == "number" or kind == "cost" or kind == "duration":
        return _checked_number(key, kind, value)
    if kind == "vector":
        return _check_vector(key, value)
    if kind == "identifier":
        if isinstance(value, str) and len(value) > MAX_IDENTIFIER_CHARS:
            raise _too_long(key, len(value), MAX_IDENTIFIER_CHARS, "an identifier")
        _check_size(key, value)
        return value
    raise _Invalid(
        RejectReason.INVALID_ATTRIBUTE_INDEX,
        f"key {key!r:.60} holds a list index over {MAX_ATTRIBUTE_INDEX:,}",
    )


def finish_attributes(
    raw: Iterable[tuple[str, AttrValue]], batch: DecodedBatch, where: str, dims: set[int] | None
) -> tuple[Attributes, int]:
    """Typed attributes and their estimated size; raises `_Invalid` for a span-level problem.

    `dims` collects vector lengths (span attributes only); None means vectors
    are not checked here (events, resources).
    """
    attributes: Attributes = {}
    size = 0
    for key, value in raw:
        if len(key) > MAX_KEY_CHARS:
            _drop_long_key(key, batch, where)
            continue
        kind = _kind_of(key)
        # most values: nothing to check beyond an identifier's length, sized without `value_size`;
        # text of any length is kept: a span is cut to fit `MAX_SPAN_BYTES` as a whole (`span_size.py`)
        if type(value) is str and (
            kind is None or (kind == "identifier" and len(value) <= MAX_IDENTIFIER_CHARS)
        ):
            attributes[key] = value
            size += _ENTRY_OVERHEAD + len(key) + _STR_OVERHEAD + len(value)
            continue
        size += _add_checked(attributes, key, value, kind, batch, where, dims)
    return attributes, size


def _drop_long_key(key: str, batch: DecodedBatch, where: str) -> None:
    """Count an attribute dropped for a key over `MAX_KEY_CHARS`: under its index when that is what
    makes it long (`retrieval.documents.<5,000 digits>.document.id`); such keys never reach `_kind_of`."""
    shown = f"key {key[:40]!r}..."
    if _bad_index(key):
        problem = _Invalid(
            RejectReason.INVALID_ATTRIBUTE_INDEX, f"{shown} holds a list index over {MAX_ATTRIBUTE_INDEX:,}"
        )
    else:
        problem = _too_long(shown, len(key), MAX_KEY_CHARS, "a key")
    batch._drop(problem.reason, f"{where}: {problem.detail}", where, f"{key[:40]}...")


def _add_checked(
    attributes: Attributes,
    key: str,
    value: AttrValue,
    kind: _Kind | None,
    batch: DecodedBatch,
    where: str,
    dims: set[int] | None,
) -> int:
    """Add one attribute that may need checking (see `finish_attributes`); returns its estimated size."""
    try:
        if kind is None or (kind == "vector" and dims is None):
            # vectors are checked as such on spans only (`dims`); text of any length is kept here (see
            # `finish_attributes`), what is inside an array or a kvlist is held to the limits
            if not isinstance(value, str | bytes):
                _check_size(key, value)
        else:
            value = _normalize(key, kind, value)
    except _Invalid as problem:
        if problem.reason not in ATTRIBUTE_REASONS:
            raise
        batch._drop(problem.reason, f"{where}: {problem.detail}", where, key)
        return 0
    except RecursionError:  # a value nested deeper than the walk goes: it cannot be read either
        batch._drop(RejectReason.INVALID_ATTRIBUTE, f"{where}: {key!r:.60} is nested too deeply", where, key)
        return 0
    if kind == "vector" and dims is not None and isinstance(value, list):
        dims.add(len(value))
    attributes[key] = value
    return _ENTRY_OVERHEAD + len(key) + value_size(value)


# ---------------------------------------------------------------- protobuf


_PB_SCALARS = frozenset({"string_value", "int_value", "double_value", "bool_value", "bytes_value"})


def pb_value(value: AnyValue) -> AttrValue:
    which = value.WhichOneof("value")
    if which in _PB_SCALARS:
        scalar: AttrValue = getattr(value, which)
        return scalar
    if which == "array_value":
        return _pb_array(value.array_value)
    if which == "kvlist_value":
        return {kv.key: pb_value(kv.value) for kv in value.kvlist_value.values}
    return None


def _pb_array(array: ArrayValue) -> list[AttrValue]:
    """An ArrayValue's items; all-double arrays (embedding vectors) are read straight from the wire.

    Touching each of 1,536 AnyValue messages from Python costs about 2 us apiece.
    An all-double array has a fixed wire layout, 11 bytes per item (tag 0x0a, length 9,
    tag 0x21, 8 little-endian bytes), so numpy can slice the doubles out in one step.
    """
    doubles = _wire_doubles(array.SerializeToString())
    if doubles is not None and doubles.size:
        values: list[AttrValue] = doubles.tolist()
        return values
    return [pb_value(item) for item in array.values]


def _wire_doubles(raw: bytes) -> np.ndarray[Any, np.dtype[np.float64]] | None:
    """The numbers of a serialized ArrayValue that holds only doubles; None for any other array."""
    n, rest = divmod(len(raw), _WIRE_DOUBLE_ITEM)
    if rest or raw[0::11] != b"\x0a" * n or raw[1::11] != b"\x09" * n or raw[2::11] != b"\x21" * n:
        return None
    if not n:  # the view below would start past the end
        return np.empty(0)
    # a strided view of the wire bytes: one numpy call where slicing, copying and viewing were five
    return np.ndarray((n,), dtype="<f8", buffer=raw, offset=3, strides=(_WIRE_DOUBLE_ITEM,))


def pb_attributes(
    pairs: Iterable[KeyValue], batch: DecodedBatch, where: str, dims: set[int] | None
) -> tuple[Attributes, int]:
    """`finish_attributes` over protobuf KeyValues, with the common cases read inline: a string
    value of a key that needs no check, a double score, an integer count, an all-double vector.

    A span carries dozens of attributes, and the calls per attribute were most of converting
    them. Each inline case keeps exactly the value, and adds exactly the size, that the general
    path (`_add_checked`) would; any other value takes that path."""
    attributes: Attributes = {}
    size = 0
    for kv in pairs:
        key, any_value = kv.key, kv.value
        if len(key) > MAX_KEY_CHARS:
            _drop_long_key(key, batch, where)
            continue
        kind = _kind_of(key)
        if kind is None or kind == "identifier":
            # `string_value` reads "" for any other type: only an empty text needs the type asked
            text = any_value.string_value
            if (text or any_value.WhichOneof("value") == "string_value") and (
                kind is None or len(text) <= MAX_IDENTIFIER_CHARS
            ):
                attributes[key] = text
                size += _ENTRY_OVERHEAD + len(key) + _STR_OVERHEAD + len(text)
                continue
        elif kind == "number":
            if any_value.WhichOneof("value") == "double_value":
                number = any_value.double_value
                if math.isfinite(number):
                    attributes[key] = number
                    size += _ENTRY_OVERHEAD + len(key) + _NUMBER_SIZE
                    continue
        elif kind == "count":
            if any_value.WhichOneof("value") == "int_value":
                count = any_value.int_value
                if 0 <= count <= MAX_COUNT:
                    attributes[key] = count
                    size += _ENTRY_OVERHEAD + len(key) + _NUMBER_SIZE
                    continue
        elif kind == "vector" and dims is not None and any_value.WhichOneof("value") == "array_value":
            doubles = _wire_doubles(any_value.array_value.SerializeToString())
            if doubles is not None and 0 < doubles.size <= MAX_VECTOR_LENGTH:
                numbers = doubles.tolist()
                # a finite sum means no NaN or infinity (an overflowing sum takes the general path)
                if math.isfinite(sum(numbers)):
                    dims.add(len(numbers))
                    attributes[key] = numbers
                    size += (
                        _ENTRY_OVERHEAD
                        + len(key)
                        + _ENTRY_OVERHEAD
                        + len(numbers) * (_LIST_SLOT + _NUMBER_SIZE)
                    )
                    continue
        size += _add_checked(attributes, key, pb_value(any_value), kind, batch, where, dims)
    return attributes, size


def _checked_ids(span: PbSpan, where: str) -> tuple[bytes, bytes, bytes]:
    """The span's trace, span and parent ids; raises `_Invalid` for bad ids, times or names."""
    raw_trace, raw_span, raw_parent = span.trace_id, span.span_id, span.parent_span_id
    if len(raw_trace) != 16 or not any(raw_trace):
        raise _Invalid(
            RejectReason.INVALID_TRACE_ID, f"{where}: trace id {raw_trace.hex()!r} is not 16 non-zero bytes"
        )
    if len(raw_span) != 8 or not any(raw_span):
        raise _Invalid(
            RejectReason.INVALID_SPAN_ID, f"{where}: span id {raw_span.hex()!r} is not 8 non-zero bytes"
        )
    if raw_parent and len(raw_parent) != 8:
        raise _Invalid(
            RejectReason.INVALID_PARENT_SPAN_ID,
            f"{where}: parent span id {raw_parent.hex()!r} is not 8 bytes",
        )
    start, end = span.start_time_unix_nano, span.end_time_unix_nano
    if start == 0 or end < start or end > MAX_TIME_NS:  # inline: this runs for every span on the request path
        _check_interval(start, end, where)
    if len(span.name) > MAX_NAME_CHARS:
        _check_name(span.name, where)
    events = span.events
    if events:  # iterating an empty repeated field costs 3x asking its length
        for event in events:
            if event.time_unix_nano > MAX_TIME_NS:
                raise _late(f"event {event.name!r:.40}", event.time_unix_nano, where)
            _check_name(event.name, where)
    return raw_trace, raw_span, raw_parent


def _check_interval(start: int, end: int, where: str) -> None:
    """Raise `_Invalid` (INVALID_TIME) unless 0 < start <= end <= `MAX_TIME_NS`."""
    if start <= 0 or end < start:
        raise _Invalid(
            RejectReason.INVALID_TIME,
            f"{where}: start {_digits(start)} / end {_digits(end)} is not a valid interval",
        )
    if end > MAX_TIME_NS:
        late_start = start > MAX_TIME_NS
        raise _late("start" if late_start else "end", start if late_start else end, where)


def _digits(ns: int) -> str:
    text = str(ns)
    return text if len(text) <= 24 else f"{text[:20]}...({len(text)} digits)"


def _late(what: str, ns: int, where: str) -> _Invalid:
    return _Invalid(
        RejectReason.INVALID_TIME,
        f"{where}: {what} time {_digits(ns)} ns is after the latest time ragmon keeps "
        f"({MAX_TIME_NS} ns, 2262-04-11)",
    )


def _check_name(name: str, where: str) -> None:
    if len(name) > MAX_NAME_CHARS:
        raise _Invalid(
            RejectReason.MALFORMED_SPAN,
            f"{where}: a name of {len(name):,} characters is over the limit of {MAX_NAME_CHARS:,}",
        )


def _check_dims(attributes: Attributes, vector_dims: set[int], dims: _VectorDims, where: str) -> None:
    if not vector_dims:
        return
    problem = dims.check(embedding_model_of(attributes) or "", vector_dims)
    if problem is not None:
        raise _Invalid(RejectReason.VECTOR_DIMENSION_MISMATCH, f"{where}: {problem}")


def _screen_span(
    span: PbSpan,
    raw: bytes | None,
    resource: Attributes,
    tenant: str,
    dims: _VectorDims,
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
    size = _SPAN_OVERHEAD + 2 * len(raw) + (_ENTRY_OVERHEAD + _STR_OVERHEAD) * len(span.attributes)
    if _VECTOR_KEY_MARK in raw:
        vector_size = _screen_vectors(span, dims, where)
        # a vector's 11 wire bytes a number become ~40 in Python (see `value_size`)
        size += vector_size * (_LIST_SLOT + _NUMBER_SIZE)
    parent = raw_parent.hex() if any(raw_parent) else None
    wire = WireSpan(tenant, raw_trace.hex(), parent, size, raw, resource)
    if len(raw) > MAX_SPAN_BYTES or (scan and suspect_values(raw)):
        return _repaired(wire, batch)
    return wire


def _repaired(wire: WireSpan, batch: DecodedBatch) -> WireSpan:
    """`wire` decoded now with the builder's rules, its attribute values out of range dropped and
    counted in `batch` (so the answer names them), cut to fit `MAX_SPAN_BYTES` when it is over, and
    re-encoded when that changed it: the builder then finds nothing left to drop or cut. Raises
    `_Invalid` (SPAN_TOO_LARGE) when it cannot fit; nothing of it is counted then but the rejection."""
    scratch = DecodedBatch()
    span = span_from_wire(wire, scratch)
    where = f"span {wire.trace_id}/{span.span_id}"
    if len(wire.raw) > MAX_SPAN_BYTES and fit_span(span, scratch, where) is None:
        raise _Invalid(
            RejectReason.SPAN_TOO_LARGE,
            f"{where} of {len(wire.raw):,} bytes does not fit the {MAX_SPAN_BYTES:,}-byte limit "
            "even with its text truncated",
        )
    batch.absorb(scratch)
    if not scratch.rejections and not scratch.truncated:
        return wire
    raw = span_bytes(span)
    # the decoded estimate, less what was cut (a cut text's bytes are about its characters)
    size = max(_SPAN_OVERHEAD + len(raw), span.size_bytes - max(0, len(wire.raw) - len(raw)))
    return wire._replace(raw=raw, size_bytes=size)


def _screen_vectors(span: PbSpan, dims: _VectorDims, where: str) -> int:
    """Check the span's embedding vectors as `span_from_wire` would, without converting them: raises
    `_Invalid` for a non-finite number or a length mismatch; returns the numbers they hold.

    A vector that is not a list of numbers is left alone: it is an attribute value that
    `span_from_wire` drops and counts."""
    lengths: set[int] = set()
    numbers = 0
    models: Attributes = {}
    for kv in span.attributes:
        key = kv.key
        if len(key) <= MAX_KEY_CHARS and _kind_of(key) == "vector":
            length = _screened_vector_length(key, kv.value)
            if length is not None:
                lengths.add(length)
                numbers += length
        elif key in EMBEDDING_MODEL_KEYS and kv.value.WhichOneof("value") == "string_value":
            models[key] = kv.value.string_value
    _check_dims(models, lengths, dims, where)
    return numbers


def _screened_vector_length(key: str, value: AnyValue) -> int | None:
    """The length of a usable vector; None for one `_check_vector` would drop; raises `_Invalid`
    (NAN_VECTOR) where it would reject the span."""
    if value.WhichOneof("value") != "array_value" or len(value.array_value.values) > MAX_VECTOR_LENGTH:
        return None
    raw = value.array_value.SerializeToString()
    doubles = _wire_doubles(raw)
    if doubles is not None:  # the usual case: all doubles, checked in one numpy call
        if not doubles.size:
            return None
        finite = np.isfinite(doubles)
        if not finite.all():
            raise _Invalid(RejectReason.NAN_VECTOR, f"{key} holds {float(doubles[~finite][0])}")
        return int(doubles.size)
    try:
        return len(_check_vector(key, _pb_array(value.array_value)))
    except _Invalid as problem:
        if problem.reason is RejectReason.INVALID_ATTRIBUTE:
            return None
        raise


def span_from_wire(wire: WireSpan, problems: DecodedBatch) -> Span:
    """The `Span` a screened protobuf span decodes to; attribute values that cannot be used are
    dropped and counted in `problems` (as `invalid_attribute`)."""
    span = PbSpan.FromString(wire.raw)
    span_id = span.span_id.hex()
    where = f"span {wire.trace_id}/{span_id}"
    # Screened already (`_screen_span`): its ids, times and names passed `_checked_ids`, and the
    # trace and parent ids are the screen's hex of the same bytes. Nothing here rejects the span;
    # vectors were compared within its request.
    vector_dims: set[int] = set()
    dropped_from = len(problems.dropped_keys)
    attributes, size = pb_attributes(span.attributes, problems, where, vector_dims)
    events: list[SpanEvent] = []
    if span.events:  # iterating an empty repeated field costs 3x asking its length
        for event in span.events:
            event_attributes, event_size = pb_attributes(event.attributes, problems, where, None)
            events.append(SpanEvent(event.name, event.time_unix_nano, event_attributes))
            size += _EVENT_OVERHEAD + len(event.name) + event_size
    _check_dims(attributes, vector_dims, _VectorDims(), where)
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
        _SPAN_OVERHEAD + len(name) + size,
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
    dims = _VectorDims()
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
                        raise _Invalid(RejectReason.SPAN_TOO_LARGE, f"{where}: {too_large}")
                    batch.spans.append(_screen_span(span, raw, resource, tenant, dims, where, batch, scan))
                except _Invalid as problem:
                    batch._reject(problem.reason, problem.detail)
    return batch


def resource_too_large(resource: Attributes, wire_size: int, batch: DecodedBatch, r: int) -> str | None:
    """Cut a resource over `MAX_RESOURCE_BYTES` to fit (`span_size.fit_resource`); None when it fits,
    else why its spans are rejected."""
    if wire_size <= MAX_RESOURCE_BYTES or fit_resource(resource, batch, f"resource {r}") is not None:
        return None
    return f"its resource of {wire_size:,} bytes does not fit the {MAX_RESOURCE_BYTES:,}-byte limit"


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


# ---------------------------------------------------------------- OTLP/JSON


def json_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("boolean where an integer belongs")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        return int(value)
    raise ValueError(f"{value!r:.40} is not an integer")


def json_value(value: Any) -> AttrValue:
    """An OTLP/JSON AnyValue as a plain Python value; raises ValueError/TypeError when it is not one."""
    if not isinstance(value, dict):
        raise TypeError("AnyValue must be an object")
    if "stringValue" in value:
        text = value["stringValue"]
        if not isinstance(text, str):
            raise TypeError("stringValue must be a string")
        return text
    if "intValue" in value:
        number = json_int(value["intValue"])
        if not _INT64_MIN <= number <= _INT64_MAX:
            raise _OutOfRange(f"intValue {_digits(number)} is outside the signed 64-bit range")
        return number
    if "doubleValue" in value:
        number = value["doubleValue"]
        if isinstance(number, str):
            return _SPECIAL_DOUBLES[number] if number in _SPECIAL_DOUBLES else float(number)
        if isinstance(number, bool) or not isinstance(number, int | float):
            raise TypeError("doubleValue must be a number")
        return float(number)
    if "boolValue" in value:
        flag = value["boolValue"]
        if not isinstance(flag, bool):
            raise TypeError("boolValue must be true or false")
        return flag
    if "arrayValue" in value:
        return [json_value(item) for item in _json_list(value["arrayValue"], "values")]
    if "kvlistValue" in value:
        pairs: dict[str, AttrValue] = {}
        for kv in _json_list(value["kvlistValue"], "values"):
            key, item = _json_pair(kv)
            pairs[key] = item
        return pairs
    if "bytesValue" in value:
        data = value["bytesValue"]
        if not isinstance(data, str):
            raise TypeError("bytesValue must be a base64 string")
        return base64.b64decode(data, validate=True)
    return None


def _json_list(container: Any, key: str) -> list[Any]:
    if not isinstance(container, dict):
        raise TypeError(f"expected an object holding {key!r}")
    items = container.get(key, [])
    if not isinstance(items, list):
        raise TypeError(f"{key} must be a list")
    return items


def _json_pair(kv: Any) -> tuple[str, AttrValue]:
    if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
        raise TypeError("attribute must be an object with a string key")
    raw = kv.get("value")
    return kv["key"], None if raw is None else json_value(raw)


class _OutOfRange(ValueError):
    """A JSON value of the right type outside the range OTLP gives it (an `intValue` over 64 bits)."""


def json_pairs(items: list[Any], batch: DecodedBatch, where: str) -> Iterable[tuple[str, AttrValue]]:
    for kv in items:
        try:
            yield _json_pair(kv)
        except (ValueError, TypeError, KeyError, binascii.Error, RecursionError) as exc:
            key = kv.get("key") if isinstance(kv, dict) else None
            reason = (
                RejectReason.OUT_OF_RANGE if isinstance(exc, _OutOfRange) else RejectReason.INVALID_ATTRIBUTE
            )
            batch._drop(
                reason,
                f"{where}: attribute {key!r:.60} has an invalid value ({exc})",
                where,
                key[:MAX_KEY_CHARS] if isinstance(key, str) else "?",
            )


def json_id(value: Any, pattern: re.Pattern[str], zero: str) -> str | None:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        return None
    lowered = value.lower()
    return None if lowered == zero else lowered


def _json_enum(value: Any, enum: Mapping[str, int]) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        return enum.get(value, 0)
    return 0


_SPAN_KINDS = {name: number for name, number in PbSpan.SpanKind.items()}
_STATUS_CODES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}


def _json_span(
    span: Any, resource: Attributes, tenant: str, batch: DecodedBatch, dims: _VectorDims, where: str
) -> Span:
    if not isinstance(span, dict):
        raise _Invalid(RejectReason.MALFORMED_SPAN, f"{where}: span is not an object")
    trace_id = json_id(span.get("traceId"), HEX32, ZERO_TRACE)
    if trace_id is None:
        raise _Invalid(
            RejectReason.INVALID_TRACE_ID,
            f"{where}: traceId {span.get('traceId')!r:.40} is not 32 hex digits, non-zero",
        )
    span_id = json_id(span.get("spanId"), HEX16, ZERO_SPAN)
    if span_id is None:
        raise _Invalid(
            RejectReason.INVALID_SPAN_ID,
            f"{where}: spanId {span.get('spanId')!r:.40} is not 16 hex digits, non-zero",
        )
    raw_parent = span.get("parentSpanId") or None
    parent: str | None = None
    if raw_parent is not None:
        if not isinstance(raw_parent, str) or not HEX16.fullmatch(raw_parent):
            raise _Invalid(
                RejectReason.INVALID_PARENT_SPAN_ID,
                f"{where}: parentSpanId {raw_parent!r:.40} is not 16 hex digits",
            )
        parent = None if raw_parent.lower() == ZERO_SPAN else raw_parent.lower()
    try:
        start = json_int(span.get("startTimeUnixNano", 0))
        end = json_int(span.get("endTimeUnixNano", 0))
    except ValueError as exc:
        raise _Invalid(RejectReason.INVALID_TIME, f"{where}: {exc}") from None
    _check_interval(start, end, where)
    raw_attributes, raw_events = span.get("attributes", []), span.get("events", [])
    if not isinstance(raw_attributes, list) or not isinstance(raw_events, list):
        raise _Invalid(RejectReason.MALFORMED_SPAN, f"{where}: attributes and events must be lists")
    name = span.get("name", "")
    name = name if isinstance(name, str) else ""
    _check_name(name, where)
    # every rule that rejects the span first, so a rejected span's attributes are not counted as dropped
    checked_events = [_json_event_head(raw_event, where) for raw_event in raw_events]
    vector_dims: set[int] = set()
    where = f"span {trace_id}/{span_id}"  # as the protobuf path names it: what a drop is logged under
    dropped_from = len(batch.dropped_keys)
    attributes, size = finish_attributes(json_pairs(raw_attributes, batch, where), batch, where, vector_dims)
    events: list[SpanEvent] = []
    for event_name, event_time, raw_event_attributes in checked_events:
        event_attributes, event_size = finish_attributes(
            json_pairs(raw_event_attributes, batch, where), batch, where, None
        )
        events.append(SpanEvent(event_name, event_time, event_attributes))
        size += _EVENT_OVERHEAD + len(event_name) + event_size
    _check_dims(attributes, vector_dims, dims, where)
    if len(batch.dropped_keys) > dropped_from:
        mark(attributes, DROPPED_KEY, batch.dropped_keys[dropped_from:])
        del batch.dropped_keys[dropped_from:]
    status = span.get("status")
    decoded = Span(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent,
        name=name,
        start_ns=start,
        end_ns=end,
        attributes=attributes,
        events=events,
        resource=resource,
        kind=_json_enum(span.get("kind", 0), _SPAN_KINDS),
        status_code=_json_enum(status.get("code", 0), _STATUS_CODES) if isinstance(status, dict) else 0,
        tenant=tenant,
        size_bytes=_SPAN_OVERHEAD + len(name) + size,
    )
    _fit_decoded(decoded, batch, where)
    return decoded


def _fit_decoded(span: Span, batch: DecodedBatch, where: str) -> None:
    """Cut a decoded span to fit `MAX_SPAN_BYTES` (`span_size.fit_span`); raises `_Invalid`
    (SPAN_TOO_LARGE) when it cannot. Only a span whose estimate says it may be near the limit is
    encoded to be measured: text is at most 4 bytes a character on the wire."""
    if span.size_bytes * 4 <= MAX_SPAN_BYTES:
        return
    before = len(span_bytes(span))
    after = fit_span(span, batch, where)
    if after is None:
        raise _Invalid(
            RejectReason.SPAN_TOO_LARGE,
            f"{where} of {before:,} bytes does not fit the {MAX_SPAN_BYTES:,}-byte limit even with its "
            "text truncated",
        )
    span.size_bytes = max(_SPAN_OVERHEAD + after, span.size_bytes - (before - after))


def _json_event_head(raw_event: Any, where: str) -> tuple[str, int, list[Any]]:
    """An OTLP/JSON event's name, time and raw attributes; raises `_Invalid` where it rejects its span."""
    if not isinstance(raw_event, dict) or not isinstance(raw_event.get("attributes", []), list):
        raise _Invalid(
            RejectReason.MALFORMED_SPAN, f"{where}: an event is not an object with an attribute list"
        )
    event_name = raw_event.get("name", "")
    event_name = event_name if isinstance(event_name, str) else ""
    _check_name(event_name, where)
    try:
        event_time = json_int(raw_event.get("timeUnixNano", 0))
    except ValueError as exc:
        raise _Invalid(RejectReason.INVALID_TIME, f"{where}: event {event_name!r:.40}: {exc}") from None
    if event_time < 0:
        raise _Invalid(RejectReason.INVALID_TIME, f"{where}: event {event_name!r:.40} has a negative time")
    if event_time > MAX_TIME_NS:
        raise _late(f"event {event_name!r:.40}", event_time, where)
    attributes: list[Any] = raw_event.get("attributes", [])
    return event_name, event_time, attributes


def json_structure(container: Any, key: str, where: str) -> list[Any]:
    """A list the request's shape requires; its absence is an empty list, a wrong type a `DecodeError`."""
    if not isinstance(container, dict):
        raise DecodeError(f"{where} must be a JSON object")
    items = container.get(key, [])
    if items is None:
        return []
    if not isinstance(items, list):
        raise DecodeError(f"{where}.{key} must be a JSON array, got {type(items).__name__}")
    return items


def decode_json(body: bytes, tenant: str) -> DecodedBatch:
    """Decode an OTLP/HTTP JSON body; raises `DecodeError` when it is not a valid request."""
    if not isinstance(body, bytes | bytearray | memoryview):
        raise TypeError(f"body must be bytes, got {type(body).__name__}")
    check_tenant(tenant)
    try:
        text = bytes(body).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(f"body is not valid UTF-8 (byte {exc.start}: {exc.reason})") from exc
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise DecodeError(f"body is not valid JSON: {exc}") from exc
    batch = DecodedBatch()
    dims = _VectorDims()
    for r, resource_spans in enumerate(json_structure(document, "resourceSpans", "request")):
        where_r = f"resourceSpans[{r}]"
        scope_list = json_structure(resource_spans, "scopeSpans", where_r)
        raw_resource = resource_spans.get("resource") or {}
        resource_attributes = json_structure(raw_resource, "attributes", f"{where_r}.resource")
        resource, resource_size = finish_attributes(
            json_pairs(resource_attributes, batch, f"{where_r}.resource"), batch, f"{where_r}.resource", None
        )
        batch.dropped_keys.clear()  # a resource is not marked: what it lost is counted and logged
        # text is at most 4 bytes a character on the wire: only a resource near the limit is measured
        too_large = (
            resource_too_large(resource, len(resource_bytes(resource)), batch, r)
            if resource_size * 4 > MAX_RESOURCE_BYTES
            else None
        )
        for s, scope_spans in enumerate(scope_list):
            where_s = f"{where_r}.scopeSpans[{s}]"
            for i, span in enumerate(json_structure(scope_spans, "spans", where_s)):
                where = f"{where_s}.spans[{i}]"
                try:
                    if too_large is not None:
                        raise _Invalid(RejectReason.SPAN_TOO_LARGE, f"{where}: {too_large}")
                    batch.spans.append(_json_span(span, resource, tenant, batch, dims, where))
                except _Invalid as problem:
                    batch._reject(problem.reason, problem.detail)
    return batch


# ---------------------------------------------------------------- a body off the wire


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """gzip/deflate/identity body → bytes, refusing more than `limit` decompressed bytes (zip bombs)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise UnsupportedMediaType(f"Content-Encoding {encoding!r} is not supported; use gzip or identity")
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise DecodeError(f"body is not valid {encoding}: {exc}") from exc
    if len(out) > limit or inflater.unconsumed_tail:
        raise PayloadTooLarge(f"decompressed body is over the limit of {limit} bytes")
    # checked here, not left to the protobuf/JSON layer: its error would name the wrong culprit
    if not inflater.eof:
        raise DecodeError(f"body is not valid {encoding}: the compressed stream is truncated")
    if inflater.unused_data:
        raise DecodeError(
            f"body is not valid {encoding}: {len(inflater.unused_data)} bytes of trailing data after its end"
        )
    return out


def decode_body(body: bytes, *, json_body: bool, encoding: str, tenant: str, limit: int) -> DecodedBatch:
    """An OTLP body as it came off the wire (maybe compressed) → `DecodedBatch`.

    The one function the receivers hand to `IngestPool`: module-level and with
    plain arguments, so a worker process can run it."""
    plain = decompress(body, encoding, limit)
    return decode_json(plain, tenant) if json_body else screen_protobuf(plain, tenant)


def check_tenant(tenant: str) -> None:
    if not isinstance(tenant, str) or not tenant:
        raise ValueError(f"tenant must be a non-empty string, got {tenant!r}")
