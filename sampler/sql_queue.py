"""`SqlJudgeQueue`: the judge queue (`queue.py`) in a table of the store's database.

`SqlJudgeQueue` keeps the queue in a table of the embedded store (SQLite or
PostgreSQL, the same code) and guarantees:

* durability: items live in the database and survive a restart;
* at-least-once delivery: `claim` leases an item to a worker; a lease that
  expires returns the item to the queue for the next `claim`;
* one item per key: enqueuing a key again adds nothing (it may only raise the
  recorded inclusion probability, see `enqueue`);
* nothing disappears: each claim counts an attempt, and an item that used up
  `max_attempts` ends in the visible `failed` state with its last error.

The judge budget is asked as work is claimed (`claim_within`); deferred items
wait in `pending` and end `skipped` (`expire_deferred`) as `queue.py` says.
The table is also the record of the sampling decision: the estimator reads
every item of a window from it, judged or not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, Row, and_, case, delete, func, or_, select, text, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite

from sampler.budget import REFUSAL_REASONS, RefusalReason
from sampler.queue import (
    EXPIRED,
    ITEM_STATES,
    Admission,
    Claim,
    ItemKey,
    ItemState,
    JudgeItem,
    QueueRecord,
    QueueStats,
)
from sampler.queue_table import MAX_ERROR_CHARS, item_row, item_state, judge_queue, key_clause, queue_record
from service.errors import StoreUnavailable

__all__ = ["SqlJudgeQueue"]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class SqlJudgeQueue:
    """The judge queue in a SQL table, on an `Engine` the caller owns (see the module doc).

    `claim` is safe with concurrent workers: on PostgreSQL candidate rows are
    locked with `FOR UPDATE SKIP LOCKED`, so two workers never lease the same
    item; on SQLite the claim is one `UPDATE ... RETURNING` statement, which
    holds the database write lock. Time comes from `clock` (timezone-aware),
    not from the database, so all replicas should keep their clocks in sync
    to well under a lease. Database outages raise `StoreUnavailable`.
    """

    def __init__(
        self, engine: Engine, *, max_attempts: int = 5, clock: Callable[[], datetime] = _utcnow
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        if engine.dialect.name not in ("sqlite", "postgresql"):
            raise ValueError(f"unsupported database dialect {engine.dialect.name!r}")
        self.engine = engine
        self.max_attempts = max_attempts
        self._clock = clock

    # -- producing -------------------------------------------------------

    def enqueue(self, items: Sequence[JudgeItem]) -> int:
        """Store `items`; returns how many became new claimable work (see `enqueue_new`)."""
        return len(self.enqueue_new(items)[0])

    def enqueue_new(self, items: Sequence[JudgeItem]) -> tuple[set[ItemKey], set[ItemKey]]:
        """Store `items`; returns the keys that became new claimable work, and the keys stored as
        new rows (also those the budget skipped), so counters count each trace once.

        A key already stored adds no new item. Two things may still change
        on it, both so the stored row matches the final sampling design:
        a higher inclusion probability (a late thumbs-down raised it) replaces
        the recorded probability and stratum, whatever the state; and a
        skipped item (its deferral expired) becomes pending again, counted as
        new, when that higher probability comes with it (a redelivered trace
        with the same probability revives nothing).
        """
        batch = _dedupe(items)
        if not batch:
            return set(), set()
        now = self._now()
        insert = postgresql.insert if self.engine.dialect.name == "postgresql" else sqlite.insert
        stmt = (
            insert(judge_queue)
            .on_conflict_do_nothing(index_elements=["tenant", "trace_id", "judge_version"])
            .returning(judge_queue.c.tenant, judge_queue.c.trace_id, judge_queue.c.judge_version)
        )
        with self._connect() as conn:
            inserted = {ItemKey(*row) for row in conn.execute(stmt, [item_row(i, now) for i in batch])}
            new = {i.key for i in batch if i.key in inserted and i.skip_reason is None}
            for item in batch:
                if item.key in inserted:
                    continue
                where = key_clause(item.key)
                if item.skip_reason is None:
                    revived = conn.execute(
                        update(judge_queue)
                        .where(
                            where,
                            judge_queue.c.state == "skipped",
                            judge_queue.c.inclusion_probability < item.inclusion_probability,
                        )
                        .values(
                            state="pending",
                            available_at=now,
                            enqueued_at=item.enqueued_at,
                            last_error=None,
                            attempts=0,
                        )
                    )
                    if revived.rowcount:
                        new.add(item.key)
                conn.execute(
                    update(judge_queue)
                    .where(where, judge_queue.c.inclusion_probability < item.inclusion_probability)
                    .values(inclusion_probability=item.inclusion_probability, stratum=item.stratum)
                )
        return new, inserted

    def rejudge(self, keys: Sequence[ItemKey]) -> set[ItemKey]:
        """Queue judged (or failed) items again: a later version of their trace changed what the judge
        reads (an answer that arrived late). Returns the keys that became pending. An item pending or
        leased is left alone: its worker reads the stored trace when it judges, and checks it again
        after completing (service/judge/judging.py). The item keeps its stratum and inclusion
        probability, and the judgment stored for it is replaced by the new one: one sample per trace."""
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return set()
        t = judge_queue.c
        requeued: set[ItemKey] = set()
        with self._connect() as conn:
            for key in wanted:
                row = conn.execute(
                    update(judge_queue)
                    .where(key_clause(key), t.state.in_(("done", "failed")))
                    .values(
                        state="pending",
                        attempts=0,
                        available_at=self._now(),
                        completed_at=None,
                        last_error=None,
                        worker=None,
                        lease_until=None,
                    )
                    .returning(t.id)
                ).first()
                if row is not None:
                    requeued.add(key)
        return requeued

    # -- consuming -------------------------------------------------------

    def claim(self, n: int, lease_s: float, worker: str) -> list[QueueRecord]:
        """Lease up to `n` claimable items to `worker`, oldest first; each claim is one attempt.

        Claimable: pending and due, or leased with an expired lease and
        attempts left. An expired lease with no attempts left is moved to
        `failed` here, so it stays visible instead of cycling forever.
        """
        _check_claim(n, lease_s, worker)
        now = self._now()
        t = judge_queue.c
        candidates = (
            select(t.id).where(self._claimable(now)).order_by(t.id).limit(n).with_for_update(skip_locked=True)
        )
        with self._connect() as conn:
            self._fail_exhausted(conn, now)
            rows = conn.execute(
                update(judge_queue)
                .where(t.id.in_(candidates.scalar_subquery()))
                .values(**self._lease_values(now, lease_s, worker))
                .returning(*judge_queue.c)
            ).all()
        return [queue_record(r) for r in sorted(rows, key=lambda r: int(r.id))]

    def claim_within(self, n: int, lease_s: float, worker: str, admission: Admission) -> Claim:
        """Lease up to `n` claimable items to `worker` in the order `admission` gives the tenants
        (each tenant's oldest first), keeping those the budget admits (`admission.admit`).

        The items are leased first and asked for one by one, so no admission is spent on an
        item another worker took meanwhile; from the first refusal on, the rest go back to
        `pending` (their attempt refunded), deferred: `last_error` is the budget's reason. When
        the budget cannot be asked (`StoreUnavailable`), the items not admitted go back
        untouched, and the error is raised unless some were admitted already.
        """
        _check_claim(n, lease_s, worker)
        now = self._now()
        t = judge_queue.c
        with self._connect() as conn:
            self._fail_exhausted(conn, now)
            waiting = self._first_turns(conn, now, n)
        turns = {tenant: iter(ids) for tenant, ids in waiting.items()}
        chosen = [
            next(turns[tenant]) for tenant in admission.order({k: len(v) for k, v in waiting.items()}, n)
        ]
        if not chosen:
            return Claim([], {}, None)
        with self._connect() as conn:
            rows = conn.execute(
                update(judge_queue)
                .where(t.id.in_(chosen), self._still_claimable(now))
                .values(**self._lease_values(now, lease_s, worker))
                .returning(*judge_queue.c)
            ).all()
        by_id = {int(row.id): row for row in rows}
        leased = [by_id[item_id] for item_id in chosen if item_id in by_id]
        admitted: list[Row[Any]] = []
        refused: RefusalReason | None = None
        try:
            for row in leased:
                refused = admission.admit(row.tenant)
                if refused is not None:
                    break
                admitted.append(row)
        except StoreUnavailable:
            self._turn_back(leased[len(admitted) :], worker, None)
            if not admitted:
                raise
            return Claim([queue_record(r) for r in admitted], {}, None)
        back = leased[len(admitted) :]
        deferred: dict[str, int] = {}
        if back:
            self._turn_back(back, worker, refused)
            for row in back:
                if row.last_error not in REFUSAL_REASONS:
                    deferred[row.tenant] = deferred.get(row.tenant, 0) + 1
        return Claim([queue_record(r) for r in admitted], deferred, refused)

    def _first_turns(self, conn: Any, now: datetime, n: int) -> dict[str, list[int]]:
        """Each tenant's first `n` claimable items (oldest first): what the fair order picks from.

        Read through the `judge_queue_turns` index (state, tenant, id): the tenants with pending
        items one index seek each, then each one's first pending items in id order, and the few
        items whose lease expired. So a claim reads about `n` rows a tenant however many items wait
        deferred; the window over every claimable row this replaced grew with that backlog
        (bench/RESULTS.md, session 40: 3.9 ms of CPU a claim at 300 waiting, 37 ms at 30,000)."""
        t = judge_queue.c
        waiting: dict[str, list[int]] = {}
        for tenant in conn.execute(_PENDING_TENANTS).scalars():
            # `available_at` inside coalesce (it is never NULL): read through the (state, available_at)
            # index instead, every due row of every tenant would be sorted to find the first n
            due = (
                select(t.id)
                .where(t.state == "pending", t.tenant == tenant, func.coalesce(t.available_at, now) <= now)
                .order_by(t.id)
                .limit(n)
            )
            ids = [int(item_id) for item_id in conn.execute(due).scalars()]
            if ids:
                waiting[tenant] = ids
        lapsed = select(t.id, t.tenant).where(
            t.state == "leased", t.lease_until < now, t.attempts < self.max_attempts
        )
        for item_id, tenant in conn.execute(lapsed):
            waiting.setdefault(tenant, []).append(int(item_id))
        return {tenant: sorted(ids)[:n] for tenant, ids in waiting.items()}

    def delete_older_than(self, cutoff: datetime, *, chunk_size: int = 1_000) -> int:
        """Delete the items of traces that started before `cutoff`, whatever their state (retention:
        the traces go with the trace store's); returns how many went. In transactions of at most
        `chunk_size` items, so the write lock is never held long."""
        t = judge_queue.c
        gone = 0
        while True:
            oldest = select(t.id).where(t.trace_time < cutoff).order_by(t.trace_time).limit(chunk_size)
            with self._connect() as conn:
                result = conn.execute(delete(judge_queue).where(t.id.in_(oldest.scalar_subquery())))
            count = int(result.rowcount)
            gone += count
            if count < chunk_size:
                return gone

    def expire_deferred(self, max_age_s: float) -> dict[str, int]:
        """End `skipped` (reason `expired`) every deferred item selected more than `max_age_s` ago;
        returns how many per tenant (each item is returned to one caller only)."""
        if not (math.isfinite(max_age_s) and max_age_s > 0):
            raise ValueError(f"max_age_s must be a positive number, got {max_age_s!r}")
        selected_before = self._now() - timedelta(seconds=max_age_s)
        t = judge_queue.c
        with self._connect() as conn:
            rows = conn.execute(
                update(judge_queue)
                .where(
                    t.state == "pending",
                    t.last_error.in_(REFUSAL_REASONS),
                    t.enqueued_at < selected_before,
                )
                .values(state="skipped", last_error=EXPIRED, worker=None, lease_until=None)
                .returning(t.tenant)
            ).all()
        expired: dict[str, int] = {}
        for row in rows:
            expired[row.tenant] = expired.get(row.tenant, 0) + 1
        return expired

    def _claimable(self, now: datetime) -> Any:
        """Pending and due, or leased with an expired lease and attempts left."""
        t = judge_queue.c
        return or_(
            and_(t.state == "pending", t.available_at <= now),
            and_(t.state == "leased", t.lease_until < now, t.attempts < self.max_attempts),
        )

    def _still_claimable(self, now: datetime) -> Any:
        """`_claimable` of rows found by id, as a CASE: SQLite reads the OR through the claim index,
        every pending row, where the ids alone find a few rows."""
        t = judge_queue.c
        return case(
            (t.state == "pending", t.available_at <= now),
            (t.state == "leased", and_(t.lease_until < now, t.attempts < self.max_attempts)),
            else_=False,
        )

    def _lease_values(self, now: datetime, lease_s: float, worker: str) -> dict[str, Any]:
        t = judge_queue.c
        return {
            "state": "leased",
            "attempts": t.attempts + 1,
            "worker": worker,
            "lease_until": now + timedelta(seconds=lease_s),
        }

    def _fail_exhausted(self, conn: Any, now: datetime) -> None:
        """An expired lease with no attempts left ends `failed`: visible instead of cycling forever."""
        t = judge_queue.c
        exhausted = (
            select(t.id)
            .where(t.state == "leased", t.lease_until < now, t.attempts >= self.max_attempts)
            .with_for_update(skip_locked=True)
        )
        conn.execute(
            update(judge_queue)
            .where(t.id.in_(exhausted.scalar_subquery()))
            .values(state="failed", worker=None, lease_until=None, last_error="lease expired")
        )

    def _turn_back(self, rows: Sequence[Row[Any]], worker: str, reason: RefusalReason | None) -> None:
        """Leased items back to `pending` untried, their attempt refunded; deferred when `reason`."""
        if not rows:
            return
        t = judge_queue.c
        changes: dict[str, Any] = {
            "state": "pending",
            "attempts": _refunded_attempts(),
            "available_at": self._now(),
            "worker": None,
            "lease_until": None,
        }
        if reason is not None:
            changes["last_error"] = reason
        with self._connect() as conn:
            conn.execute(
                update(judge_queue)
                .where(t.id.in_([int(r.id) for r in rows]), t.state == "leased", t.worker == worker)
                .values(**changes)
            )

    def complete(self, key: ItemKey) -> bool:
        """Mark the item judged. Any worker may complete it, even after its lease expired:
        results are idempotent by (trace_id, judge_version), and a late success beats a
        recorded failure. Returns False if it was already done or was skipped."""
        with self._connect() as conn:
            result = conn.execute(
                update(judge_queue)
                .where(key_clause(key), judge_queue.c.state.in_(("pending", "leased", "failed")))
                .values(state="done", completed_at=self._now(), worker=None, lease_until=None)
            )
        return bool(result.rowcount == 1)

    def fail(
        self,
        key: ItemKey,
        *,
        worker: str,
        reason: str,
        permanent: bool = False,
        retry_after_s: float = 0.0,
        refund: bool = False,
    ) -> ItemState | None:
        """Record that `worker`'s attempt failed with `reason`.

        The item returns to `pending` (claimable after `retry_after_s`), or
        ends `failed` when `permanent` or when its attempts are used up.
        `refund`: the failure was not the item's (the judge endpoint was
        unavailable), so the attempt is given back and the item always returns
        to `pending`; an outage must not use up the attempts of every item
        that happened to be claimed during it.
        Returns the new state, or None when `worker` does not hold the lease
        (it expired and someone else took the item): then nothing changes.
        """
        if not (math.isfinite(retry_after_s) and retry_after_s >= 0):
            raise ValueError(f"retry_after_s must be >= 0, got {retry_after_s!r}")
        if refund and permanent:
            raise ValueError("a refunded failure cannot be permanent")
        t = judge_queue.c
        now = self._now()
        changes: dict[str, Any] = {
            "available_at": now + timedelta(seconds=retry_after_s),
            "last_error": reason[:MAX_ERROR_CHARS],
            "worker": None,
            "lease_until": None,
        }
        if refund:
            changes |= {"state": "pending", "attempts": _refunded_attempts()}
        elif permanent:
            changes["state"] = "failed"
        else:
            changes["state"] = case((t.attempts >= self.max_attempts, "failed"), else_="pending")
        with self._connect() as conn:
            row = conn.execute(
                update(judge_queue)
                .where(key_clause(key), t.state == "leased", t.worker == worker)
                .values(**changes)
                .returning(t.state)
            ).first()
        return None if row is None else item_state(row.state)

    def release(self, key: ItemKey, *, worker: str) -> bool:
        """Return an item `worker` leased but did not try (shutdown); the attempt is refunded."""
        t = judge_queue.c
        with self._connect() as conn:
            result = conn.execute(
                update(judge_queue)
                .where(key_clause(key), t.state == "leased", t.worker == worker)
                .values(
                    state="pending",
                    attempts=_refunded_attempts(),
                    available_at=self._now(),
                    worker=None,
                    lease_until=None,
                )
            )
        return bool(result.rowcount == 1)

    # -- observing -------------------------------------------------------

    def depth(self) -> int:
        """Outstanding items the workers can take: pending (not deferred) or leased."""
        with self._connect() as conn:
            return int(
                conn.execute(select(func.count()).select_from(judge_queue).where(_outstanding())).scalar_one()
            )

    def oldest_age_s(self) -> float:
        """Seconds since the oldest outstanding item was enqueued; 0.0 when there is none."""
        oldest = self.stats(finished=False).oldest_enqueued_at
        return 0.0 if oldest is None else max(0.0, (self._now() - oldest).total_seconds())

    def stats(self, *, finished: bool = True) -> QueueStats:
        """Items per state. The table keeps every sampling decision, so counting the finished ones
        (`done`, `skipped`) reads its whole history: `finished=False` leaves them out (None) and
        reads only the unfinished rows, through the state index, which is what the gauges need on
        every scrape (at a million rows the full count took ~0.5 s; bench/RESULTS.md, session 40)."""
        t = judge_queue.c
        counted = [s for s in ITEM_STATES if finished or s not in _FINISHED]
        # grouped on a subquery's column: PostgreSQL does not match a GROUP BY expression that
        # carries bind parameters to the same expression in the select list
        rows = select(t.state, _deferred().label("deferred")).where(t.state.in_(counted)).subquery()
        counts = dict.fromkeys(counted, 0)
        waiting_for_budget = 0
        with self._connect() as conn:
            for state, is_deferred, count in conn.execute(
                select(rows.c.state, rows.c.deferred, func.count()).group_by(rows.c.state, rows.c.deferred)
            ):
                if is_deferred:
                    waiting_for_budget += int(count)
                else:
                    counts[item_state(state)] += int(count)
            oldest = conn.execute(select(func.min(t.enqueued_at)).where(_outstanding())).scalar_one()
        return QueueStats(
            pending=counts["pending"],
            leased=counts["leased"],
            done=counts.get("done"),
            failed=counts["failed"],
            skipped=counts.get("skipped"),
            oldest_enqueued_at=oldest,
            deferred=waiting_for_budget,
        )

    def deferred_by_tenant(self) -> dict[str, int]:
        """Deferred items (waiting for the budget) per tenant."""
        t = judge_queue.c
        with self._connect() as conn:
            rows = conn.execute(select(t.tenant, func.count()).where(_deferred()).group_by(t.tenant)).all()
        return {tenant: int(count) for tenant, count in rows}

    def get(self, key: ItemKey) -> QueueRecord | None:
        """The stored record for `key` (the trace's sampling decision and delivery state)."""
        with self._connect() as conn:
            row = conn.execute(select(judge_queue).where(key_clause(key))).first()
        return None if row is None else queue_record(row)

    def records(
        self, *, since: datetime, until: datetime | None = None, tenant: str | None = None
    ) -> list[QueueRecord]:
        """All records whose trace started in [since, until), every state included."""
        t = judge_queue.c
        stmt = select(judge_queue).where(t.trace_time >= since).order_by(t.id)
        if until is not None:
            stmt = stmt.where(t.trace_time < until)
        if tenant is not None:
            stmt = stmt.where(t.tenant == tenant)
        with self._connect() as conn:
            return [queue_record(r) for r in conn.execute(stmt)]

    # -- internals -------------------------------------------------------

    def _now(self) -> datetime:
        now = self._clock()
        if now.tzinfo is None:
            raise ValueError("the queue clock must return timezone-aware datetimes")
        return now

    @contextmanager
    def _connect(self) -> Iterator[Any]:
        try:
            with self.engine.begin() as conn:
                yield conn
        except (sa_exc.OperationalError, sa_exc.InterfaceError) as exc:
            raise StoreUnavailable(f"judge queue: database error: {exc.orig!r}") from exc


# The tenants with pending items, smallest first, one seek of the `judge_queue_turns` index each (a
# loose index scan: SQLite and PostgreSQL would otherwise read every pending row to list them).
_PENDING_TENANTS = text(
    "WITH RECURSIVE tenants(tenant) AS ("
    " SELECT MIN(tenant) FROM judge_queue WHERE state = 'pending'"
    " UNION ALL"
    " SELECT (SELECT MIN(later.tenant) FROM judge_queue AS later"
    " WHERE later.state = 'pending' AND later.tenant > tenants.tenant)"
    " FROM tenants WHERE tenants.tenant IS NOT NULL"
    ") SELECT tenant FROM tenants WHERE tenant IS NOT NULL"
)


def _check_claim(n: int, lease_s: float, worker: str) -> None:
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not (math.isfinite(lease_s) and lease_s > 0):
        raise ValueError(f"lease_s must be a positive number, got {lease_s!r}")
    if not worker:
        raise ValueError("worker must not be empty")


def _refunded_attempts() -> Any:
    """The attempt a claim counted, given back (never below zero): `release` and refunded `fail`."""
    return case((judge_queue.c.attempts > 0, judge_queue.c.attempts - 1), else_=0)


_FINISHED = ("done", "skipped")  # the states that hold the history: judged, or not to be


def _deferred() -> Any:
    """Pending items the budget turned back last: they wait for the budget, not for a worker."""
    t = judge_queue.c
    return and_(t.state == "pending", t.last_error.is_not(None), t.last_error.in_(REFUSAL_REASONS))


def _outstanding() -> Any:
    """Items a worker can take now or holds: pending (not deferred) or leased."""
    t = judge_queue.c
    return or_(
        t.state == "leased",
        and_(t.state == "pending", or_(t.last_error.is_(None), t.last_error.not_in(REFUSAL_REASONS))),
    )


def _dedupe(items: Sequence[JudgeItem]) -> list[JudgeItem]:
    """One item per key: the highest inclusion probability, admitted before skipped."""
    best: dict[ItemKey, JudgeItem] = {}
    for item in items:
        if not isinstance(item, JudgeItem):
            raise TypeError(f"expected JudgeItem, got {type(item).__name__}")
        seen = best.get(item.key)
        if seen is None or (item.inclusion_probability, item.skip_reason is None) > (
            seen.inclusion_probability,
            seen.skip_reason is None,
        ):
            best[item.key] = item
    return list(best.values())
