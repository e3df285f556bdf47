"""The store's tables, and the mapping between records and their rows.

One compact `traces` row per (tenant, trace_id) carries everything list
queries filter or show; the bulky part of a trace (chunk contents, reranker
lists, per-model usage) sits in `trace_contexts`, which only single-trace reads
load. `feedback` rows are keyed by (tenant, event_id) and join traces by
(tenant, trace_id) at read time, so feedback may arrive before its trace.
`trace_spans` keeps the spans of flushed traces for their late window, so
that late spans complete them (span_archive.py); `trace_counted` what was
counted for a trace a later version replaced (trace_updates.py).
`dead_letters` keeps the records a sink refused for good (the bus's safety
net, `service/bus/memory.py`), one row per (tenant, kind, record id), with the
error and the record as JSON, both bounded.

The converters here are pure functions (no engine, no I/O) so the read API and
the Kafka worker can reuse them:

* `trace_row`, `trace_context`, `feedback_row`, `dead_letter_row`: record → row values;
* `trace_record`, `feedback_record`, `dead_letter_record`: row → JSON-ready dict.

Text is made storable the same way on every database: NUL characters become
U+FFFD (PostgreSQL text cannot hold them) and unpaired surrogates become "?"
(they cannot be encoded as UTF-8). Non-finite floats become None (JSON has no
NaN). Datetimes are stored in UTC; a naive datetime is taken to be UTC.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect, RowMapping

from service.model import Chunk, Feedback, ModelUsage, QueryEmbedding, RagTrace, Retrieval, Timings

__all__ = [
    "MAX_DEAD_LETTER_ERROR_CHARS",
    "MAX_DEAD_LETTER_RECORD_CHARS",
    "SCHEMA_VERSION",
    "Row",
    "UtcDateTime",
    "dead_letter_record",
    "dead_letter_row",
    "dead_letters",
    "fanout_outbox",
    "feedback",
    "feedback_record",
    "feedback_row",
    "metadata",
    "non_request_row",
    "non_request_traces",
    "rag_trace_from_record",
    "schema_version",
    "storable_text",
    "to_utc",
    "trace_context",
    "trace_contexts",
    "trace_counted",
    "trace_record",
    "trace_row",
    "trace_spans",
    "traces",
]

SCHEMA_VERSION = 2
"""The schema this code writes. Bump it with every change a migration must apply (`MIGRATIONS`).

2: `traces.usage_unknown` (a model call reported no token counts; `unpriced` no longer says so).
"""

Row = RowMapping | Mapping[str, Any]
"""A row as read (`RowMapping`) or as built by hand (a dict with the column names)."""


def to_utc(value: datetime) -> datetime:
    """`value` as an aware UTC datetime; a naive value is taken to be UTC already."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


class UtcDateTime(sa.types.TypeDecorator[datetime]):
    """A timestamp stored in UTC and always read back as an aware UTC datetime.

    SQLite keeps datetimes as fixed-width naive strings, so values are written
    as naive UTC there; that keeps string order equal to time order, which the
    keyset pagination relies on. PostgreSQL gets `timestamptz`.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        utc = to_utc(value)
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    def bind_processor(self, dialect: Dialect) -> Callable[[datetime | None], Any] | None:
        """On SQLite, one function for `process_bind_param` and the dialect's DATETIME text, which
        is what they write together (tests/service/store/test_utc_datetime.py): the two layers
        cost ~3 us a value, four values a stored trace; this ~0.5."""
        if dialect.name != "sqlite":
            return super().bind_processor(dialect)
        return _sqlite_utc_text

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else to_utc(value)


def _sqlite_utc_text(value: datetime | None) -> str | None:
    """`value` in UTC as SQLite's DATETIME writes it: `YYYY-MM-DD HH:MM:SS.ffffff`, naive."""
    if value is None:
        return None
    if value.tzinfo is not UTC:
        value = to_utc(value)
    # isoformat always writes four year digits and, with "microseconds", six fraction digits;
    # the first 26 characters leave out the UTC offset
    return value.isoformat(" ", "microseconds")[:26]


metadata = sa.MetaData()

schema_version = sa.Table(
    "schema_version",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("applied_at", UtcDateTime, nullable=False),
)

# Free-text columns are unbounded Text: a length limit would turn one long app
# name into a permanently failing batch on PostgreSQL.
traces = sa.Table(
    "traces",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("trace_id", sa.String(32), primary_key=True),
    sa.Column("app", sa.Text, nullable=False),
    sa.Column("release", sa.Text),
    sa.Column("intent", sa.Text),
    sa.Column("session_id", sa.Text),
    sa.Column("user_hash", sa.Text),
    sa.Column("start_time", UtcDateTime, nullable=False),
    sa.Column("total_s", sa.Float),
    sa.Column("embedding_s", sa.Float),
    sa.Column("retrieval_s", sa.Float),
    sa.Column("rerank_s", sa.Float),
    sa.Column("generation_s", sa.Float),
    sa.Column("ttft_s", sa.Float),
    # tokens of the calls that reported them; `usage_unknown` says some call reported none, so the
    # trace's total is unknown (the API shows null)
    sa.Column("input_tokens", sa.BigInteger, nullable=False),
    sa.Column("output_tokens", sa.BigInteger, nullable=False),
    sa.Column("cost_usd", sa.Float),
    # a call of a model with no price (and no app cost): the cost column is short of the whole
    sa.Column("unpriced", sa.Boolean, nullable=False),
    sa.Column("query", sa.Text),
    sa.Column("answer", sa.Text),
    sa.Column("top1_score", sa.Float),
    sa.Column("chunk_ids", sa.JSON, nullable=False),
    sa.Column("chunk_scores", sa.JSON, nullable=False),
    sa.Column("is_regeneration", sa.Boolean, nullable=False),
    sa.Column("regeneration_source", sa.Text),
    sa.Column("partial", sa.Boolean, nullable=False),
    sa.Column("probe_run_id", sa.Text),
    sa.Column("probe_question_id", sa.Text),
    sa.Column("span_count", sa.Integer, nullable=False),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    # a call reported no token counts (schema 2): tokens unknown, and its cost unless the app sent one
    sa.Column("usage_unknown", sa.Boolean, nullable=False, server_default=sa.false()),
    # Keyset pagination walks (start_time, trace_id) backwards within a tenant.
    sa.Index("ix_traces_tenant_time", "tenant", "start_time", "trace_id"),
    sa.Index("ix_traces_tenant_app_time", "tenant", "app", "start_time"),
    # Retention scans all tenants by age.
    sa.Index("ix_traces_start_time", "start_time"),
    # probe scoring collects one run's traces (service/probes/scoring.py)
    sa.Index("ix_traces_tenant_probe_run", "tenant", "probe_run_id"),
)

