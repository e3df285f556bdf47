"""OTLP trace decoding's rules: what an `ExportTraceServiceRequest` (protobuf, OTLP/JSON or parsed gRPC)
keeps of its spans, drops of their values, and rejects; the limits; the checks the decoders share.

The decoders (`otlp_protobuf.py`, `otlp_json.py`; see the end of this
docstring) return a `DecodedBatch` and share one set of rules:

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

Where the rules are applied: `otlp_protobuf.py` screens and decodes protobuf
(HTTP and gRPC), `otlp_json.py` decodes OTLP/JSON, and `otlp_body.py` takes a
body off the wire (decompressed within its limit) to the one or the other;
`otlp_logs.py` decodes log records with the same value rules. This module
holds what they share: the limits, the attribute value checks
(`finish_attributes`), and the span rules that do not depend on the encoding
(times, names, vector lengths, a resource's size).

Each span's `size_bytes` is a cheap estimate of its Python memory (string
lengths plus a constant per attribute and per element), computed while the
values are converted (for a `WireSpan`, from its wire size: within 2x); the
resource dict is shared by the spans of one `ResourceSpans` and not counted
per span.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import lru_cache
from typing import Literal

from service.conventions.attribute_values import MAX_ATTRIBUTE_INDEX
from service.conventions.attributes import COST_KEY_PREFIX, GenAIAttributes, RagmonAttributes, is_identifier
from service.conventions.semconv import AttributeKind, attribute_kind, embedding_model_of
from service.conventions.spans import Attributes, AttrValue
from service.ingest.decoded import DecodedBatch
from service.ingest.span_size import MAX_RESOURCE_BYTES, fit_resource
from service.labels import ATTRIBUTE_REASONS, RejectReason

# Besides what the receivers use, the rule checks and size constants the two decoders share
# (otlp_protobuf.py, otlp_json.py).
__all__ = [
    "ENTRY_OVERHEAD",
    "EVENT_OVERHEAD",
    "LIST_SLOT",
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
    "NUMBER_SIZE",
    "SPAN_OVERHEAD",
    "STR_OVERHEAD",
    "DecodedBatch",
    "InvalidValue",
    "RejectReason",
    "VectorDims",
    "add_checked",
    "check_dims",
    "check_interval",
    "check_name",
    "check_tenant",
    "check_vector",
    "drop_long_key",
    "finish_attributes",
    "kind_of",
    "ns_text",
    "resource_too_large",
    "time_too_late",
    "value_size",
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

# Size-estimate constants: rough CPython object sizes, enough to bound a buffer.
SPAN_OVERHEAD = 400
EVENT_OVERHEAD = 120
ENTRY_OVERHEAD = 100
STR_OVERHEAD = 50
NUMBER_SIZE = 32
LIST_SLOT = 8

_VECTOR_TYPES = frozenset({float, int})
_FLOAT_ONLY = frozenset({float})
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
kind_of = lru_cache(maxsize=4096)(_key_kind)


class InvalidValue(Exception):
    """A value or span that breaks one of the rules above; carries the reason and a short description."""

    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class VectorDims:
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
        return STR_OVERHEAD + len(value)
    if isinstance(value, list):
        if value and isinstance(value[0], int | float):
            # Vectors are homogeneous; do not walk 1,536 floats to size them.
            return ENTRY_OVERHEAD + len(value) * (LIST_SLOT + NUMBER_SIZE)
        return ENTRY_OVERHEAD + sum(LIST_SLOT + value_size(item) for item in value)
    if isinstance(value, dict):
        return ENTRY_OVERHEAD + sum(ENTRY_OVERHEAD + len(k) + value_size(v) for k, v in value.items())
    return NUMBER_SIZE


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


def check_vector(key: str, value: AttrValue) -> list[AttrValue]:
    if not isinstance(value, list) or not value:
        raise InvalidValue(RejectReason.INVALID_ATTRIBUTE, f"{key} is not a non-empty list of numbers")
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
            raise InvalidValue(RejectReason.INVALID_ATTRIBUTE, f"{key} holds a non-number {item!r:.40}")
        number = float(item)
        if not math.isfinite(number):
            raise InvalidValue(RejectReason.NAN_VECTOR, f"{key} holds {item}")
        vector.append(number)
    return vector


def _too_many(key: str, items: int) -> InvalidValue:
    return InvalidValue(
        RejectReason.VECTOR_TOO_LONG, f"{key} holds {items:,} items, over the limit of {MAX_VECTOR_LENGTH:,}"
    )


def _too_long(key: str, chars: int, limit: int, what: str = "a string") -> InvalidValue:
    return InvalidValue(
        RejectReason.STRING_TOO_LONG,
        f"{key} holds {what} of {chars:,} characters, over the limit of {limit:,}",
    )


def _check_size(key: str, value: AttrValue) -> None:
    """Raise `InvalidValue` for a value over the size limits: a string or bytes over `MAX_TEXT_CHARS`, an
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
    """A count, score, cost or duration within its range; raises `InvalidValue`: `invalid_attribute` for a
    value that is not a number of the kind (text, a boolean, a fractional count), `out_of_range` for
    a number outside what the kind holds (NaN, infinite, negative where it cannot be, over the cap).
    The message names the key and the value's kind, never the value: it is logged."""
    shown = "count" if kind == "count" else "number"
    try:
        number = _as_number(value)
    except (ValueError, TypeError, OverflowError):
        raise InvalidValue(RejectReason.INVALID_ATTRIBUTE, f"{key} is not a {shown}") from None
    if isinstance(number, float) and not math.isfinite(number):
        raise InvalidValue(RejectReason.OUT_OF_RANGE, f"{key} is {number} (not a finite {shown})")
    if kind == "count":
        if isinstance(number, float):
            if not number.is_integer():
                raise InvalidValue(RejectReason.INVALID_ATTRIBUTE, f"{key} is a fraction, not a count")
            number = int(number)
        if not 0 <= number <= MAX_COUNT:
            raise InvalidValue(RejectReason.OUT_OF_RANGE, f"{key} is not a count within 0..{MAX_COUNT:,}")
        return number
    try:
        number = float(number)
    except OverflowError:  # an integer of hundreds of digits, sent as text
        raise InvalidValue(RejectReason.OUT_OF_RANGE, f"{key} is not a finite {shown}") from None
    if kind == "cost" and not 0 <= number <= MAX_COST_USD:
        raise InvalidValue(
            RejectReason.OUT_OF_RANGE, f"{key} is not a cost within 0..{MAX_COST_USD:,.0f} USD"
        )
    if kind == "duration" and not 0 <= number <= _DURATION_LIMITS[key]:
        raise InvalidValue(
            RejectReason.OUT_OF_RANGE, f"{key} is not a duration within 0..{_DURATION_LIMITS[key]:g}"
        )
    return number


