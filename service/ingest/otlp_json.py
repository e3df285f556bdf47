"""OTLP/JSON traces: a JSON body walked straight into `Span`s, with the rules of `otlp.py`.

Separate from `otlp_protobuf.py` because the two share the rules, not the
reading: JSON is decoded in one step, every value typed and checked as it
is read, and its answer reports everything. `otlp_logs.py` reads log
records' JSON with the helpers here (`json_value`, `json_pairs`, `json_id`).

OTLP/JSON is read as the OTLP specification writes it: lowerCamelCase field
names, trace and span ids as hex (not base64), enums as integers, 64-bit
integers as strings or numbers, `doubleValue` also as "NaN"/"Infinity",
`bytesValue` as base64, and unknown fields ignored. The JSON tree is walked
directly: `json_format.Parse` would read the hex ids as base64, and on a
200-span request it alone took ~6x as long as all of `decode_json`.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from service.conventions.spans import Attributes, AttrValue, Span, SpanEvent
from service.errors import DecodeError
from service.ingest.decoded import DROPPED_KEY, DecodedBatch, mark
from service.ingest.otlp import (
    EVENT_OVERHEAD,
    MAX_KEY_CHARS,
    MAX_TIME_NS,
    SPAN_OVERHEAD,
    InvalidValue,
    VectorDims,
    check_dims,
    check_interval,
    check_name,
    check_tenant,
    finish_attributes,
    ns_text,
    resource_too_large,
    time_too_late,
)
from service.ingest.otlp_encode import resource_bytes, span_bytes
from service.ingest.span_size import MAX_RESOURCE_BYTES, MAX_SPAN_BYTES, fit_span
from service.labels import RejectReason

__all__ = [
    "HEX16",
    "HEX32",
    "ZERO_SPAN",
    "ZERO_TRACE",
    "decode_json",
    "json_id",
    "json_int",
    "json_pairs",
    "json_resource",
    "json_structure",
    "json_value",
]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
HEX32 = re.compile(r"[0-9a-fA-F]{32}")
HEX16 = re.compile(r"[0-9a-fA-F]{16}")
ZERO_TRACE = "0" * 32
ZERO_SPAN = "0" * 16
_SPECIAL_DOUBLES = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


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
            raise _OutOfRange(f"intValue {ns_text(number)} is outside the signed 64-bit range")
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
    span: Any, resource: Attributes, tenant: str, batch: DecodedBatch, dims: VectorDims, where: str
) -> Span:
    if not isinstance(span, dict):
        raise InvalidValue(RejectReason.MALFORMED_SPAN, f"{where}: span is not an object")
    trace_id = json_id(span.get("traceId"), HEX32, ZERO_TRACE)
    if trace_id is None:
        raise InvalidValue(
            RejectReason.INVALID_TRACE_ID,
            f"{where}: traceId {span.get('traceId')!r:.40} is not 32 hex digits, non-zero",
        )
    span_id = json_id(span.get("spanId"), HEX16, ZERO_SPAN)
    if span_id is None:
        raise InvalidValue(
            RejectReason.INVALID_SPAN_ID,
            f"{where}: spanId {span.get('spanId')!r:.40} is not 16 hex digits, non-zero",
        )
    raw_parent = span.get("parentSpanId") or None
    parent: str | None = None
    if raw_parent is not None:
        if not isinstance(raw_parent, str) or not HEX16.fullmatch(raw_parent):
            raise InvalidValue(
                RejectReason.INVALID_PARENT_SPAN_ID,
                f"{where}: parentSpanId {raw_parent!r:.40} is not 16 hex digits",
            )
        parent = None if raw_parent.lower() == ZERO_SPAN else raw_parent.lower()
    try:
        start = json_int(span.get("startTimeUnixNano", 0))
        end = json_int(span.get("endTimeUnixNano", 0))
    except ValueError as exc:
        raise InvalidValue(RejectReason.INVALID_TIME, f"{where}: {exc}") from None
    check_interval(start, end, where)
    raw_attributes, raw_events = span.get("attributes", []), span.get("events", [])
    if not isinstance(raw_attributes, list) or not isinstance(raw_events, list):
        raise InvalidValue(RejectReason.MALFORMED_SPAN, f"{where}: attributes and events must be lists")
    name = span.get("name", "")
    name = name if isinstance(name, str) else ""
    check_name(name, where)
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
        size += EVENT_OVERHEAD + len(event_name) + event_size
    check_dims(attributes, vector_dims, dims, where)
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
        size_bytes=SPAN_OVERHEAD + len(name) + size,
    )
    _fit_decoded(decoded, batch, where)
    return decoded


def _fit_decoded(span: Span, batch: DecodedBatch, where: str) -> None:
    """Cut a decoded span to fit `MAX_SPAN_BYTES` (`span_size.fit_span`); raises `InvalidValue`
    (SPAN_TOO_LARGE) when it cannot. Only a span whose estimate says it may be near the limit is
    encoded to be measured: text is at most 4 bytes a character on the wire."""
    if span.size_bytes * 4 <= MAX_SPAN_BYTES:
        return
    before = len(span_bytes(span))
    after = fit_span(span, batch, where)
    if after is None:
        raise InvalidValue(
            RejectReason.SPAN_TOO_LARGE,
            f"{where} of {before:,} bytes does not fit the {MAX_SPAN_BYTES:,}-byte limit even with its "
            "text truncated",
        )
    span.size_bytes = max(SPAN_OVERHEAD + after, span.size_bytes - (before - after))


def _json_event_head(raw_event: Any, where: str) -> tuple[str, int, list[Any]]:
    """An OTLP/JSON event's name, time and raw attributes; raises `InvalidValue` where it rejects its span."""
    if not isinstance(raw_event, dict) or not isinstance(raw_event.get("attributes", []), list):
        raise InvalidValue(
            RejectReason.MALFORMED_SPAN, f"{where}: an event is not an object with an attribute list"
        )
    event_name = raw_event.get("name", "")
    event_name = event_name if isinstance(event_name, str) else ""
    check_name(event_name, where)
    try:
        event_time = json_int(raw_event.get("timeUnixNano", 0))
    except ValueError as exc:
        raise InvalidValue(RejectReason.INVALID_TIME, f"{where}: event {event_name!r:.40}: {exc}") from None
    if event_time < 0:
        raise InvalidValue(
            RejectReason.INVALID_TIME, f"{where}: event {event_name!r:.40} has a negative time"
        )
    if event_time > MAX_TIME_NS:
        raise time_too_late(f"event {event_name!r:.40}", event_time, where)
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