# Traces that are not user requests (index building, batch embedding, health checks: `TraceKind`),
# kept only when `store.keep_non_requests` is on, apart from `traces` so that nothing that reads
# requests can count them.
non_request_traces = sa.Table(
    "non_request_traces",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("trace_id", sa.String(32), primary_key=True),
    sa.Column("app", sa.Text, nullable=False),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("release", sa.Text),
    sa.Column("start_time", UtcDateTime, nullable=False),
    sa.Column("total_s", sa.Float),
    sa.Column("embedding_s", sa.Float),
    sa.Column("input_tokens", sa.BigInteger, nullable=False),
    sa.Column("output_tokens", sa.BigInteger, nullable=False),
    sa.Column("cost_usd", sa.Float),
    sa.Column("span_count", sa.Integer, nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Index("ix_non_request_traces_start_time", "start_time"),
)

trace_contexts = sa.Table(
    "trace_contexts",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("trace_id", sa.String(32), primary_key=True),
    sa.Column("context", sa.JSON, nullable=False),
)

feedback = sa.Table(
    "feedback",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("event_id", sa.Text, primary_key=True),
    sa.Column("trace_id", sa.String(32), nullable=False),
    sa.Column("app", sa.Text),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("reason", sa.Text),
    sa.Column("text", sa.Text),
    sa.Column("time", UtcDateTime, nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Index("ix_feedback_tenant_trace", "tenant", "trace_id"),
    sa.Index("ix_feedback_time", "time"),
)


# New traces and feedback events whose effects after the store (judge queue, review intake,
# metrics, drift windows) have not all run: a row is written in the transaction that stores its
# record and deleted once the fan-out returned, so a crash or a failing sink between the two
# leaves it here, and the sweep (service/outbox.py) runs the fan-out again.
fanout_outbox = sa.Table(
    "fanout_outbox",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("kind", sa.Text, primary_key=True),  # trace | feedback
    sa.Column("record_id", sa.Text, primary_key=True),  # trace id or feedback event id
    sa.Column("created_at", UtcDateTime, nullable=False),  # or when a sweep last took it
    sa.Column("queued_at", UtcDateTime, nullable=False),  # when the record was stored
    sa.Index("ix_fanout_outbox_created_at", "created_at"),
)

# The spans of each trace the span assembler flushed, for `assembler.late_window_s` after its first
# flush: spans that arrive later complete the trace from here (service/store/span_archive.py), in
# whichever process they arrive. `spans` holds OTLP ExportTraceServiceRequest messages and `events`
# ExportLogsServiceRequest messages, each appended to (a concatenation of such messages is one
# message); both become NULL and `expired` true once the window closed: a span for the trace that
# comes later still is dropped and counted. The row goes with the trace's retention.
trace_spans = sa.Table(
    "trace_spans",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("trace_id", sa.String(32), primary_key=True),
    sa.Column("spans", sa.LargeBinary),
    sa.Column("events", sa.LargeBinary),
    sa.Column("items", sa.Integer, nullable=False),  # distinct spans and events kept
    sa.Column("first_flushed_at", UtcDateTime, nullable=False),
    sa.Column("updated_at", UtcDateTime, nullable=False),
    sa.Column("expired", sa.Boolean, nullable=False),
    sa.Index("ix_trace_spans_first_flushed_at", "first_flushed_at"),
)

# What the fan-out after the store counted for a trace that a later version replaced
# (`service.corrections.Counted` as JSON): the baseline its corrections are made against. Written
# when a stored trace is first updated, rewritten by every update's fan-out.
trace_counted = sa.Table(
    "trace_counted",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("trace_id", sa.String(32), primary_key=True),
    sa.Column("counted", sa.Text, nullable=False),
    sa.Column("updated_at", UtcDateTime, nullable=False),
    sa.Index("ix_trace_counted_updated_at", "updated_at"),
)

# Records a sink refused for good. `id` orders them (newest last) and pages the read API; a record
# refused again (a redelivery, a client resending it) keeps its first row.
dead_letters = sa.Table(
    "dead_letters",
    metadata,
    sa.Column(
        "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True
    ),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("kind", sa.Text, nullable=False),  # trace | feedback
    sa.Column("record_id", sa.Text, nullable=False),  # trace id or feedback event id
    sa.Column("error", sa.Text, nullable=False),
    sa.Column("record", sa.Text, nullable=False),  # JSON text, shortened when `truncated`
    sa.Column("truncated", sa.Boolean, nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Index("ux_dead_letters_record", "tenant", "kind", "record_id", unique=True),
    sa.Index("ix_dead_letters_tenant_id", "tenant", "id"),
    sa.Index("ix_dead_letters_created_at", "created_at"),
)

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
