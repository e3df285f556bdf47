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

from sampler.estimate import SampleCell
from sampler.queue_table import judge_queue
from service.errors import StoreUnavailable
from service.judge.judgment import Judgment
from service.store.keys import keys_by_group
from service.store.tables import UtcDateTime

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


# compiled once, per (tenant, judge version) with an IN list of trace ids
# (service.store.keys.keys_by_group)
_OUTCOMES_OF_TRACES = sa.select(judgments.c.trace_id, judgments.c.outcome, judgments.c.faithfulness).where(
    judgments.c.tenant == sa.bindparam("for_tenant"),
    judgments.c.judge_version == sa.bindparam("for_version"),
    judgments.c.trace_id.in_(sa.bindparam("trace_ids", expanding=True)),
)


# what a sample's score is: the share of its claims supported, or whether they all were
Reading = Literal["claims", "answers"]
READINGS: tuple[Reading, ...] = ("claims", "answers")  # claim-level, answer-level
# faithfulness is supported / claims, a float: "every claim" is 1.0 up to its rounding
_ALL_SUPPORTED = 1.0 - 1e-9


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

    def delete_older_than(self, cutoff: datetime, *, chunk_size: int = 1_000) -> int:
        """Delete judgments made before `cutoff`, and flags raised before it (retention: their traces
        go with the trace store's); returns how many judgments went. In transactions of at most
        `chunk_size` rows, so the write lock is never held long."""
        j = judgments.c
        key = (j.tenant, j.trace_id, j.judge_version)
        gone = 0
        while True:
            oldest = sa.select(*key).where(j.judged_at < cutoff).limit(chunk_size)
            with self._connect() as conn:
                count = int(conn.execute(sa.delete(judgments).where(sa.tuple_(*key).in_(oldest))).rowcount)
            gone += count
            if count < chunk_size:
                break
        with self._connect() as conn:
            conn.execute(sa.delete(flags).where(flags.c.created_at < cutoff))
        return gone

    def save(self, judgment: Judgment, flag_threshold: float) -> tuple[bool, list[Flag]]:
        """Store a judgment and its flags; returns (was it stored, the flags that were new).

        One judgment per (tenant, trace_id, judge_version): a judgment of the same trace revision
        again changes nothing (False); one of a later revision (the trace was completed by its late
        spans and judged again) replaces it, and the flags of the one replaced that the new one does
        not raise go with it."""
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
            stored = inserted is not None or self._replaced(conn, judgment, row, raised)
            new_flags = [flag for flag in raised if self._add_flag(conn, flag, now)] if stored else []
        return stored, new_flags

    def _replaced(
        self, conn: Connection, judgment: Judgment, row: dict[str, Any], raised: list[Flag]
    ) -> bool:
        """Replace the stored judgment of this key when `judgment` is of a later trace revision."""
        j = judgments.c
        key = (
            j.tenant == judgment.tenant,
            j.trace_id == judgment.trace_id,
            j.judge_version == judgment.judge_version,
        )
        record = conn.execute(sa.select(j.record).where(*key).with_for_update()).scalar_one_or_none()
        if record is None:
            return False
        if int(json.loads(record).get("trace_revision") or 0) >= judgment.trace_revision:
            return False
        conn.execute(sa.update(judgments).where(*key).values(row))
        conn.execute(
            sa.delete(flags).where(
                flags.c.tenant == judgment.tenant,
                flags.c.trace_id == judgment.trace_id,
                flags.c.judge_version == judgment.judge_version,
                flags.c.reason.not_in([f.reason for f in raised]),
            )
        )
        return True

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

    def window_cells(
        self, start: datetime, end: datetime, *, tenant: str | None = None, reading: Reading = "claims"
    ) -> list[SampleCell]:
        """The estimator's samples of traces that started in (start, end], summed by the database;
        one tenant's only when `tenant` is given.

        `reading` says what a scored sample's score is: its share of supported claims (`claims`),
        or 1 when every claim is supported and 0 otherwise (`answers`: the share of faithful
        answers, which users read the claim-level rate as).

        One judge-queue record is one sample: `skipped` and `failed` records as
        themselves, `pending` and `leased` ones (not judged yet, deferred by the
        budget included) as `pending`, a `done` one with its judgment's outcome
        (`scored` with its score, `no_claims`; any other recorded outcome counts
        as `failed`). A `done` record without a judgment (its write was lost) is
        no sample.
        Cells are (app, release, intent, stratum, inclusion probability,
        outcome): one query whatever the window holds, where reading every
        record grew with traffic times sampling rate.
        """
        return self.window_cells_of(start, end, (reading,), tenant=tenant)[reading]

    def window_cells_of(
        self, start: datetime, end: datetime, readings: Sequence[Reading], *, tenant: str | None = None
    ) -> dict[Reading, list[SampleCell]]:
        """`window_cells` of each of `readings`, summed in one pass over the window: the query is
        linear in the window (seconds at a million samples), and the gauges want both readings."""
        return self._window_cells(start, end, readings, tenant=tenant, per_tenant=False).get(
            None, {reading: [] for reading in readings}
        )

    def window_cells_per_tenant(
        self, start: datetime, end: datetime, readings: Sequence[Reading]
    ) -> dict[str, dict[Reading, list[SampleCell]]]:
        """`window_cells_of` of each tenant with samples in the window, from one pass over it (a pass
        a tenant read the whole window once for each)."""
        cells = self._window_cells(start, end, readings, tenant=None, per_tenant=True)
        return {tenant: of_tenant for tenant, of_tenant in cells.items() if tenant is not None}

    def _window_cells(
        self,
        start: datetime,
        end: datetime,
        readings: Sequence[Reading],
        *,
        tenant: str | None,
        per_tenant: bool,
    ) -> dict[str | None, dict[Reading, list[SampleCell]]]:
        """Cells of each reading, keyed by tenant (`per_tenant`) or all under None."""
        q, j = judge_queue.c, judgments.c
        scored = sa.and_(q.state == "done", j.outcome == "scored")
        scores = {
            "claims": j.faithfulness,
            "answers": sa.case((j.faithfulness >= _ALL_SUPPORTED, 1.0), else_=0.0),
        }
        samples = (
            sa.select(
                (q.tenant if per_tenant else sa.null()).label("tenant"),
                q.app,
                q.release,
                q.intent,
                q.stratum,
                q.inclusion_probability,
                sa.case(
                    (q.state.in_(("pending", "leased")), sa.literal("pending")),
                    (q.state != "done", q.state),
                    (j.outcome.in_(("scored", "no_claims")), j.outcome),
                    else_=sa.literal("failed"),
                ).label("outcome"),
                *(sa.case((scored, scores[reading])).label(f"score_{reading}") for reading in readings),
            )
            .select_from(
                judge_queue.outerjoin(
                    judgments,
                    sa.and_(
                        j.tenant == q.tenant, j.trace_id == q.trace_id, j.judge_version == q.judge_version
                    ),
                )
            )
            .where(
                q.trace_time > start,
                q.trace_time <= end,
                q.state.in_(("done", "failed", "skipped", "pending", "leased")),
                sa.or_(q.state != "done", j.outcome.is_not(None)),
                sa.true() if tenant is None else q.tenant == tenant,
            )
            .subquery()
        )
        s = samples.c
        keys = (s.tenant, s.app, s.release, s.intent, s.stratum, s.inclusion_probability, s.outcome)
        sums = []
        for reading in readings:
            score = s[f"score_{reading}"]
            sums += [
                sa.func.sum(score).label(f"y_{reading}"),
                sa.func.sum(score * score).label(f"yy_{reading}"),
            ]
        query = sa.select(*keys, sa.func.count().label("n"), *sums).group_by(*keys)
        with self._connect() as conn:
            rows = conn.execute(query).all()
        cells: dict[str | None, dict[Reading, list[SampleCell]]] = {}
        for row in rows:
            of_tenant = cells.setdefault(row.tenant, {reading: [] for reading in readings})
            for reading in readings:
                y = float(row._mapping[f"y_{reading}"] or 0.0)
                yy = float(row._mapping[f"yy_{reading}"] or 0.0)
                # squared deviations from the cell mean out of two sums; rounding can leave a hair
                # on either side of 0 when every score is equal, and equal scores must give 0
                m2 = yy - y * y / row.n
                of_tenant[reading].append(
                    SampleCell(
                        stratum=row.stratum,
                        inclusion_probability=row.inclusion_probability,
                        outcome=row.outcome,
                        count=row.n,
                        score_sum=y,
                        score_m2=m2 if m2 > 1e-9 * yy else 0.0,
                        app=row.app,
                        release=row.release,
                        intent=row.intent,
                    )
                )
        return cells

    def outcomes(
        self, keys: Iterable[tuple[str, str, str]]
    ) -> dict[tuple[str, str, str], tuple[str, float | None]]:
        """(tenant, trace_id, judge_version) -> (outcome, faithfulness) for the keys that were judged."""
        found: dict[tuple[str, str, str], tuple[str, float | None]] = {}
        with self._connect() as conn:
            for (tenant, version), trace_ids in keys_by_group(((t, v), trace_id) for t, trace_id, v in keys):
                params = {"for_tenant": tenant, "for_version": version, "trace_ids": trace_ids}
                for row in conn.execute(_OUTCOMES_OF_TRACES, params):
                    found[(tenant, row.trace_id, version)] = (row.outcome, row.faithfulness)
        return found

    def flagged(self, tenant: str, *, since: datetime | None = None, limit: int = 500) -> Sequence[Any]:
        """Flags of a tenant, newest first (the review queue reads these)."""
        query = sa.select(flags).where(flags.c.tenant == tenant)
        if since is not None:
            query = query.where(flags.c.created_at >= since)
        with self._connect() as conn:
            return conn.execute(query.order_by(flags.c.created_at.desc()).limit(limit)).mappings().all()
