"""The store's tables.

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
error and the record as JSON, both bounded. The mapping between records and
these rows is in `rows.py`.

Datetimes are stored in UTC (`UtcDateTime`); a naive datetime is taken to be UTC.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

# rag_trace_from_record: service/outbox.py reads it from here
from service.store.rows import rag_trace_from_record as rag_trace_from_record
from service.store.rows import to_utc

__all__ = [
    "SCHEMA_VERSION",
    "UtcDateTime",
    "dead_letters",
    "fanout_outbox",
    "feedback",
    "metadata",
    "non_request_traces",
    "schema_version",
    "trace_contexts",
    "trace_counted",
    "trace_spans",
    "traces",
]

SCHEMA_VERSION = 2
"""The schema this code writes. Bump it with every change a migration must apply (`MIGRATIONS`).

2: `traces.usage_unknown` (a model call reported no token counts; `unpriced` no longer says so).
"""


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


# The last value written and its text. Most values of a batch are one instant (a stored trace's
# `created_at`, its outbox row's two times, its archived spans' two), so the same datetime object
# comes several times in a row; datetimes are immutable, so its text is too. One tuple, replaced
# whole: threads that write at once at worst format a value again.
_last_written: tuple[datetime | None, str | None] = (None, None)


def _sqlite_utc_text(value: datetime | None) -> str | None:
    """`value` in UTC as SQLite's DATETIME writes it: `YYYY-MM-DD HH:MM:SS.ffffff`, naive."""
    global _last_written
    if value is None:
        return None
    last, text = _last_written
    if value is last:
        return text
    utc = value if value.tzinfo is UTC else to_utc(value)
    # isoformat always writes four year digits and, with "microseconds", six fraction digits;
    # the first 26 characters leave out the UTC offset
    text = utc.isoformat(" ", "microseconds")[:26]
    _last_written = (value, text)
    return text


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
