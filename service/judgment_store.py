"""`JudgmentStore`: judgments and review flags, on the same database as the traces.

A judgment is stored once per (tenant, trace_id, judge_version): storing it
again (a redelivered queue item, a worker that died after saving but before
acknowledging) changes nothing and reports "not new", so metrics count it once.
A flag is stored once per (tenant, trace_id, reason); its `detail` says why.

Every call is blocking and thread-safe (SQLAlchemy engine); callers in the
event loop use `asyncio.to_thread`. Database outages raise `StoreUnavailable`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from service.errors import StoreUnavailable
from service.judgment import Judgment
from service.tables import UtcDateTime

FlagReason = Literal["unfaithful", "low_faithfulness", "judge_failure", "retrieval_failure"]
FLAG_REASONS: tuple[FlagReason, ...] = (
    "unfaithful",
    "low_faithfulness",
    "judge_failure",
    "retrieval_failure",
)

metadata = sa.MetaData()


judgments = sa.Table(
    "judgments",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("trace_id", sa.String(32), primary_key=True),
    sa.Column("judge_version", sa.String(64), primary_key=True),
    sa.Column("app", sa.Text, nullable=False),
    sa.Column("judge", sa.String(32), nullable=False),
    sa.Column("judge_model", sa.Text),
    sa.Column("outcome", sa.String(16), nullable=False),
    sa.Column("faithfulness", sa.Float),
    sa.Column("diagnosis", sa.String(32)),
    sa.Column("failure_mode", sa.String(32)),
    sa.Column("failure_reason", sa.String(32)),
    sa.Column("cost_usd", sa.Float),
    sa.Column("judged_at", UtcDateTime, nullable=False),
    sa.Column("record", sa.Text, nullable=False),  # the whole Judgment as JSON
    sa.Index("judgments_by_time", "judged_at"),
)

flags = sa.Table(
    "review_flags",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("trace_id", sa.String(32), primary_key=True),
    sa.Column("reason", sa.String(32), primary_key=True),
    sa.Column("app", sa.Text, nullable=False),
    sa.Column("detail", sa.Text),
    sa.Column("judge_version", sa.String(64)),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Index("review_flags_by_time", "created_at"),
)


@dataclass(frozen=True, slots=True)
class Flag:
    tenant: str
    trace_id: str
    reason: FlagReason
    app: str
    detail: str
    judge_version: str | None


def flags_for(judgment: Judgment, threshold: float) -> list[Flag]:
    """The review flags a judgment raises (the rules of issue 3, item 8)."""
    raised: list[tuple[FlagReason, str]] = []
    if judgment.outcome == "failed":
        raised.append(("judge_failure", f"judge failed after retries: {judgment.failure_reason}"))
    if judgment.outcome == "scored" and judgment.faithfulness is not None:
        if judgment.unsupported:
            raised.append(
                ("unfaithful", f"{len(judgment.unsupported)} of {len(judgment.claims)} claims unsupported")
            )
        if judgment.faithfulness < threshold:
            raised.append(("low_faithfulness", f"faithfulness {judgment.faithfulness:.2f} < {threshold:.2f}"))
    if judgment.diagnosis == "retrieval_failure":
        raised.append(("retrieval_failure", "context insufficient and the answer makes unsupported claims"))
    return [
        Flag(judgment.tenant, judgment.trace_id, reason, judgment.app, detail, judgment.judge_version)
        for reason, detail in raised
    ]


class JudgmentStore:
    """Judgments and flags on an engine the caller owns (the trace store's)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def create_schema(self) -> None:
        with self._connect() as conn:
            metadata.create_all(conn, checkfirst=True)

    @contextmanager
    def _connect(self) -> Iterator[Connection]:
        try:
            with self.engine.begin() as conn:
                yield conn
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
            raise StoreUnavailable(f"judgment store unavailable: {type(exc.orig).__name__}") from exc

    def _insert(self, table: sa.Table) -> Any:
        dialect = postgresql if self.engine.dialect.name == "postgresql" else sqlite
        return dialect.insert(table)

    def save(self, judgment: Judgment, flag_threshold: float) -> tuple[bool, list[Flag]]:
        """Store a judgment and its flags; returns (was it new, the flags that were new)."""
        if judgment.judged_at.tzinfo is None:
            raise ValueError("judged_at must be timezone-aware")
        row = {
            "tenant": judgment.tenant,
            "trace_id": judgment.trace_id,
            "judge_version": judgment.judge_version,
            "app": judgment.app,
            "judge": judgment.judge,
            "judge_model": judgment.judge_model,
            "outcome": judgment.outcome,
            "faithfulness": judgment.faithfulness,
            "diagnosis": judgment.diagnosis,
            "failure_mode": judgment.failure_mode,
            "failure_reason": judgment.failure_reason,
            "cost_usd": judgment.cost_usd,
            "judged_at": judgment.judged_at,
            "record": judgment.model_dump_json(),
        }
        raised = flags_for(judgment, flag_threshold)
        now = datetime.now(UTC)
        with self._connect() as conn:
            # RETURNING, not rowcount: psycopg reports -1 for INSERT ... ON CONFLICT DO NOTHING
            inserted = conn.execute(
                self._insert(judgments).values(row).on_conflict_do_nothing().returning(judgments.c.trace_id)
            ).first()
            new_flags = [flag for flag in raised if self._add_flag(conn, flag, now)]
        return inserted is not None, new_flags

    def _add_flag(self, conn: Connection, flag: Flag, now: datetime) -> bool:
        result = conn.execute(
            self._insert(flags)
            .values(
                tenant=flag.tenant,
                trace_id=flag.trace_id,
                reason=flag.reason,
                app=flag.app,
                detail=flag.detail,
                judge_version=flag.judge_version,
                created_at=now,
            )
            .on_conflict_do_nothing()
            .returning(flags.c.reason)
        )
        return result.first() is not None

    def for_trace(self, tenant: str, trace_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(judgments as JSON-ready dicts, flags) of one trace of one tenant."""
        with self._connect() as conn:
            found = (
                conn.execute(
                    sa.select(judgments.c.record)
                    .where(judgments.c.tenant == tenant, judgments.c.trace_id == trace_id)
                    .order_by(judgments.c.judged_at)
                )
                .scalars()
                .all()
            )
            raised = (
                conn.execute(
                    sa.select(flags.c.reason, flags.c.detail, flags.c.judge_version, flags.c.created_at)
                    .where(flags.c.tenant == tenant, flags.c.trace_id == trace_id)
                    .order_by(flags.c.created_at, flags.c.reason)
                )
                .mappings()
                .all()
            )
        return (
            [json.loads(r) for r in found],
            [
                {
                    "reason": f["reason"],
                    "detail": f["detail"],
                    "judge_version": f["judge_version"],
                    "created_at": f["created_at"].isoformat(),
                }
                for f in raised
            ],
        )

    def outcomes(
        self, keys: Iterable[tuple[str, str, str]]
    ) -> dict[tuple[str, str, str], tuple[str, float | None]]:
        """(tenant, trace_id, judge_version) -> (outcome, faithfulness) for the keys that were judged."""
        wanted = list(keys)
        found: dict[tuple[str, str, str], tuple[str, float | None]] = {}
        j = judgments.c
        with self._connect() as conn:
            for start in range(0, len(wanted), 500):
                chunk = wanted[start : start + 500]
                rows = conn.execute(
                    sa.select(j.tenant, j.trace_id, j.judge_version, j.outcome, j.faithfulness).where(
                        sa.tuple_(j.tenant, j.trace_id, j.judge_version).in_(chunk)
                    )
                ).all()
                for row in rows:
                    found[(row.tenant, row.trace_id, row.judge_version)] = (row.outcome, row.faithfulness)
        return found

    def flagged(self, tenant: str, *, since: datetime | None = None, limit: int = 500) -> Sequence[Any]:
        """Flags of a tenant, newest first (the review queue reads these)."""
        query = sa.select(flags).where(flags.c.tenant == tenant)
        if since is not None:
            query = query.where(flags.c.created_at >= since)
        with self._connect() as conn:
            return conn.execute(query.order_by(flags.c.created_at.desc()).limit(limit)).mappings().all()