def json_resource(
    entry: dict[str, Any], batch: DecodedBatch, where: str, r: int
) -> tuple[Attributes, str | None]:
    """The attributes of the `resource` of a request's `r`-th entry (resourceSpans or resourceLogs,
    at `where`), and why it is too large when it is (every item under it is then rejected)."""
    at = f"{where}.resource"
    raw = entry.get("resource") or {}
    resource, size = finish_attributes(
        json_pairs(json_structure(raw, "attributes", at), batch, at), batch, at, None
    )
    batch.dropped_keys.clear()  # a resource is not marked: what it lost is counted and logged
    # text is at most 4 bytes a character on the wire: only a resource near the limit is measured
    if size * 4 <= MAX_RESOURCE_BYTES:
        return resource, None
    return resource, resource_too_large(resource, len(resource_bytes(resource)), batch, r)


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
    dims = VectorDims()
    for r, resource_spans in enumerate(json_structure(document, "resourceSpans", "request")):
        where_r = f"resourceSpans[{r}]"
        scope_list = json_structure(resource_spans, "scopeSpans", where_r)
        resource, too_large = json_resource(resource_spans, batch, where_r, r)
        for s, scope_spans in enumerate(scope_list):
            where_s = f"{where_r}.scopeSpans[{s}]"
            for i, span in enumerate(json_structure(scope_spans, "spans", where_s)):
                where = f"{where_s}.spans[{i}]"
                try:
                    if too_large is not None:
                        raise InvalidValue(RejectReason.SPAN_TOO_LARGE, f"{where}: {too_large}")
                    batch.spans.append(_json_span(span, resource, tenant, batch, dims, where))
                except InvalidValue as problem:
                    batch._reject(problem.reason, problem.detail)
    return batch
