"""The judge queue: the `JudgeQueue` interface and its durable SQL implementation.

An item is one trace the sampler selected for one judge version. Its key is
(tenant, trace_id, judge_version); it carries the stratum and inclusion
probability that selected it, so the estimator can weight its verdict.

`SqlJudgeQueue` keeps the queue in a table of the embedded store (SQLite or
PostgreSQL, the same code) and guarantees:

* durability: items live in the database and survive a restart;
* at-least-once delivery: `claim` leases an item to a worker; a lease that
  expires returns the item to the queue for the next `claim`;
* one item per key: enqueuing a key again adds nothing (it may only raise the
  recorded inclusion probability, see `enqueue`);
* nothing disappears: each claim counts an attempt, and an item that used up
  `max_attempts` ends in the visible `failed` state with its last error.

The judge budget is asked as work is claimed (`claim_within`, in fair shares
of tenants: `sampler.fair`). An item the budget had no room for goes back to
`pending`, marked deferred (its `last_error` is the budget's reason), keeps its
inclusion probability and is claimed again as the budget refills; one still
deferred `max_deferral_s` after it was selected ends `skipped` with reason
`expired` (`expire_deferred`). The table is also the record of the sampling
decision: a skipped item is never claimed, but the estimator counts it, and
every item not judged yet, to correct the inclusion probability of its cell.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NamedTuple, Protocol, get_args

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
    case,
    func,
    or_,
    select,
    update,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.types import TypeDecorator

from sampler.budget import REFUSAL_REASONS, RefusalReason
from service.errors import StoreUnavailable

__all__ = [
    "EXPIRED",
    "ITEM_STATES",
    "Admission",
    "Claim",
    "ItemKey",
    "ItemState",
    "JudgeItem",
    "JudgeQueue",
    "QueueRecord",
    "QueueStats",
    "SqlJudgeQueue",
    "create_tables",
    "metadata",
]

ItemState = Literal["pending", "leased", "done", "failed", "skipped"]
ITEM_STATES: tuple[ItemState, ...] = get_args(ItemState)

_TRACE_ID = re.compile(r"^[0-9a-f]{32}$")
_ERROR_CHARS = 500

EXPIRED = "expired"
"""The skip reason of an item the budget deferred for longer than `max_deferral_s`."""


class ItemKey(NamedTuple):
    """What makes a queue item unique: a judgment of one trace by one judge version."""

    tenant: str
    trace_id: str
    judge_version: str


@dataclass(frozen=True, slots=True)
class JudgeItem:
    """A trace selected for judging, with the design facts the estimator needs.

    `inclusion_probability` is the probability that the sampling design
    selects this trace; `stratum` is the stratum whose rate gave it.
    `skip_reason` is set when the budget refused the trace: it is then stored
    as `skipped`, visible but never claimed. Raises ValueError on a malformed
    trace id, a probability outside (0, 1] or a naive timestamp.
    """

    trace_id: str
    tenant: str
    app: str
    stratum: str
    inclusion_probability: float
    judge_version: str
    enqueued_at: datetime
    trace_time: datetime
    release: str | None = None
    intent: str | None = None
    skip_reason: str | None = None

    def __post_init__(self) -> None:
        if not _TRACE_ID.match(self.trace_id):
            raise ValueError(f"trace_id must be 32 lowercase hex digits, got {self.trace_id!r}")
        p = self.inclusion_probability
        if not (math.isfinite(p) and 0.0 < p <= 1.0):
            raise ValueError(f"inclusion_probability must be in (0, 1], got {p!r}")
        if not self.judge_version:
            raise ValueError("judge_version must not be empty")
        for name in ("enqueued_at", "trace_time"):
            if getattr(self, name).tzinfo is None:
                raise ValueError(f"{name} must be timezone-aware")

    @property
    def key(self) -> ItemKey:
        return ItemKey(self.tenant, self.trace_id, self.judge_version)


@dataclass(frozen=True, slots=True)
class QueueRecord:
    """An item as the queue holds it: the item plus its delivery state."""

    item: JudgeItem
    state: ItemState
    attempts: int
    worker: str | None
    lease_until: datetime | None
    last_error: str | None
    completed_at: datetime | None

    @property
    def key(self) -> ItemKey:
        return self.item.key

    @property
    def deferred(self) -> bool:
        """Waiting for the budget: pending, and the budget's refusal was the last thing to happen to it."""
        return self.state == "pending" and self.last_error in REFUSAL_REASONS


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Item counts per state (`pending` without the deferred ones) and the enqueue time of the oldest
    outstanding item (deferred ones left out: they wait for the budget, not for a worker)."""

    pending: int
    leased: int
    done: int
    failed: int
    skipped: int
    oldest_enqueued_at: datetime | None
    deferred: int = 0

    @property
    def depth(self) -> int:
        """Outstanding items the workers can take: waiting (not for the budget) or leased."""
        return self.pending + self.leased


@dataclass(frozen=True, slots=True)
class Claim:
    """What `claim_within` took: the records leased to the worker (the budget admitted each), the
    traces the budget turned back and that were not deferred before (per tenant), and the budget's
    reason when it turned any back."""

    records: list[QueueRecord]
    deferred: dict[str, int]
    refused: RefusalReason | None


class Admission(Protocol):
    """What `claim_within` asks (`sampler.fair.FairAdmission`): the fair order of tenants, and the budget."""

    def order(self, waiting: Mapping[str, int], n: int) -> list[str]:
        """The tenants of the next `n` judgments, given how many traces each has waiting."""
        ...

    def admit(self, tenant: str) -> RefusalReason | None:
        """None when the budget admits one judgment for `tenant`, else why it does not."""
        ...


class JudgeQueue(Protocol):
    """Where selected traces wait for the judge. Delivery is at least once.

    A worker `claim`s a batch with a lease, judges each item, stores the
    result keyed by (trace_id, judge_version), then calls `complete`; on an
    error it calls `fail`, or `release` when it stops before trying.
    """

    def enqueue(self, items: Sequence[JudgeItem]) -> int:
        """Store items; returns how many became new work. Idempotent by `ItemKey`."""
        ...

    def claim(self, n: int, lease_s: float, worker: str) -> list[QueueRecord]:
        """Lease up to `n` items to `worker` for `lease_s` seconds, oldest first."""
        ...

    def complete(self, key: ItemKey) -> bool:
        """Mark an item judged; False if it was already done (or never claimable)."""
        ...

    def fail(
        self, key: ItemKey, *, worker: str, reason: str, permanent: bool = False, retry_after_s: float = 0.0
    ) -> ItemState | None:
        """Record a failed attempt; returns the new state, None if `worker` holds no lease on it."""
        ...

    def release(self, key: ItemKey, *, worker: str) -> bool:
        """Give a leased item back untried; its attempt is not counted."""
        ...

    def depth(self) -> int: ...

    def oldest_age_s(self) -> float: ...

    def stats(self) -> QueueStats: ...


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
    Column("last_error", String(_ERROR_CHARS)),
    Column("completed_at", _UtcDateTime),
    UniqueConstraint("tenant", "trace_id", "judge_version", name="judge_queue_key"),
    CheckConstraint(f"state IN ({_states_sql})", name="judge_queue_state"),
    CheckConstraint(
        "inclusion_probability > 0 AND inclusion_probability <= 1", name="judge_queue_probability"
    ),
    Index("judge_queue_claim", "state", "available_at"),
    Index("judge_queue_trace_time", "trace_time"),
)


def create_tables(engine: Engine) -> None:
    """Create the judge queue tables if they do not exist (safe to call on every start)."""
    metadata.create_all(engine, checkfirst=True)


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
            inserted = {ItemKey(*row) for row in conn.execute(stmt, [_row(i, now) for i in batch])}
            new = {i.key for i in batch if i.key in inserted and i.skip_reason is None}
            for item in batch:
                if item.key in inserted:
                    continue
                where = _key_clause(item.key)
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
                    .where(_key_clause(key), t.state.in_(("done", "failed")))
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
        return [_record(r) for r in sorted(rows, key=lambda r: int(r.id))]

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
        ranked = (
            select(t.id, t.tenant, func.row_number().over(partition_by=t.tenant, order_by=t.id).label("turn"))
            .where(self._claimable(now))
            .subquery()
        )
        with self._connect() as conn:
            self._fail_exhausted(conn, now)
            waiting: dict[str, list[int]] = {}
            for item_id, tenant in conn.execute(
                select(ranked.c.id, ranked.c.tenant).where(ranked.c.turn <= n).order_by(ranked.c.id)
            ):
                waiting.setdefault(tenant, []).append(int(item_id))
        turns = {tenant: iter(ids) for tenant, ids in waiting.items()}
        chosen = [
            next(turns[tenant]) for tenant in admission.order({k: len(v) for k, v in waiting.items()}, n)
        ]
        if not chosen:
            return Claim([], {}, None)
        with self._connect() as conn:
            rows = conn.execute(
                update(judge_queue)
                .where(t.id.in_(chosen), self._claimable(now))
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
            return Claim([_record(r) for r in admitted], {}, None)
        back = leased[len(admitted) :]
        deferred: dict[str, int] = {}
        if back:
            self._turn_back(back, worker, refused)
            for row in back:
                if row.last_error not in REFUSAL_REASONS:
                    deferred[row.tenant] = deferred.get(row.tenant, 0) + 1
        return Claim([_record(r) for r in admitted], deferred, refused)

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
                .where(_key_clause(key), judge_queue.c.state.in_(("pending", "leased", "failed")))
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
            "last_error": reason[:_ERROR_CHARS],
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
                .where(_key_clause(key), t.state == "leased", t.worker == worker)
                .values(**changes)
                .returning(t.state)
            ).first()
        return None if row is None else _state(row.state)

    def release(self, key: ItemKey, *, worker: str) -> bool:
        """Return an item `worker` leased but did not try (shutdown); the attempt is refunded."""
        t = judge_queue.c
        with self._connect() as conn:
            result = conn.execute(
                update(judge_queue)
                .where(_key_clause(key), t.state == "leased", t.worker == worker)
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
        oldest = self.stats().oldest_enqueued_at
        return 0.0 if oldest is None else max(0.0, (self._now() - oldest).total_seconds())

    def stats(self) -> QueueStats:
        t = judge_queue.c
        # grouped on a subquery's column: PostgreSQL does not match a GROUP BY expression that
        # carries bind parameters to the same expression in the select list
        rows = select(t.state, _deferred().label("deferred")).subquery()
        with self._connect() as conn:
            counts = dict.fromkeys(ITEM_STATES, 0)
            waiting_for_budget = 0
            for state, is_deferred, count in conn.execute(
                select(rows.c.state, rows.c.deferred, func.count()).group_by(rows.c.state, rows.c.deferred)
            ):
                if is_deferred:
                    waiting_for_budget += int(count)
                else:
                    counts[_state(state)] += int(count)
            oldest = conn.execute(select(func.min(t.enqueued_at)).where(_outstanding())).scalar_one()
        return QueueStats(oldest_enqueued_at=oldest, deferred=waiting_for_budget, **counts)

    def deferred_by_tenant(self) -> dict[str, int]:
        """Deferred items (waiting for the budget) per tenant."""
        t = judge_queue.c
        with self._connect() as conn:
            rows = conn.execute(select(t.tenant, func.count()).where(_deferred()).group_by(t.tenant)).all()
        return {tenant: int(count) for tenant, count in rows}

    def get(self, key: ItemKey) -> QueueRecord | None:
        """The stored record for `key` (the trace's sampling decision and delivery state)."""
        with self._connect() as conn:
            row = conn.execute(select(judge_queue).where(_key_clause(key))).first()
        return None if row is None else _record(row)

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
            return [_record(r) for r in conn.execute(stmt)]

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


def _key_clause(key: ItemKey) -> Any:
    t = judge_queue.c
    return and_(t.tenant == key.tenant, t.trace_id == key.trace_id, t.judge_version == key.judge_version)


def _row(item: JudgeItem, now: datetime) -> dict[str, object]:
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


def _state(value: str) -> ItemState:
    if value not in ITEM_STATES:
        raise ValueError(f"unknown judge queue state {value!r}")
    return value


def _record(row: Row[Any]) -> QueueRecord:
    state = _state(row.state)
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