def _normalize(key: str, kind: _Kind, value: AttrValue) -> AttrValue:
    """The value `semconv` can rely on for an attribute of `kind`; raises `InvalidValue`."""
    if kind == "count" or kind == "number" or kind == "cost" or kind == "duration":
        return _checked_number(key, kind, value)
    if kind == "vector":
        return check_vector(key, value)
    if kind == "identifier":
        if isinstance(value, str) and len(value) > MAX_IDENTIFIER_CHARS:
            raise _too_long(key, len(value), MAX_IDENTIFIER_CHARS, "an identifier")
        _check_size(key, value)
        return value
    raise InvalidValue(
        RejectReason.INVALID_ATTRIBUTE_INDEX,
        f"key {key!r:.60} holds a list index over {MAX_ATTRIBUTE_INDEX:,}",
    )


def finish_attributes(
    raw: Iterable[tuple[str, AttrValue]], batch: DecodedBatch, where: str, dims: set[int] | None
) -> tuple[Attributes, int]:
    """Typed attributes and their estimated size; raises `InvalidValue` for a span-level problem.

    `dims` collects vector lengths (span attributes only); None means vectors
    are not checked here (events, resources).
    """
    attributes: Attributes = {}
    size = 0
    for key, value in raw:
        if len(key) > MAX_KEY_CHARS:
            drop_long_key(key, batch, where)
            continue
        kind = kind_of(key)
        # most values: nothing to check beyond an identifier's length, sized without `value_size`;
        # text of any length is kept: a span is cut to fit `MAX_SPAN_BYTES` as a whole (`span_size.py`)
        if type(value) is str and (
            kind is None or (kind == "identifier" and len(value) <= MAX_IDENTIFIER_CHARS)
        ):
            attributes[key] = value
            size += ENTRY_OVERHEAD + len(key) + STR_OVERHEAD + len(value)
            continue
        size += add_checked(attributes, key, value, kind, batch, where, dims)
    return attributes, size


