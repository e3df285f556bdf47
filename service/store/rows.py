"""The mapping between records and the store's rows (`tables.py`): pure functions, no engine, no I/O.

The read API and the Kafka worker reuse them:

* `trace_row`, `trace_context`, `feedback_row`, `non_request_row`, `dead_letter_row`: record → row values;
* `trace_record`, `feedback_record`, `dead_letter_record`: row → JSON-ready dict;
  `rag_trace_from_record`: such a dict → `RagTrace` again.

Text is made storable the same way on every database: NUL characters become
U+FFFD (PostgreSQL text cannot hold them) and unpaired surrogates become "?"
(they cannot be encoded as UTF-8). Non-finite floats become None (JSON has no
NaN). Datetimes are stored in UTC; a naive datetime is taken to be UTC.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.engine import RowMapping

from service.model import Chunk, Feedback, ModelUsage, QueryEmbedding, RagTrace, Retrieval, Timings

__all__ = [
    "MAX_DEAD_LETTER_ERROR_CHARS",
    "MAX_DEAD_LETTER_RECORD_CHARS",
    "Row",
    "dead_letter_record",
    "dead_letter_row",
    "feedback_record",
    "feedback_row",
    "non_request_row",
    "rag_trace_from_record",
    "storable_text",
    "to_utc",
    "trace_context",
    "trace_record",
    "trace_row",
]

Row = RowMapping | Mapping[str, Any]
"""A row as read (`RowMapping`) or as built by hand (a dict with the column names)."""


def to_utc(value: datetime) -> datetime:
    """`value` as an aware UTC datetime; a naive value is taken to be UTC already."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


MAX_DEAD_LETTER_ERROR_CHARS = 4096
"""The longest error text a dead letter keeps (the rest is cut)."""
MAX_DEAD_LETTER_RECORD_CHARS = 64 * 1024
"""The longest record JSON a dead letter keeps: longer records are shortened (long strings and lists
cut, the cuts marked), and cut at this length if that is not enough."""
_MAX_DEAD_LETTER_ID_CHARS = 512
_SHORT_STRING = 1000
_SHORT_LIST = 100


def storable_text(value: str) -> str:
    """`value` with NUL turned into U+FFFD and unpaired surrogates into "?"."""
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    if value.isascii():  # O(1) in CPython, and most text is ASCII
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "replace").decode("utf-8")
    return value


