"""Receivers: OTLP/HTTP (`POST /v1/traces`) and the plain JSON API (`/api/v1/traces`, `/api/v1/feedback`).

Order of work per request (STYLE.md §5): size cap (413, middleware) →
content type and encoding (415) → refuse early when the pipeline is behind →
decompress with a cap and decode in a worker process (`pool.py`) →
hand the spans to the pipeline, which refuses with `QueueFull`
(503 + Retry-After) when the bus is over capacity → answer. An OTLP request
with some bad spans is answered 200 with `partial_success` (rejected count and
message) and its good spans are kept, as the OTLP spec says; one whose spans
lost a value out of range, or had oversize text cut to fit, gets the same
answer with 0 rejected (OTLP's warning), in embedded and distributed mode
alike: nothing that one span carries costs the request a 413. Errors are
answered in the caller's encoding: a protobuf `google.rpc.Status` for
protobuf callers, its JSON form for JSON callers.

Nothing slow happens here; every rejection is counted by reason.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request, Response
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from pydantic import ValidationError

from service.conventions.usage import call_cost
from service.errors import PayloadTooLarge, UnsupportedMediaType
from service.ingest.auth import TenantDep
from service.ingest.otlp import DecodedBatch
from service.ingest.otlp_metrics import check_metrics_body
from service.ingest.responses import JSON, PROTOBUF, media_type_of
from service.ingest.span_size import MAX_SPAN_BYTES
from service.ingest.target import IngestDep, IngestTarget
from service.ingest.wal import LoggedRequest
from service.ingest.wire import (
    FeedbackIn,
    FeedbackOut,
    RejectedRecord,
    TraceBatchIn,
    TraceBatchOut,
    TraceIn,
    hash_user_id,
    rejection_reason,
)
from service.model import (
    Chunk,
    Feedback,
    ModelUsage,
    QueryEmbedding,
    RagTrace,
    Retrieval,
    Timings,
)

otlp_router = APIRouter(tags=["otlp"])
api_router = APIRouter(prefix="/api/v1", tags=["ingest"])


async def _otlp_body(request: Request) -> tuple[bytes, str, str]:
    """(body, media type, content encoding) of an OTLP request; 415 for anything but protobuf or JSON."""
    media_type = media_type_of(request.headers.get("content-type"))
    if media_type not in (PROTOBUF, JSON):
        raise UnsupportedMediaType(
            f"Content-Type {media_type or '(none)'!r} is not OTLP; use {PROTOBUF} or {JSON}"
        )
    return await request.body(), media_type, request.headers.get("content-encoding", "")


def _otlp_answer(
    media_type: str, answer: Message, rejected_field: str, decoded: DecodedBatch | None
) -> Response:
    """200 with the export response in the caller's encoding, with `partial_success` when something
    was refused. OTLP allows a message with zero rejected items as a warning (dropped values)."""
    refused = decoded is not None and bool(decoded.rejected_spans or decoded.error_message)
    if media_type == JSON:
        payload: dict[str, Any] = {}
        if refused and decoded is not None:
            camel = "".join(w.capitalize() if i else w for i, w in enumerate(rejected_field.split("_")))
            payload["partialSuccess"] = {
                camel: str(decoded.rejected_spans),
                "errorMessage": decoded.error_message,
            }
        return Response(json.dumps(payload), 200, media_type=JSON)
    if refused and decoded is not None:
        partial = answer.partial_success
        setattr(partial, rejected_field, decoded.rejected_spans)
        partial.error_message = decoded.error_message
    return Response(answer.SerializeToString(), 200, media_type=PROTOBUF)


@otlp_router.post(
    "/v1/traces",
    summary="OTLP/HTTP trace export (protobuf or JSON, optionally gzip)",
    response_class=Response,
)
async def export_traces(request: Request, tenant: TenantDep, pipeline: IngestDep) -> Response:
    raw, media_type, encoding = await _otlp_body(request)
    pipeline.check_room()  # refuse before decoding what could not be taken
    decoded = await pipeline.ingest_pool.decode(
        raw,
        json_body=media_type == JSON,
        encoding=encoding,
        tenant=tenant,
        limit=pipeline.config.server.max_body_bytes,
    )
    pipeline.ingest_pool.account(decoded)
    logged = LoggedRequest("otlp_traces", tenant, raw, media_type, encoding, "otlp_http")
    await pipeline.accept_decoded(decoded, receiver="otlp_http", logged=logged)
    pipeline.phoenix_forward.offer(raw, media_type, encoding)
    return _otlp_answer(media_type, trace_service_pb2.ExportTraceServiceResponse(), "rejected_spans", decoded)


@otlp_router.post(
    "/v1/logs",
    summary="OTLP/HTTP log export: GenAI events (message content) are joined to their spans; "
    "other records are ignored",
    response_class=Response,
)
async def export_logs(request: Request, tenant: TenantDep, pipeline: IngestDep) -> Response:
    raw, media_type, encoding = await _otlp_body(request)
    pipeline.check_room()
    decoded = await pipeline.ingest_pool.decode_logs(
        raw,
        json_body=media_type == JSON,
        encoding=encoding,
        tenant=tenant,
        limit=pipeline.config.server.max_body_bytes,
    )
    pipeline.ingest_pool.account(decoded)
    pipeline.metrics.ignored_log_records.labels(receiver="otlp_http").inc(decoded.ignored)
    logged = LoggedRequest("otlp_logs", tenant, raw, media_type, encoding, "otlp_http")
    await pipeline.accept_log_events(decoded.log_events, receiver="otlp_http", logged=logged)
    return _otlp_answer(
        media_type, logs_service_pb2.ExportLogsServiceResponse(), "rejected_log_records", decoded
    )


@otlp_router.post(
    "/v1/metrics",
    summary="OTLP/HTTP metric export: checked, answered and not stored (ragmon reads no app metrics)",
    response_class=Response,
)
async def export_metrics(request: Request, tenant: TenantDep, pipeline: IngestDep) -> Response:
    raw, media_type, encoding = await _otlp_body(request)
    await asyncio.to_thread(
        check_metrics_body,
        raw,
        json_body=media_type == JSON,
        encoding=encoding,
        limit=pipeline.config.server.max_body_bytes,
    )
    pipeline.metrics.ignored_metrics_requests.labels(receiver="otlp_http").inc()
    return _otlp_answer(
        media_type, metrics_service_pb2.ExportMetricsServiceResponse(), "rejected_data_points", None
    )


def trace_from_wire(record: TraceIn, tenant: str, pipeline: IngestTarget) -> RagTrace:
    """A validated JSON-API record → `RagTrace`, pricing model usage the app did not price."""
    retrieval = record.retrieval
    chunks: tuple[Chunk, ...] = ()
    reranked: tuple[Chunk, ...] = ()
    if retrieval is not None:
        chunks = tuple(
            Chunk(id=c.id, rank=i, score=c.score, content=c.content, metadata=c.metadata)
            for i, c in enumerate(retrieval.chunks)
        )
        reranked = tuple(
            Chunk(id=c.id, rank=i, score=c.score, content=c.content, metadata=c.metadata)
            for i, c in enumerate(retrieval.reranked)
        )
    usage = []
    for u in record.usage:
        sent = u.model_fields_set  # a count not sent is unknown, not 0
        input_tokens = u.input_tokens if "input_tokens" in sent else None
        output_tokens = u.output_tokens if "output_tokens" in sent else None
        cost, source = call_cost(u.model, input_tokens, output_tokens, u.cost_usd, pipeline.prices)
        if input_tokens is not None or output_tokens is not None:
            # one count sent: the other is 0, as for a span (`usage.span_call`)
            input_tokens, output_tokens = input_tokens or 0, output_tokens or 0
        usage.append(
            ModelUsage(
                model=u.model,
                kind=u.kind,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                cost_usd=cost,
                cost_source=source,
            )
        )
    start = record.start_time or datetime.now(UTC)
    if start.tzinfo is None:
        start = start.replace(tzinfo=UTC)
    return RagTrace(
        trace_id=record.trace_id,
        tenant=tenant,
        app=record.app,
        release=record.release,
        intent=record.intent,
        session_id=record.session_id,
        user_hash=hash_user_id(record.user_id),
        start_time=start,
        query=record.query,
        query_embedding=(
            QueryEmbedding(model=record.query_embedding.model, vector=tuple(record.query_embedding.vector))
            if record.query_embedding
            else None
        ),
        retrieval=Retrieval(
            retriever=retrieval.retriever if retrieval else None,
            k=retrieval.k if retrieval else None,
            chunks=chunks,
            filter=retrieval.filter if retrieval else None,
            excluded_ids=tuple(retrieval.excluded_ids) if retrieval else (),
            reranker_input=chunks if reranked else (),
            reranker_output=reranked,
        ),
        answer=record.answer,
        cited_chunk_ids=tuple(record.cited_chunk_ids),
        timings=Timings(**record.timings.model_dump()),
        usage=tuple(usage),
        is_regeneration=record.is_regeneration,
        regeneration_source="attribute" if record.is_regeneration else None,
        probe_run_id=record.probe_run_id,
        probe_question_id=record.probe_question_id,
        source="json",
    )


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "record"
    return f"{where}: {first['msg']}"


def _may_hold_a_large_record(request: Request) -> bool:
    """Whether a JSON-API body may hold a record whose `RagTrace` is over `MAX_SPAN_BYTES` (what one
    Kafka record carries, and so what either mode keeps). A trace's JSON is at most about twice its
    record's (the reranker's input repeats the chunks): a body under a third of the limit holds none,
    and its records are not serialized to be measured."""
    length = request.headers.get("content-length", "")
    return not length.isdigit() or int(length) * 3 > MAX_SPAN_BYTES


@api_router.post(
    "/traces",
    response_model=TraceBatchOut,
    summary="Ingest RAG traces from apps without OpenTelemetry",
    responses={422: {"description": "every record was invalid"}, 503: {"description": "busy: retry later"}},
)
async def ingest_json_traces(
    batch: TraceBatchIn, request: Request, tenant: TenantDep, pipeline: IngestDep
) -> Any:
    """Each record is validated on its own (schema: `TraceIn`); good ones are kept, bad ones listed."""
    # in a thread: thousands of records of one body, validated and converted on the event loop,
    # held every other request of every tenant for as long
    measure = _may_hold_a_large_record(request)
    accepted, rejected = await asyncio.to_thread(_validated, batch, tenant, pipeline, measure)
    if not accepted:
        return Response(TraceBatchOut(accepted=0, rejected=rejected).model_dump_json(), 422, media_type=JSON)
    await pipeline.accept_traces(accepted)
    return TraceBatchOut(accepted=len(accepted), rejected=rejected)


def _validated(
    batch: TraceBatchIn, tenant: str, pipeline: IngestTarget, measure: bool
) -> tuple[list[RagTrace], list[RejectedRecord]]:
    """The batch's valid records as traces, and the invalid ones (each counted by reason); `measure`:
    whether a record's trace may be over `MAX_SPAN_BYTES` and must be serialized to be measured."""
    accepted: list[RagTrace] = []
    rejected: list[RejectedRecord] = []
    dims: dict[str | None, int] = {}
    for index, raw in enumerate(batch.traces):
        try:
            record = TraceIn.model_validate(raw)
        except ValidationError as exc:
            rejected.append(RejectedRecord(index=index, error=_first_error(exc)))
            pipeline.metrics.reject(rejection_reason(exc))
            continue
        if record.query_embedding is not None:
            model, dim = record.query_embedding.model, len(record.query_embedding.vector)
            if dims.setdefault(model, dim) != dim:
                rejected.append(
                    RejectedRecord(
                        index=index,
                        error=f"query_embedding.vector: dimension {dim} differs from {dims[model]} "
                        f"of an earlier record for model {model!r}",
                    )
                )
                pipeline.metrics.reject("vector_dimension_mismatch")
                continue
        trace = trace_from_wire(record, tenant, pipeline)
        size = len(trace.model_dump_json()) if measure else 0
        if size > MAX_SPAN_BYTES:
            rejected.append(
                RejectedRecord(
                    index=index,
                    error=f"the trace is {size:,} bytes stored, over the {MAX_SPAN_BYTES:,}-byte limit of "
                    "one trace: send its longest texts (chunk contents, answer) shorter",
                )
            )
            pipeline.metrics.reject(PayloadTooLarge.reason)
            continue
        accepted.append(trace)
    return accepted, rejected


@api_router.post(
    "/feedback",
    response_model=FeedbackOut,
    summary="Thumbs up/down and regenerate events, joined to traces by trace id",
)
async def ingest_feedback(
    events: FeedbackIn | list[FeedbackIn], tenant: TenantDep, pipeline: IngestDep
) -> FeedbackOut:
    """Feedback may arrive before its trace is assembled; it is joined when either is read."""
    items = events if isinstance(events, list) else [events]
    records = [
        Feedback(
            event_id=e.resolved_event_id(),
            trace_id=e.trace_id,
            tenant=tenant,
            app=e.app,
            kind=e.kind,
            reason=e.reason,
            text=e.text,
            time=e.resolved_time(),
        )
        for e in items
    ]
    await pipeline.accept_feedback(records)
    return FeedbackOut(accepted=len(records))
