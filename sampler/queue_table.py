"""The judge queue's table, and the mapping between queue items and its rows.

One row per item (unique per tenant, trace id and judge version) with its
delivery state; timestamps are stored in UTC on every dialect (naive UTC text
on SQLite, which sorts correctly). `SqlJudgeQueue` (`sql_queue.py`) works on
it, and the stores that join judgments and reviews to the sampling design
read it (`service.judge.store`, `service.review.blind_labels`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Dialect,
    Double,
    Engine,
    Index,
    Integer,
    MetaData,
    Row,
    String,
    Table,
    UniqueConstraint,
    and_,
)
from sqlalchemy.types import TypeDecorator

from sampler.queue import ITEM_STATES, ItemKey, ItemState, JudgeItem, QueueRecord

__all__ = [
    "MAX_ERROR_CHARS",
    "create_tables",
    "item_row",
    "item_state",
    "judge_queue",
    "key_clause",
    "metadata",
    "queue_record",
]

MAX_ERROR_CHARS = 500
"""The longest `last_error` kept; a longer reason is cut to this."""


class _UtcDateTime(TypeDecorator[datetime]):
    """Timestamps stored as UTC on every dialect; SQLite gets naive UTC text, which sorts correctly."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("timestamps must be timezone-aware")
        value = value.astimezone(UTC)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


metadata = MetaData()

_states_sql = ", ".join(f"'{s}'" for s in ITEM_STATES)
judge_queue = Table(
    "judge_queue",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("tenant", String(128), nullable=False),
    Column("trace_id", String(32), nullable=False),
    Column("judge_version", String(64), nullable=False),
    Column("app", String(128), nullable=False),
    Column("release", String(128)),
    Column("intent", String(128)),
    Column("stratum", String(32), nullable=False),
    Column("inclusion_probability", Double, nullable=False),
    Column("trace_time", _UtcDateTime, nullable=False),
    Column("enqueued_at", _UtcDateTime, nullable=False),
    Column("available_at", _UtcDateTime, nullable=False),
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("worker", String(128)),
    Column("lease_until", _UtcDateTime),
    Column("last_error", String(MAX_ERROR_CHARS)),
    Column("completed_at", _UtcDateTime),
    UniqueConstraint("tenant", "trace_id", "judge_version", name="judge_queue_key"),
    CheckConstraint(f"state IN ({_states_sql})", name="judge_queue_state"),
    CheckConstraint(
        "inclusion_probability > 0 AND inclusion_probability <= 1", name="judge_queue_probability"
    ),
    Index("judge_queue_claim", "state", "available_at"),
    # each tenant's pending items in id order: a claim reads the first few of each (sql_queue.py)
    Index("judge_queue_turns", "state", "tenant", "id"),
    Index("judge_queue_trace_time", "trace_time"),
)


def create_tables(engine: Engine) -> None:
    """Create the judge queue tables, and indexes added since a table was made, if they do not exist
    (safe to call on every start)."""
    metadata.create_all(engine, checkfirst=True)
    with engine.begin() as conn:  # `create_all` makes no index of a table that exists already
        for index in judge_queue.indexes:
            index.create(conn, checkfirst=True)


def key_clause(key: ItemKey) -> Any:
    """The WHERE clause of one item's row."""
    t = judge_queue.c
    return and_(t.tenant == key.tenant, t.trace_id == key.trace_id, t.judge_version == key.judge_version)


def item_row(item: JudgeItem, now: datetime) -> dict[str, object]:
    """The row of a newly enqueued item, available from `now` (`skipped` when it has a skip reason)."""
    return {
        "tenant": item.tenant,
        "trace_id": item.trace_id,
        "judge_version": item.judge_version,
        "app": item.app,
        "release": item.release,
        "intent": item.intent,
        "stratum": item.stratum,
        "inclusion_probability": item.inclusion_probability,
        "trace_time": item.trace_time,
        "enqueued_at": item.enqueued_at,
        "available_at": now,
        "state": "pending" if item.skip_reason is None else "skipped",
        "attempts": 0,
        "last_error": item.skip_reason,
    }


def item_state(value: str) -> ItemState:
    """A state read from a row; ValueError on one the queue does not know."""
    if value not in ITEM_STATES:
        raise ValueError(f"unknown judge queue state {value!r}")
    return value


def queue_record(row: Row[Any]) -> QueueRecord:
    """The record of a row; ValueError on a state the queue does not know."""
    state = item_state(row.state)
    item = JudgeItem(
        trace_id=row.trace_id,
        tenant=row.tenant,
        app=row.app,
        stratum=row.stratum,
        inclusion_probability=float(row.inclusion_probability),
        judge_version=row.judge_version,
        enqueued_at=row.enqueued_at,
        trace_time=row.trace_time,
        release=row.release,
        intent=row.intent,
        skip_reason=row.last_error if state == "skipped" else None,
    )
    return QueueRecord(
        item=item,
        state=state,
        attempts=int(row.attempts),
        worker=row.worker,
        lease_until=row.lease_until,
        last_error=row.last_error,
        completed_at=row.completed_at,
    )