def drop_long_key(key: str, batch: DecodedBatch, where: str) -> None:
    """Count an attribute dropped for a key over `MAX_KEY_CHARS`: under its index when that is what
    makes it long (`retrieval.documents.<5,000 digits>.document.id`); such keys never reach `kind_of`."""
    shown = f"key {key[:40]!r}..."
    if _bad_index(key):
        problem = InvalidValue(
            RejectReason.INVALID_ATTRIBUTE_INDEX, f"{shown} holds a list index over {MAX_ATTRIBUTE_INDEX:,}"
        )
    else:
        problem = _too_long(shown, len(key), MAX_KEY_CHARS, "a key")
    batch._drop(problem.reason, f"{where}: {problem.detail}", where, f"{key[:40]}...")


def add_checked(
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
    except InvalidValue as problem:
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
    return ENTRY_OVERHEAD + len(key) + value_size(value)


# ---------------------------------------------------------------- span rules of every encoding


def check_interval(start: int, end: int, where: str) -> None:
    """Raise `InvalidValue` (INVALID_TIME) unless 0 < start <= end <= `MAX_TIME_NS`."""
    if start <= 0 or end < start:
        raise InvalidValue(
            RejectReason.INVALID_TIME,
            f"{where}: start {ns_text(start)} / end {ns_text(end)} is not a valid interval",
        )
    if end > MAX_TIME_NS:
        late_start = start > MAX_TIME_NS
        raise time_too_late("start" if late_start else "end", start if late_start else end, where)


def ns_text(ns: int) -> str:
    text = str(ns)
    return text if len(text) <= 24 else f"{text[:20]}...({len(text)} digits)"


def time_too_late(what: str, ns: int, where: str) -> InvalidValue:
    return InvalidValue(
        RejectReason.INVALID_TIME,
        f"{where}: {what} time {ns_text(ns)} ns is after the latest time ragmon keeps "
        f"({MAX_TIME_NS} ns, 2262-04-11)",
    )


def check_name(name: str, where: str) -> None:
    if len(name) > MAX_NAME_CHARS:
        raise InvalidValue(
            RejectReason.MALFORMED_SPAN,
            f"{where}: a name of {len(name):,} characters is over the limit of {MAX_NAME_CHARS:,}",
        )


def check_dims(attributes: Attributes, vector_dims: set[int], dims: VectorDims, where: str) -> None:
    if not vector_dims:
        return
    problem = dims.check(embedding_model_of(attributes) or "", vector_dims)
    if problem is not None:
        raise InvalidValue(RejectReason.VECTOR_DIMENSION_MISMATCH, f"{where}: {problem}")


def resource_too_large(resource: Attributes, wire_size: int, batch: DecodedBatch, r: int) -> str | None:
    """Cut a resource over `MAX_RESOURCE_BYTES` to fit (`span_size.fit_resource`); None when it fits,
    else why its spans are rejected."""
    if wire_size <= MAX_RESOURCE_BYTES or fit_resource(resource, batch, f"resource {r}") is not None:
        return None
    return f"its resource of {wire_size:,} bytes does not fit the {MAX_RESOURCE_BYTES:,}-byte limit"


def check_tenant(tenant: str) -> None:
    if not isinstance(tenant, str) or not tenant:
        raise ValueError(f"tenant must be a non-empty string, got {tenant!r}")
