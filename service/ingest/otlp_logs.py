"""OTLP log decoding: GenAI event records -> `LogEvent`s for the assembler; any other record ignored.

The OTel GenAI instrumentations (e.g. `opentelemetry-instrumentation-openai-v2`
with message capture on) send the content of a model call as log records, not
as span attributes: `gen_ai.system.message`, `gen_ai.user.message`,
`gen_ai.assistant.message`, `gen_ai.tool.message`, `gen_ai.choice`, and in
newer versions one `gen_ai.client.inference.operation.details` record with
`gen_ai.input.messages` / `gen_ai.output.messages`. Each carries the trace and
span id of its call, so it is kept as a `LogEvent` and joined to that span
when the trace is built, whether it arrived before, with or after the span.

Rules, per record (the good records of a request are kept either way):

  ==============================  ==============================================
  outcome                         when
  ==============================  ==============================================
  kept (a `LogEvent`)             its event name (`eventName`, else the
                                  `event.name` attribute) starts with `gen_ai.`
                                  and it has valid trace and span ids
  rejected `invalid_trace_id`     a GenAI event whose trace id is missing, not
                                  16 bytes, or all zero: it cannot be joined
  rejected `invalid_span_id`      the same for its span id
  rejected `malformed_span`       (JSON) the record is not an object, or its
                                  attributes are not a list
  rejected `invalid_time`         its time is not within 0..`otlp.MAX_TIME_NS`
  ignored                         any other log record (application logs):
                                  answered as accepted, counted, not stored
  ==============================  ==============================================

Rejected records are answered in `partial_success.rejected_log_records` and
counted under `ragmon_ingest_rejected_total{reason}`; ignored ones under
`ragmon_ignored_log_records_total`. A body that cannot be read at all raises
`DecodeError`, as for traces (`otlp.py`, whose value rules this applies, and the value
readers of `otlp_json.py` and `otlp_protobuf.py`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

from google.protobuf.message import DecodeError as ProtobufDecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

from service.conventions.spans import Attributes, AttrValue, LogEvent
from service.errors import DecodeError
from service.ingest.decoded import DROPPED_KEY, mark
from service.ingest.otlp import (
    MAX_TIME_NS,
    DecodedBatch,
    check_tenant,
    finish_attributes,
    resource_too_large,
    value_size,
)
from service.ingest.otlp_body import decompress
from service.ingest.otlp_encode import event_bytes
from service.ingest.otlp_json import (
    HEX16,
    HEX32,
    ZERO_SPAN,
    ZERO_TRACE,
    json_id,
    json_int,
    json_pairs,
    json_resource,
    json_structure,
    json_value,
)
from service.ingest.otlp_protobuf import pb_attributes, pb_value
from service.ingest.span_size import MAX_SPAN_BYTES, fit_event
from service.labels import RejectReason

__all__ = ["GENAI_EVENT_PREFIX", "DecodedLogs", "decode_json", "decode_logs_body", "decode_protobuf"]

GENAI_EVENT_PREFIX = "gen_ai."
_EVENT_NAME_ATTRIBUTE = "event.name"
_EVENT_OVERHEAD = 400


@dataclass(slots=True)
class DecodedLogs(DecodedBatch):
    """The GenAI events of one logs export request (in `spans`, as `LogEvent`s) and what was refused.

    `rejected_spans` counts rejected log records (OTLP `rejected_log_records`);
    `ignored` counts records that are not GenAI events."""

    ignored: int = 0
    unit: ClassVar[str] = "log records"

    @property
    def log_events(self) -> list[LogEvent]:
        return [event for event in self.spans if isinstance(event, LogEvent)]


def _event_name(record_name: str, attributes: Attributes) -> str:
    if record_name:
        return record_name
    name = attributes.get(_EVENT_NAME_ATTRIBUTE)
    return name if isinstance(name, str) else ""


def _with_body(attributes: Attributes, body: AttrValue) -> Attributes:
    """The record's attributes with its body's fields merged in (a non-map body under "content")."""
    if isinstance(body, dict):
        return {**attributes, **body}
    if body is not None:
        return {**attributes, "content": body}
    return attributes


def _event(
    trace_id: str | None,
    span_id: str | None,
    name: str,
    time_ns: int,
    attributes: Attributes,
    resource: Attributes,
    tenant: str,
    size: int,
    where: str,
) -> LogEvent:
    """A `LogEvent`; raises `_Unjoinable` when its ids cannot join it to a span."""
    if trace_id is None:
        raise _Unjoinable(RejectReason.INVALID_TRACE_ID, f"{where}: {name} has no valid trace id")
    if span_id is None:
        raise _Unjoinable(RejectReason.INVALID_SPAN_ID, f"{where}: {name} has no valid span id")
    return LogEvent(
        trace_id=trace_id,
        span_id=span_id,
        name=name,
        time_ns=time_ns,
        attributes=attributes,
        resource=resource,
        tenant=tenant,
        size_bytes=_EVENT_OVERHEAD + len(name) + size,
    )


def _check_time(time_ns: int, where: str) -> None:
    if not 0 <= time_ns <= MAX_TIME_NS:
        raise _Unjoinable(
            RejectReason.INVALID_TIME, f"{where}: time {time_ns} is outside 0..{MAX_TIME_NS} ns"
        )


class _Unjoinable(Exception):
    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


# ---------------------------------------------------------------- protobuf


def _pb_id(raw: bytes, length: int) -> str | None:
    return raw.hex() if len(raw) == length and any(raw) else None


def _pb_record(
    record: LogRecord, resource: Attributes, tenant: str, batch: DecodedLogs, where: str
) -> LogEvent | None:
    trace_id, span_id = _pb_id(record.trace_id, 16), _pb_id(record.span_id, 8)
    attributes, size = pb_attributes(record.attributes, batch, _named(where, trace_id, span_id), None)
    name = _event_name(record.event_name, attributes)
    if not name.startswith(GENAI_EVENT_PREFIX):
        return None
    body = pb_value(record.body) if record.HasField("body") else None
    time_ns = record.time_unix_nano or record.observed_time_unix_nano
    _check_time(time_ns, where)
    return _event(
        trace_id,
        span_id,
        name,
        time_ns,
        _with_body(attributes, body),
        resource,
        tenant,
        size + value_size(body),
        where,
    )


def decode_request(request: ExportLogsServiceRequest, tenant: str) -> DecodedLogs:
    """The GenAI events of an already-parsed request; never raises for per-record problems."""
    check_tenant(tenant)
    batch = DecodedLogs()
    for r, resource_logs in enumerate(request.resource_logs):
        resource, _ = pb_attributes(resource_logs.resource.attributes, batch, f"resource {r}", None)
        batch.dropped_keys.clear()  # a resource is not marked: what it lost is counted and logged
        too_large = resource_too_large(resource, resource_logs.resource.ByteSize(), batch, r)
        for s, scope_logs in enumerate(resource_logs.scope_logs):
            for i, record in enumerate(scope_logs.log_records):
                where = f"resourceLogs[{r}].scopeLogs[{s}].logRecords[{i}]"
                try:
                    if too_large is not None:
                        raise _Unjoinable(RejectReason.SPAN_TOO_LARGE, f"{where}: {too_large}")
                    _keep(batch, _pb_record(record, resource, tenant, batch, where), where)
                except _Unjoinable as problem:
                    batch._reject(problem.reason, problem.detail)
    return batch


def decode_protobuf(body: bytes, tenant: str) -> DecodedLogs:
    """Decode an OTLP/HTTP (or gRPC) protobuf logs body; raises `DecodeError` when it is not one."""
    try:
        request = ExportLogsServiceRequest.FromString(bytes(body))
    except ProtobufDecodeError as exc:
        raise DecodeError(f"body is not a valid OTLP ExportLogsServiceRequest protobuf: {exc}") from exc
    return decode_request(request, tenant)


# ---------------------------------------------------------------- OTLP/JSON


def _json_record(
    record: Any, resource: Attributes, tenant: str, batch: DecodedLogs, where: str
) -> LogEvent | None:
    if not isinstance(record, dict) or not isinstance(record.get("attributes", []), list):
        raise _Unjoinable(RejectReason.MALFORMED_SPAN, f"{where}: record is not an object with attributes")
    trace_id = json_id(record.get("traceId"), HEX32, ZERO_TRACE)
    span_id = json_id(record.get("spanId"), HEX16, ZERO_SPAN)
    named = _named(where, trace_id, span_id)
    attributes, size = finish_attributes(
        json_pairs(record.get("attributes", []), batch, named), batch, named, None
    )
    raw_name = record.get("eventName", "")
    name = _event_name(raw_name if isinstance(raw_name, str) else "", attributes)
    if not name.startswith(GENAI_EVENT_PREFIX):
        return None
    body: AttrValue = None
    if record.get("body") is not None:
        try:
            body = json_value(record["body"])
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            batch._drop(
                RejectReason.INVALID_ATTRIBUTE,
                f"{where}: body is not a valid AnyValue ({exc})",
                named,
                "body",
            )
    try:
        time_ns = json_int(record.get("timeUnixNano", 0)) or json_int(record.get("observedTimeUnixNano", 0))
    except ValueError as exc:
        raise _Unjoinable(RejectReason.INVALID_TIME, f"{where}: {exc}") from None
    _check_time(time_ns, where)
    return _event(
        trace_id,
        span_id,
        name,
        time_ns,
        _with_body(attributes, body),
        resource,
        tenant,
        size + value_size(body),
        where,
    )


def decode_json(body: bytes, tenant: str) -> DecodedLogs:
    """Decode an OTLP/HTTP JSON logs body; raises `DecodeError` when it is not a valid request."""
    check_tenant(tenant)
    try:
        document = json.loads(bytes(body).decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DecodeError(f"body is not valid UTF-8 (byte {exc.start}: {exc.reason})") from exc
    except (ValueError, RecursionError) as exc:
        raise DecodeError(f"body is not valid JSON: {exc}") from exc
    batch = DecodedLogs()
    for r, resource_logs in enumerate(json_structure(document, "resourceLogs", "request")):
        where_r = f"resourceLogs[{r}]"
        scopes = json_structure(resource_logs, "scopeLogs", where_r)
        resource, too_large = json_resource(resource_logs, batch, where_r, r)
        for s, scope_logs in enumerate(scopes):
            where_s = f"{where_r}.scopeLogs[{s}]"
            for i, record in enumerate(json_structure(scope_logs, "logRecords", where_s)):
                where = f"{where_s}.logRecords[{i}]"
                try:
                    if too_large is not None:
                        raise _Unjoinable(RejectReason.SPAN_TOO_LARGE, f"{where}: {too_large}")
                    _keep(batch, _json_record(record, resource, tenant, batch, where), where)
                except _Unjoinable as problem:
                    batch._reject(problem.reason, problem.detail)
    return batch


def _named(where: str, trace_id: str | None, span_id: str | None) -> str:
    """Where a record is, by its ids when it has them: what its dropped values are logged under."""
    return f"log record {trace_id}/{span_id}" if trace_id and span_id else where


def _keep(batch: DecodedLogs, event: LogEvent | None, where: str) -> None:
    """A GenAI event joins the batch, marked with the keys it lost and cut to fit `MAX_SPAN_BYTES`
    (raises `_Unjoinable` when it cannot fit); None (any other record) is counted as ignored."""
    dropped, batch.dropped_keys = batch.dropped_keys, []
    if event is None:
        batch.ignored += 1
        return
    if dropped:
        mark(event.attributes, DROPPED_KEY, dropped)
    if event.size_bytes * 4 > MAX_SPAN_BYTES:  # text is at most 4 bytes a character on the wire
        before = len(event_bytes(event))
        after = fit_event(event, batch, _named(where, event.trace_id, event.span_id))
        if after is None:
            raise _Unjoinable(
                RejectReason.SPAN_TOO_LARGE,
                f"{where}: {event.name} of {before:,} bytes does not fit the {MAX_SPAN_BYTES:,}-byte "
                "limit even with its text truncated",
            )
        event.size_bytes = max(_EVENT_OVERHEAD + after, event.size_bytes - (before - after))
    batch.spans.append(event)


def decode_logs_body(body: bytes, *, json_body: bool, encoding: str, tenant: str, limit: int) -> DecodedLogs:
    """An OTLP logs body as it came off the wire (maybe compressed) -> `DecodedLogs`; module-level
    with plain arguments, so a worker process can run it."""
    plain = decompress(body, encoding, limit)
    return decode_json(plain, tenant) if json_body else decode_protobuf(plain, tenant)
