"""`ReviewStore`: the human review queue (items, their reasons, leases) and the reviews, in SQL.

An item is one trace in one queue: unique per (tenant, queue, trace_id).
Adding a reason to a trace that already has an item in that queue lists the
reason on it and raises its severity; it never makes a second item, and it
never reopens an item that is done. Queues are a closed set: `flagged`
(judge flags, thumbs-down, regenerations, items sent by API) and `blind`
(a random sample of judged traces, reviewed without the judge's verdict, for
calibration).

Claiming leases an item to one reviewer until `lease_until`: a claim is a
single UPDATE that succeeds only while the item is open, its lease has
expired, or the same reviewer holds it, so two reviewers never hold the same
item at once (on PostgreSQL the candidate row is picked with
`FOR UPDATE SKIP LOCKED`; SQLite runs one writer at a time). An expired lease
counts as open everywhere (lists, progress, metrics). A reviewer holds one
item at a time: claiming another gives the previous one back. A review is
accepted only from the reviewer holding the item and closes it; one review
per item.

Every call is blocking and thread-safe (SQLAlchemy engine); callers in the
event loop use `asyncio.to_thread`. Database outages raise `StoreUnavailable`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from service.errors import StoreUnavailable
from service.judge.store import judgments
from service.review.records import (
    SEVERITY,
    CalibrationRow,
    ClaimRefused,
    Intake,
    ItemFilters,
    Progress,
    Queue,
    ReviewIn,
    ReviewItem,
    ReviewRecord,
    severity_of,
)
from service.review.tables import metadata, review_claim_labels, review_items, review_reasons, reviews
from service.store.engine import transaction
from service.store.rows import to_utc

__all__ = ["ReviewStore"]

_ANY = ItemFilters()


def _now() -> datetime:
    return datetime.now(UTC)


def _aware(value: datetime | str) -> datetime:
    # An aggregate over a decorated column may come back as SQLite's text form.
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return to_utc(value)


class ReviewStore:
    """Review items, reasons and reviews on an engine the caller owns (the trace store's)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._postgres = engine.dialect.name == "postgresql"

    def create_schema(self) -> None:
        with self._connect(writes=True) as conn:
            metadata.create_all(conn, checkfirst=True)

    @contextmanager
    def _connect(self, *, writes: bool = False) -> Iterator[Connection]:
        try:
            with transaction(self.engine, writes=writes) as conn:
                yield conn
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
            raise StoreUnavailable(f"review store unavailable: {type(exc.orig).__name__}") from exc

    def _insert(self, table: sa.Table) -> Any:
        return (postgresql if self._postgres else sqlite).insert(table)

    # -- intake -----------------------------------------------------------------------------------

    def add(self, entries: Sequence[Intake], now: datetime | None = None) -> list[int]:
        """Put traces in queues with their reasons; returns the ids of items that were new.

        Idempotent: the same entry twice changes nothing. Entries are applied
        in (tenant, queue, trace_id) order so concurrent batches never deadlock.
        One statement inserts the new items and one their reasons, whatever the
        batch's size; an item a queue has already is raised by its own update.
        """
        now = now or _now()
        items: dict[tuple[str, str, str], dict[str, Any]] = {}
        for entry in sorted(entries, key=lambda e: (e.tenant, e.queue, e.trace_id, e.reason)):
            key: tuple[str, str, str] = (entry.tenant, entry.queue, entry.trace_id)
            item = items.get(key)
            if item is None:
                items[key] = item = {
                    "tenant": entry.tenant,
                    "queue": entry.queue,
                    "trace_id": entry.trace_id,
                    "app": entry.app,
                    "severity": SEVERITY[entry.reason],
                    "diagnosis": entry.diagnosis,
                    "judge_version": entry.judge_version,
                    "reasons": {},
                }
            else:  # several reasons for one item: the most severe, and what the later ones say
                item["severity"] = max(item["severity"], SEVERITY[entry.reason])
                if entry.diagnosis is not None:
                    item["diagnosis"] = entry.diagnosis
                if entry.judge_version is not None:
                    item["judge_version"] = entry.judge_version
                if entry.app != "unknown":
                    item["app"] = entry.app
            item["reasons"].setdefault(entry.reason, entry.detail)  # a reason given twice: the first
        if not items:
            return []
        t = review_items.c
        new_items = [
            {**{k: v for k, v in item.items() if k != "reasons"}, "state": "open", "created_at": now}
            for item in items.values()
        ]
        with self._connect(writes=True) as conn:
            inserted = {
                (row.tenant, row.queue, row.trace_id): int(row.id)
                for row in conn.execute(
                    self._insert(review_items)
                    .on_conflict_do_nothing()
                    .returning(t.id, t.tenant, t.queue, t.trace_id),
                    new_items,
                )
            }
            ids = dict(inserted)
            for key, item in items.items():
                if key in inserted:
                    continue
                # the queue has this trace already: list the reasons on it and raise it, never reopen it
                item_id = conn.execute(
                    sa.select(t.id).where(t.tenant == key[0], t.queue == key[1], t.trace_id == key[2])
                ).scalar_one()
                changes: dict[str, Any] = {
                    "severity": sa.case((t.severity < item["severity"], item["severity"]), else_=t.severity)
                }
                if item["diagnosis"] is not None:
                    changes["diagnosis"] = item["diagnosis"]
                if item["judge_version"] is not None:
                    changes["judge_version"] = item["judge_version"]
                if item["app"] != "unknown":
                    changes["app"] = item["app"]
                conn.execute(sa.update(review_items).where(t.id == item_id).values(**changes))
                ids[key] = item_id
            conn.execute(
                self._insert(review_reasons).on_conflict_do_nothing(),
                [
                    {"item_id": ids[key], "reason": reason, "detail": detail, "created_at": now}
                    for key, item in items.items()
                    for reason, detail in item["reasons"].items()
                ],
            )
        return [inserted[key] for key in items if key in inserted]

    # -- reading ----------------------------------------------------------------------------------

    @staticmethod
    def _effective_state(now: datetime) -> sa.ColumnElement[str]:
        t = review_items.c
        return sa.case(
            (sa.and_(t.state == "claimed", t.lease_until < now), "open"),
            else_=t.state,
        )

    def _item(self, row: Any, now: datetime, reasons: Sequence[tuple[str, str | None]] = ()) -> ReviewItem:
        expired = row.state == "claimed" and row.lease_until is not None and row.lease_until < now
        return ReviewItem(
            id=int(row.id),
            tenant=row.tenant,
            queue=row.queue,
            trace_id=row.trace_id,
            app=row.app,
            severity=int(row.severity),
            diagnosis=row.diagnosis,
            judge_version=row.judge_version,
            state="open" if expired else row.state,
            reviewer=None if expired else row.reviewer,
            lease_until=None if expired else row.lease_until,
            created_at=row.created_at,
            done_at=row.done_at,
            reasons=tuple(sorted(reasons, key=lambda r: -severity_of(r[0]))),
        )

    def _reasons(self, conn: Connection, ids: Sequence[int]) -> dict[int, list[tuple[str, str | None]]]:
        found: dict[int, list[tuple[str, str | None]]] = {}
        r = review_reasons.c
        for start in range(0, len(ids), 500):
            rows = conn.execute(
                sa.select(r.item_id, r.reason, r.detail).where(r.item_id.in_(ids[start : start + 500]))
            )
            for item_id, reason, detail in rows:
                found.setdefault(int(item_id), []).append((reason, detail))
        return found

    def get(self, item_id: int, tenants: Sequence[str], now: datetime | None = None) -> ReviewItem | None:
        """One item, or None when it does not exist or belongs to a tenant not in `tenants`."""
        now = now or _now()
        t = review_items.c
        with self._connect() as conn:
            row = conn.execute(sa.select(review_items).where(t.id == item_id, t.tenant.in_(tenants))).first()
            if row is None:
                return None
            return self._item(row, now, self._reasons(conn, [item_id]).get(item_id, []))

    def find(self, tenant: str, queue: Queue, trace_id: str) -> ReviewItem | None:
        """The item of a trace in a queue, or None."""
        t = review_items.c
        with self._connect() as conn:
            row = conn.execute(
                sa.select(review_items).where(t.tenant == tenant, t.queue == queue, t.trace_id == trace_id)
            ).first()
            if row is None:
                return None
            return self._item(row, _now(), self._reasons(conn, [int(row.id)]).get(int(row.id), []))

    def _filtered(self, tenants: Sequence[str], filters: ItemFilters, now: datetime) -> list[Any]:
        t = review_items.c
        where: list[Any] = [t.tenant.in_(tenants)]
        if filters.queue is not None:
            where.append(t.queue == filters.queue)
        if filters.app is not None:
            where.append(t.app == filters.app)
        if filters.diagnosis is not None:
            where.append(t.diagnosis == filters.diagnosis)
        if filters.state is not None:
            where.append(self._effective_state(now) == filters.state)
        if filters.reason is not None:
            r = review_reasons.c
            where.append(sa.exists().where(r.item_id == t.id, r.reason == filters.reason))
        return where

    @staticmethod
    def _priority() -> tuple[Any, ...]:
        t = review_items.c
        return (t.severity.desc(), t.created_at.desc(), t.id.desc())

    def list_items(
        self,
        tenants: Sequence[str],
        filters: ItemFilters = _ANY,
        *,
        limit: int = 200,
        now: datetime | None = None,
    ) -> list[ReviewItem]:
        """Items of the given tenants matching the filters, by priority (severity, then newest first)."""
        if not 1 <= limit <= 1000:
            raise ValueError(f"limit must be within 1..1000, got {limit}")
        now = now or _now()
        query = (
            sa.select(review_items)
            .where(*self._filtered(tenants, filters, now))
            .order_by(*self._priority())
            .limit(limit)
        )
        with self._connect() as conn:
            rows = conn.execute(query).all()
            reasons = self._reasons(conn, [int(r.id) for r in rows])
        return [self._item(r, now, reasons.get(int(r.id), [])) for r in rows]

    def apps(self, tenants: Sequence[str]) -> list[str]:
        """Distinct apps with items, for the list's filter."""
        t = review_items.c
        with self._connect() as conn:
            return list(
                conn.execute(
                    sa.select(t.app).where(t.tenant.in_(tenants)).distinct().order_by(t.app)
                ).scalars()
            )

    # -- leases -----------------------------------------------------------------------------------

    def _claimable(self, reviewer: str, now: datetime) -> sa.ColumnElement[bool]:
        t = review_items.c
        r = reviews.c
        # A reviewer who already reviewed the trace in another queue has seen the judge's
        # verdict; their label on the blind copy would not be blind.
        seen = sa.exists().where(r.tenant == t.tenant, r.trace_id == t.trace_id, r.reviewer == reviewer)
        return sa.and_(
            t.state != "done",
            sa.or_(t.state == "open", t.reviewer == reviewer, t.lease_until < now),
            sa.or_(t.queue != "blind", ~seen),
        )

    def _lease(self, conn: Connection, item_where: Any, reviewer: str, lease_s: float, now: datetime) -> Any:
        t = review_items.c
        row = conn.execute(
            sa.update(review_items)
            .where(item_where)
            .values(state="claimed", reviewer=reviewer, lease_until=now + timedelta(seconds=lease_s))
            .returning(*review_items.c)
        ).first()
        if row is not None:
            # one item per reviewer: what they held before goes back
            conn.execute(
                sa.update(review_items)
                .where(t.reviewer == reviewer, t.state == "claimed", t.id != row.id)
                .values(state="open", reviewer=None, lease_until=None)
            )
        return row

    def claim(
        self,
        item_id: int,
        reviewer: str,
        tenants: Sequence[str],
        lease_s: float,
        now: datetime | None = None,
    ) -> ReviewItem | None:
        """Lease one item to `reviewer` (renewing their own lease); None if not visible to them.

        Raises `ClaimRefused` when the item is done or another reviewer holds a live lease.
        """
        if not reviewer:
            raise ValueError("reviewer must not be empty")
        if not lease_s > 0:
            raise ValueError(f"lease_s must be positive, got {lease_s!r}")
        now = now or _now()
        t = review_items.c
        visible = sa.and_(t.id == item_id, t.tenant.in_(tenants))
        with self._connect(writes=True) as conn:
            row = self._lease(conn, sa.and_(visible, self._claimable(reviewer, now)), reviewer, lease_s, now)
            if row is None:
                current = conn.execute(sa.select(review_items).where(visible)).first()
                if current is None:
                    return None
                item = self._item(current, now)
                raise ClaimRefused(item.state, item.reviewer, item.lease_until)
            return self._item(row, now, self._reasons(conn, [item_id]).get(item_id, []))

    def claim_next(
        self,
        reviewer: str,
        tenants: Sequence[str],
        lease_s: float,
        filters: ItemFilters = _ANY,
        now: datetime | None = None,
    ) -> ReviewItem | None:
        """Lease the highest-priority claimable item matching `filters`; None when there is none."""
        if not reviewer:
            raise ValueError("reviewer must not be empty")
        now = now or _now()
        t = review_items.c
        candidate = (
            sa.select(t.id)
            .where(*self._filtered(tenants, replace(filters, state=None), now))
            .where(self._claimable(reviewer, now))
            .order_by(*self._priority())
            .limit(1)
            .with_for_update(skip_locked=True)
        )
        with self._connect(writes=True) as conn:
            # One statement: the UPDATE re-checks claimability on the row it locks.
            row = self._lease(
                conn,
                sa.and_(t.id.in_(candidate.scalar_subquery()), self._claimable(reviewer, now)),
                reviewer,
                lease_s,
                now,
            )
            if row is None:
                return None
            return self._item(row, now, self._reasons(conn, [int(row.id)]).get(int(row.id), []))

    def release(self, item_id: int, reviewer: str, tenants: Sequence[str]) -> bool | None:
        """Give a claimed item back; False if `reviewer` did not hold it, None if the item is not
        visible to them (no such item, or another tenant's: the same answer, as for every action)."""
        t = review_items.c
        visible = sa.and_(t.id == item_id, t.tenant.in_(tenants))
        with self._connect(writes=True) as conn:
            result = conn.execute(
                sa.update(review_items)
                .where(visible, t.reviewer == reviewer, t.state == "claimed")
                .values(state="open", reviewer=None, lease_until=None)
            )
            if result.rowcount == 1:
                return True
            return False if conn.execute(sa.select(t.id).where(visible)).first() is not None else None

    # -- reviews ----------------------------------------------------------------------------------

    def submit(
        self,
        item_id: int,
        reviewer: str,
        tenants: Sequence[str],
        review: ReviewIn,
        now: datetime | None = None,
    ) -> ReviewRecord | None:
        """Record the review of an item `reviewer` holds and close the item.

        Returns None when the item is not visible to the reviewer; raises
        `ClaimRefused` when they do not hold it (never claimed, taken by
        another reviewer after their lease expired, or done by someone else).
        A reviewer whose lease expired but whom nobody replaced may still
        submit. The reviewer who labelled a done item may label it again: the
        later label replaces theirs (one review per item, so it counts once),
        and the record says `replaced`.
        """
        now = now or _now()
        t = review_items.c
        visible = sa.and_(t.id == item_id, t.tenant.in_(tenants))
        values = {
            "reviewer": reviewer,
            "verdict": review.verdict,
            "failure_mode": review.failure_mode,
            "expected_chunk_ids": json.dumps(list(review.expected_chunk_ids)),
            "reference_answer": review.reference_answer,
            "category": review.category,
            "expected_behaviour": review.expected_behaviour,
            "note": review.note,
            "created_at": now,
        }
        with self._connect(writes=True) as conn:
            row = conn.execute(
                sa.update(review_items)
                .where(visible, t.state == "claimed", t.reviewer == reviewer)
                .values(state="done", lease_until=None, done_at=now)
                .returning(t.tenant, t.queue, t.trace_id)
            ).first()
            replaced = False
            if row is None:
                current = conn.execute(sa.select(review_items).where(visible)).first()
                if current is None:
                    return None
                mine = (
                    current.state == "done"
                    and conn.execute(
                        sa.select(reviews.c.item_id).where(
                            reviews.c.item_id == item_id, reviews.c.reviewer == reviewer
                        )
                    ).first()
                    is not None
                )
                if not mine:
                    item = self._item(current, now)
                    raise ClaimRefused(item.state, item.reviewer, item.lease_until)
                row, replaced = current, True
                conn.execute(sa.update(reviews).where(reviews.c.item_id == item_id).values(**values))
                conn.execute(sa.delete(review_claim_labels).where(review_claim_labels.c.item_id == item_id))
            else:
                conn.execute(
                    reviews.insert().values(
                        item_id=item_id, tenant=row.tenant, queue=row.queue, trace_id=row.trace_id, **values
                    )
                )
            if review.claims_supported is not None:
                conn.execute(
                    review_claim_labels.insert().values(
                        item_id=item_id, supported=json.dumps(list(review.claims_supported))
                    )
                )
        return ReviewRecord(item_id, row.tenant, row.queue, row.trace_id, reviewer, review, now, replaced)

    @staticmethod
    def _with_claims() -> sa.Select[Any]:
        c = review_claim_labels.c
        return sa.select(reviews, c.supported.label("claims_supported")).outerjoin(
            review_claim_labels, c.item_id == reviews.c.item_id
        )

    @staticmethod
    def _record(row: Any) -> ReviewRecord:
        return ReviewRecord(
            item_id=int(row.item_id),
            tenant=row.tenant,
            queue=row.queue,
            trace_id=row.trace_id,
            reviewer=row.reviewer,
            review=ReviewIn(
                verdict=row.verdict,
                failure_mode=row.failure_mode,
                expected_chunk_ids=tuple(json.loads(row.expected_chunk_ids)),
                reference_answer=row.reference_answer,
                category=row.category,
                expected_behaviour=row.expected_behaviour,
                note=row.note,
                claims_supported=None
                if row.claims_supported is None
                else tuple(bool(mark) for mark in json.loads(row.claims_supported)),
            ),
            created_at=row.created_at,
        )

    def review_of(self, item_id: int) -> ReviewRecord | None:
        with self._connect() as conn:
            row = conn.execute(self._with_claims().where(reviews.c.item_id == item_id)).first()
        return None if row is None else self._record(row)

    def list_reviews(
        self, tenants: Sequence[str] | None = None, *, since: datetime | None = None
    ) -> list[ReviewRecord]:
        """Reviews, oldest first; `tenants` None means every tenant."""
        r = reviews.c
        query = self._with_claims().order_by(r.created_at, r.item_id)
        if tenants is not None:
            query = query.where(r.tenant.in_(tenants))
        if since is not None:
            query = query.where(r.created_at >= since)
        with self._connect() as conn:
            return [self._record(row) for row in conn.execute(query)]

    # -- progress and calibration -----------------------------------------------------------------

    def progress(self, tenants: Sequence[str] | None = None, now: datetime | None = None) -> Progress:
        """Counts by queue and effective state, by reviewer, and the oldest open item per queue."""
        now = now or _now()
        t = review_items.c
        state = self._effective_state(now)
        scope = [] if tenants is None else [t.tenant.in_(tenants)]
        progress = Progress()
        with self._connect() as conn:
            # Group in an outer query: PostgreSQL will not match a CASE with bound
            # parameters in GROUP BY to the same CASE in the select list.
            inner = sa.select(t.queue, state.label("state"), t.created_at).where(*scope).subquery()
            for queue, item_state, count, oldest in conn.execute(
                sa.select(
                    inner.c.queue, inner.c.state, sa.func.count(), sa.func.min(inner.c.created_at)
                ).group_by(inner.c.queue, inner.c.state)
            ):
                progress.items[(queue, item_state)] = int(count)
                if item_state == "open" and oldest is not None:
                    # min() over a decorated column comes back raw on SQLite
                    progress.oldest_open[queue] = _aware(oldest)
            for reviewer, count in conn.execute(
                sa.select(t.reviewer, sa.func.count()).where(*scope, state == "claimed").group_by(t.reviewer)
            ):
                progress.reviewers[(reviewer, "claimed")] = int(count)
            r = reviews.c
            rscope = [] if tenants is None else [r.tenant.in_(tenants)]
            for reviewer, count in conn.execute(
                sa.select(r.reviewer, sa.func.count()).where(*rscope).group_by(r.reviewer)
            ):
                progress.reviewers[(reviewer, "done")] = int(count)
        return progress

    def calibration_rows(self, tenants: Sequence[str] | None = None) -> list[CalibrationRow]:
        """Every (review, judgment) pair of one trace; a trace judged by several versions pairs with each."""
        r = reviews.c
        j = judgments.c
        query = sa.select(r.queue, j.judge_version, j.outcome, j.faithfulness, r.verdict, r.created_at).join(
            judgments, sa.and_(j.tenant == r.tenant, j.trace_id == r.trace_id)
        )
        if tenants is not None:
            query = query.where(r.tenant.in_(tenants))
        with self._connect() as conn:
            return [
                CalibrationRow(
                    queue=row.queue,
                    judge_version=row.judge_version,
                    judge_outcome=row.outcome,
                    judge_faithfulness=row.faithfulness,
                    verdict=row.verdict,
                    reviewed_at=row.created_at,
                )
                for row in conn.execute(query)
            ]