def _text(value: str | None) -> str | None:
    return None if value is None else storable_text(value)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _jsonable(value: Any) -> Any:
    """Metadata values made storable: text cleaned, non-finite floats dropped to None."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, float):
        return _finite(value)
    if isinstance(value, Mapping):
        return {storable_text(str(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _chunk(chunk: Chunk) -> dict[str, Any]:
    return {
        "id": storable_text(chunk.id),
        "rank": chunk.rank,
        "score": _finite(chunk.score),
        "content": _text(chunk.content),
        "metadata": None if chunk.metadata is None else _jsonable(chunk.metadata),
    }


def non_request_row(trace: RagTrace, *, created_at: datetime) -> dict[str, Any]:
    """The `non_request_traces` row for a trace that is not a user request."""
    return {
        "tenant": storable_text(trace.tenant),
        "trace_id": trace.trace_id,
        "app": storable_text(trace.app),
        "kind": trace.kind,
        "release": _text(trace.release),
        "start_time": trace.start_time,
        "total_s": _finite(trace.timings.total_s),
        "embedding_s": _finite(trace.timings.embedding_s),
        "input_tokens": trace.known_input_tokens,
        "output_tokens": trace.known_output_tokens,
        "cost_usd": _finite(trace.cost_usd),
        "span_count": trace.span_count,
        "created_at": created_at,
    }


def trace_row(trace: RagTrace, *, created_at: datetime) -> dict[str, Any]:
    """The `traces` row for a trace: flat columns only, no chunk contents.

    Chunk ids and scores are those of the retrieval list (before reranking),
    in retriever order, matching `top1_score`.
    """
    timings = trace.timings
    chunks = trace.retrieval.chunks
    return {
        "tenant": storable_text(trace.tenant),
        "trace_id": trace.trace_id,
        "app": storable_text(trace.app),
        "release": _text(trace.release),
        "intent": _text(trace.intent),
        "session_id": _text(trace.session_id),
        "user_hash": _text(trace.user_hash),
        "start_time": trace.start_time,
        "total_s": _finite(timings.total_s),
        "embedding_s": _finite(timings.embedding_s),
        "retrieval_s": _finite(timings.retrieval_s),
        "rerank_s": _finite(timings.rerank_s),
        "generation_s": _finite(timings.generation_s),
        "ttft_s": _finite(timings.ttft_s),
        "input_tokens": trace.known_input_tokens,
        "output_tokens": trace.known_output_tokens,
        "cost_usd": _finite(trace.cost_usd),
        "unpriced": bool(trace.unpriced_models),
        "usage_unknown": trace.input_tokens is None or trace.output_tokens is None,
        "query": _text(trace.query),
        "answer": _text(trace.answer),
        "top1_score": _finite(trace.retrieval.top1_score),
        "chunk_ids": [storable_text(c.id) for c in chunks],
        "chunk_scores": [_finite(c.score) for c in chunks],
        "is_regeneration": trace.is_regeneration,
        "regeneration_source": trace.regeneration_source,
        "partial": trace.partial,
        "probe_run_id": _text(trace.probe_run_id),
        "probe_question_id": _text(trace.probe_question_id),
        "span_count": trace.span_count,
        "source": trace.source,
        "created_at": created_at,
    }


def trace_context(trace: RagTrace) -> dict[str, Any]:
    """The `trace_contexts` payload: what a single-trace view needs beyond the row.

    The query vector itself is not kept, only its model and dimension.
    """
    retrieval = trace.retrieval
    embedding = trace.query_embedding
    return {
        # which version of the trace this is: a later one built from more spans replaces it
        "revision": trace.revision,
        "retriever": _text(retrieval.retriever),
        "k": retrieval.k,
        "filter": _text(retrieval.filter),
        "excluded_ids": [storable_text(i) for i in retrieval.excluded_ids],
        "chunks": [_chunk(c) for c in retrieval.chunks],
        "reranker_input": [_chunk(c) for c in retrieval.reranker_input],
        "reranker_output": [_chunk(c) for c in retrieval.reranker_output],
        "cited_chunk_ids": [storable_text(i) for i in trace.cited_chunk_ids],
        "query_embedding": None
        if embedding is None
        else {"model": _text(embedding.model), "dim": embedding.dim},
        "usage": [
            {
                "model": storable_text(u.model),
                "kind": u.kind,
                "input_tokens": u.input_tokens,
                "output_tokens": u.output_tokens,
                "cost_usd": _finite(u.cost_usd),
                "cost_source": u.cost_source,
            }
            for u in trace.usage
        ],
    }


def feedback_row(event: Feedback, *, created_at: datetime) -> dict[str, Any]:
    """The `feedback` row for one feedback event."""
    return {
        "tenant": storable_text(event.tenant),
        "event_id": storable_text(event.event_id),
        "trace_id": event.trace_id,
        "app": _text(event.app),
        "kind": event.kind,
        "reason": _text(event.reason),
        "text": _text(event.text),
        "time": event.time,
        "created_at": created_at,
    }


def _iso(value: datetime | None) -> str | None:
    return None if value is None else to_utc(value).isoformat()


def feedback_record(row: Row) -> dict[str, Any]:
    """A `feedback` row as JSON-ready data."""
    return {
        "event_id": row["event_id"],
        "trace_id": row["trace_id"],
        "app": row["app"],
        "kind": row["kind"],
        "reason": row["reason"],
        "text": row["text"],
        "time": _iso(row["time"]),
    }


def trace_record(
    row: Row,
    *,
    regenerate_feedback: bool = False,
    context: Mapping[str, Any] | None = None,
    feedback: Sequence[Row] | None = None,
) -> dict[str, Any]:
    """A `traces` row as JSON-ready data, with its context and feedback when given.

    `regenerate_feedback` says a `regenerate` feedback event names this trace;
    it makes the trace a regeneration (source "feedback") even when the row
    was written before the feedback arrived. The keys `context` and `feedback`
    are present only when those were passed.
    """
    regeneration_source = row["regeneration_source"]
    is_regeneration = bool(row["is_regeneration"])
    usage_unknown = bool(row["usage_unknown"])
    if not is_regeneration and regenerate_feedback:
        is_regeneration, regeneration_source = True, "feedback"
    record: dict[str, Any] = {
        "trace_id": row["trace_id"],
        "tenant": row["tenant"],
        "app": row["app"],
        "release": row["release"],
        "intent": row["intent"],
        "session_id": row["session_id"],
        "user_hash": row["user_hash"],
        "start_time": _iso(row["start_time"]),
        "query": row["query"],
        "answer": row["answer"],
        "timings": {
            "total_s": row["total_s"],
            "embedding_s": row["embedding_s"],
            "retrieval_s": row["retrieval_s"],
            "rerank_s": row["rerank_s"],
            "generation_s": row["generation_s"],
            "ttft_s": row["ttft_s"],
        },
        # a total of known and unknown counts is unknown
        "input_tokens": None if usage_unknown else row["input_tokens"],
        "output_tokens": None if usage_unknown else row["output_tokens"],
        "cost_usd": row["cost_usd"],
        "unpriced": bool(row["unpriced"]),
        "usage_unknown": usage_unknown,
        "top1_score": row["top1_score"],
        "chunk_ids": list(row["chunk_ids"]),
        "chunk_scores": list(row["chunk_scores"]),
        "flags": {
            "is_regeneration": is_regeneration,
            "regeneration_source": regeneration_source,
            "partial": bool(row["partial"]),
            "probe_run_id": row["probe_run_id"],
            "probe_question_id": row["probe_question_id"],
        },
        "span_count": row["span_count"],
        "source": row["source"],
        "created_at": _iso(row["created_at"]),
    }
    if context is not None:
        record["context"] = dict(context)
    if feedback is not None:
        record["feedback"] = [feedback_record(f) for f in feedback]
    return record


def rag_trace_from_record(record: dict[str, Any]) -> RagTrace:
    """Rebuild a `RagTrace` from a stored record (`trace_record` with its context): what a judge
    reads (query, answer, context, identity), its timings, usage and revision.

    The query vector is not stored, so `query_embedding` carries only its model
    and no vector.
    """
    context = record.get("context") or {}

    def chunks(key: str) -> tuple[Chunk, ...]:
        return tuple(
            Chunk(
                id=c["id"],
                rank=c.get("rank", i),
                score=c.get("score"),
                content=c.get("content"),
                metadata=c.get("metadata"),
            )
            for i, c in enumerate(context.get(key) or [])
        )

    flags = record.get("flags", {})
    embedding = context.get("query_embedding")
    return RagTrace(
        trace_id=record["trace_id"],
        tenant=record["tenant"],
        app=record["app"],
        release=record.get("release"),
        intent=record.get("intent"),
        session_id=record.get("session_id"),
        user_hash=record.get("user_hash"),
        start_time=datetime.fromisoformat(record["start_time"]),
        query=record.get("query"),
        query_embedding=None
        if not embedding
        else QueryEmbedding(model=embedding.get("model"), vector=(0.0,)),
        retrieval=Retrieval(
            retriever=context.get("retriever"),
            k=context.get("k"),
            chunks=chunks("chunks"),
            filter=context.get("filter"),
            excluded_ids=tuple(context.get("excluded_ids") or ()),
            reranker_input=chunks("reranker_input"),
            reranker_output=chunks("reranker_output"),
        ),
        answer=record.get("answer"),
        cited_chunk_ids=tuple(context.get("cited_chunk_ids") or ()),
        timings=Timings(**record.get("timings", {})),
        usage=tuple(
            ModelUsage(
                model=u["model"],
                kind=u.get("kind", "llm"),
                input_tokens=u.get("input_tokens", 0),
                output_tokens=u.get("output_tokens", 0),
                cost_usd=u.get("cost_usd"),
                cost_source=u.get("cost_source", "unpriced"),
            )
            for u in context.get("usage") or ()
        ),
        is_regeneration=bool(flags.get("is_regeneration")),
        regeneration_source=flags.get("regeneration_source"),
        probe_run_id=flags.get("probe_run_id"),
        probe_question_id=flags.get("probe_question_id"),
        partial=bool(flags.get("partial")),
        span_count=record.get("span_count", 0),
        revision=context.get("revision", 0),
        source=record.get("source", "otlp"),
    )


# ---------------------------------------------------------------- dead letters


def dead_letter_row(record: RagTrace | Feedback, error: str, *, created_at: datetime) -> dict[str, Any]:
    """The `dead_letters` row for a record a sink refused for good, with the error it refused it with.

    Never raises for the record's content: a record that failed to store may
    hold anything its type allows (or, built without validation, more), so
    every value is made storable and bounded here, and a record that cannot be
    serialised at all is kept as its type and id.
    """
    kind = "feedback" if isinstance(record, Feedback) else "trace"
    record_id = getattr(record, "event_id" if kind == "feedback" else "trace_id", None)
    text, truncated = _record_json(record)
    return {
        "tenant": storable_text(str(getattr(record, "tenant", "default"))),
        "kind": kind,
        "record_id": storable_text(str(record_id))[:_MAX_DEAD_LETTER_ID_CHARS],
        "error": storable_text(error[:MAX_DEAD_LETTER_ERROR_CHARS]),
        "record": text,
        "truncated": truncated,
        "created_at": created_at,
    }


def _record_json(record: RagTrace | Feedback) -> tuple[str, bool]:
    """The record as JSON text of at most MAX_DEAD_LETTER_RECORD_CHARS, and whether it was shortened."""
    try:
        data = _clean(record.model_dump(mode="json", warnings=False))
    except Exception:  # a record built without validation may not serialise: keep what can be shown
        data = {"unserialisable": type(record).__name__}
    text = _json(data)
    if len(text) <= MAX_DEAD_LETTER_RECORD_CHARS:
        return text, False
    text = _json(_shortened(data))
    return text[:MAX_DEAD_LETTER_RECORD_CHARS], True


def _clean(value: Any) -> Any:
    """JSON-ready data made storable and strict JSON: text as `storable_text`, non-finite floats None."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, float):
        return _finite(value)
    if isinstance(value, dict):
        return {storable_text(str(k)): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _json(data: Any) -> str:
    try:
        return json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=str)
    except ValueError:  # an integer of more digits than int-to-str allows
        return json.dumps({"unserialisable": "record"})


def _shortened(value: Any) -> Any:
    if isinstance(value, str) and len(value) > _SHORT_STRING:
        return f"{value[:_SHORT_STRING]}... ({len(value)} characters)"
    if isinstance(value, list):
        kept = [_shortened(item) for item in value[:_SHORT_LIST]]
        if len(value) > _SHORT_LIST:
            kept.append(f"... ({len(value)} items)")
        return kept
    if isinstance(value, dict):
        return {key: _shortened(item) for key, item in value.items()}
    return value


def dead_letter_record(row: Row) -> dict[str, Any]:
    """A `dead_letters` row as JSON-ready data; `record` is the parsed record when its JSON is whole,
    else the stored text."""
    record: Any = row["record"]
    with contextlib.suppress(ValueError):
        record = json.loads(record)
    return {
        "id": row["id"],
        "kind": row["kind"],
        "record_id": row["record_id"],
        "error": row["error"],
        "record": record,
        "truncated": bool(row["truncated"]),
        "created_at": _iso(row["created_at"]),
    }
