"""`SharedJudgeBudget`: one judge budget for the whole deployment, kept in the database and leased.

Every process that judges (the embedded server; each `sinks` worker in distributed mode) asks
the budget as it takes a trace from the judge queue (`sampler.budget`, `sampler.fair`). With the
buckets in each process, N sinks replicas admitted N times the budget. Here the two token buckets
of `BudgetConfig` (calls per minute and USD per day, each with its burst) are two rows of
`judge_budget_buckets`, shared by every process on the store, and a process takes a slice at a
time:

* **lease**: in one transaction, with the bucket rows locked, refill the buckets for the time
  since they were last touched, take up to `lease_calls` calls and the USD of that many judgments
  (at the estimated cost of the one that asked), and record the lease in `judge_budget_leases`
  with its expiry (`lease_ttl_s`).
* **spend**: each admission is recorded on its lease row (one UPDATE of the process's own row,
  for which nobody else waits) before the worker judges the item. The budget caps
  admissions, so these are a few writes a second at most.
* **return**: a lease that is used up, half-way to its expiry, or released at shutdown goes back
  to the buckets, less what it recorded as spent, and the process leases again.
* **expiry**: a lease whose process never returned it (SIGKILL, a lost node) is returned by the
  next lease transaction after it expired, less what it recorded. Since spending is recorded
  before it is acted on, nothing a dead process admitted comes back and nothing it left unused is
  lost.

Refill stops at capacity minus what outstanding leases still hold, so buckets and leases
together never hold more than one full bucket: over any time T the deployment admits at most
capacity + rate * T, as one process with the whole budget would, however many replicas run.

A process that was refused answers with that refusal for `lease_retry_s` before it asks the
database again, so an empty budget costs one transaction a second per process, not one a trace.

Clocks: refill and expiry use the wall clock of the process in the transaction. Skew between
hosts changes when a lease is reclaimed, never how much: an admission and the reclaim of its
lease serialize on the lease row, and an admission whose lease was reclaimed finds no row and
leases anew. An admission whose item then fails to be judged (its worker died, the endpoint was
down) is admitted again when the item is claimed again, so a failure can spend a judgment twice
(less judging, never more than the budget).
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from sampler.budget import REFUSAL_REASONS, BudgetConfig, BudgetCounts, JudgeBudget, RefusalReason
from service.errors import StoreUnavailable
from service.store.engine import transaction

__all__ = [
    "SharedJudgeBudget",
    "budget_buckets",
    "budget_leases",
    "create_budget_tables",
    "judge_budget",
]

metadata = sa.MetaData()

budget_buckets = sa.Table(
    "judge_budget_buckets",
    metadata,
    sa.Column("name", sa.String(8), primary_key=True),  # calls | usd
    sa.Column("level", sa.Float, nullable=False),  # tokens in the bucket, not counting those leased out
    sa.Column("updated_at", sa.Float, nullable=False),  # unix seconds the bucket was refilled up to
)

budget_leases = sa.Table(
    "judge_budget_leases",
    metadata,
    sa.Column("lease_id", sa.String(32), primary_key=True),
    sa.Column("holder", sa.Text, nullable=False),
    sa.Column("calls", sa.Integer, nullable=False),
    sa.Column("usd", sa.Float, nullable=False),
    sa.Column("calls_used", sa.Integer, nullable=False),
    sa.Column("usd_used", sa.Float, nullable=False),
    sa.Column("granted_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Index("judge_budget_leases_by_expiry", "expires_at"),
)

_CALLS, _USD = "calls", "usd"
# float sums of small costs: a lease of 5 x 0.0005 USD must cover its fifth judgment
_USD_SLACK = 1e-12


def create_budget_tables(engine: Engine) -> None:
    """Create the budget's two tables if missing; safe to repeat."""
    try:
        with transaction(engine, writes=True) as conn:
            metadata.create_all(conn, checkfirst=True)
    except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
        raise StoreUnavailable(f"judge budget unavailable: {type(exc.orig).__name__}") from exc


def judge_budget(config: BudgetConfig, engine: Engine) -> JudgeBudget | SharedJudgeBudget:
    """The budget `config.scope` asks for: the deployment's (in the database) or this process's."""
    if config.scope == "process":
        return JudgeBudget(config)
    return SharedJudgeBudget(engine, config)


@dataclass(slots=True)
class _Lease:
    lease_id: str
    calls_left: int
    usd_left: float
    renew_at: float  # wall clock: returned and leased anew from here on (half its time to live)

    def covers(self, cost_usd: float) -> bool:
        return self.calls_left >= 1 and self.usd_left + _USD_SLACK >= cost_usd


@dataclass(slots=True)
class _Bucket:
    level: float
    updated_at: float


class SharedJudgeBudget:
    """The deployment's judge budget on `engine` (the trace store's), leased a slice at a time.

    `try_admit` answers like `JudgeBudget.try_admit` (calls checked first). Thread-safe. Call
    `release()` at shutdown to hand the unused part of the lease back at once.
    """

    def __init__(
        self,
        engine: Engine,
        config: BudgetConfig | None = None,
        *,
        holder: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.config = config or BudgetConfig()
        self.holder = holder or f"{socket.gethostname()}-{os.getpid()}"
        self._clock = clock
        self._lock = threading.Lock()
        self._lease: _Lease | None = None
        self._refused: tuple[float, RefusalReason] | None = None  # (until, reason) of the last refusal
        self._admitted = 0
        self._admitted_usd = 0.0
        self._refusals: dict[RefusalReason, int] = dict.fromkeys(REFUSAL_REASONS, 0)
        dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
        self._insert_bucket: Any = dialect.insert(budget_buckets).on_conflict_do_nothing()

    def create_schema(self) -> None:
        create_budget_tables(self.engine)

    def try_admit(self, cost_usd: float) -> RefusalReason | None:
        """Admit one judgment of estimated `cost_usd`; None if admitted, else the reason.

        Raises `StoreUnavailable` when the database cannot be asked (the caller's batch is retried).
        """
        if not (math.isfinite(cost_usd) and cost_usd >= 0):
            raise ValueError(f"cost_usd must be a finite number >= 0, got {cost_usd!r}")
        with self._lock:
            reason = self._admit(cost_usd)
            if reason is None:
                self._admitted += 1
                self._admitted_usd += cost_usd
            else:
                self._refusals[reason] += 1
            return reason

    def release(self) -> None:
        """Return the unused part of this process's lease to the deployment now (shutdown)."""
        with self._lock:
            if self._lease is not None:
                self._exchange(None)

    def counts(self) -> BudgetCounts:
        """This process's admissions and refusals (the deployment's sum is in the judge queue)."""
        with self._lock:
            return BudgetCounts(
                admitted=self._admitted, refused=dict(self._refusals), admitted_usd=self._admitted_usd
            )

    def levels(self) -> tuple[float, float]:
        """(call tokens, USD tokens) in the deployment's buckets now, not counting leased ones."""
        now = self._clock()
        with self._database() as conn:
            rows = conn.execute(sa.select(budget_buckets))
            buckets = {row.name: _Bucket(row.level, row.updated_at) for row in rows}
            held_calls, held_usd = _held(conn)
        (calls_cap, usd_cap), (calls_rate, usd_rate) = self.config.capacity(), self.config.rates_per_s()
        calls = buckets.get(_CALLS, _Bucket(calls_cap, now))
        usd = buckets.get(_USD, _Bucket(usd_cap, now))
        return (
            _refilled(calls, now, calls_rate, calls_cap - held_calls),
            _refilled(usd, now, usd_rate, usd_cap - held_usd),
        )

    # -- under self._lock -------------------------------------------------------------------------

    def _admit(self, cost_usd: float) -> RefusalReason | None:
        lease = self._lease
        if lease is not None and lease.covers(cost_usd) and self._clock() < lease.renew_at:
            if self._record(lease, cost_usd):
                return None
            self._lease = None  # expired and reclaimed by another process: what it held is back
        if self._refused is not None and self._clock() < self._refused[0]:
            return self._refused[1]
        reason = self._exchange(cost_usd)
        if reason is not None:
            self._refused = (self._clock() + self.config.lease_retry_s, reason)
            return reason
        self._refused = None
        lease = self._lease
        if lease is not None and self._record(lease, cost_usd):
            return None
        # a lease reclaimed before its first use: only with a time to live shorter than a transaction
        self._lease = None
        return "budget_calls"

    def _record(self, lease: _Lease, cost_usd: float) -> bool:
        """Record one admission on the lease row; False when the row is gone (reclaimed)."""
        leases = budget_leases.c
        with self._database() as conn:
            row = conn.execute(
                sa.update(budget_leases)
                .where(
                    leases.lease_id == lease.lease_id,
                    leases.calls_used < leases.calls,
                    leases.usd_used + cost_usd <= leases.usd + _USD_SLACK,
                )
                .values(calls_used=leases.calls_used + 1, usd_used=leases.usd_used + cost_usd)
                .returning(leases.lease_id)
            ).first()
        if row is None:
            return False
        lease.calls_left -= 1
        lease.usd_left -= cost_usd
        return True

    def _exchange(self, cost_usd: float | None) -> RefusalReason | None:
        """One transaction: return this process's lease and every expired one, refill, and (unless
        `cost_usd` is None) lease a new slice that covers at least one judgment of `cost_usd`."""
        cfg = self.config
        (calls_cap, usd_cap), (calls_rate, usd_rate) = cfg.capacity(), cfg.rates_per_s()
        own = self._lease.lease_id if self._lease is not None else None
        self._lease = None
        now = self._clock()
        leases = budget_leases.c
        with self._database() as conn:
            buckets = self._locked_buckets(conn, now)
            expired = leases.expires_at <= now
            gone = sa.or_(expired, leases.lease_id == own) if own else expired
            back_calls = back_usd = 0.0
            for row in conn.execute(
                sa.delete(budget_leases)
                .where(gone)
                .returning(leases.calls - leases.calls_used, leases.usd - leases.usd_used)
            ):
                back_calls += float(row[0])
                back_usd += float(row[1])
            held_calls, held_usd = _held(conn)
            calls = _refilled(buckets[_CALLS], now, calls_rate, calls_cap - held_calls, back_calls)
            usd = _refilled(buckets[_USD], now, usd_rate, usd_cap - held_usd, back_usd)
            reason: RefusalReason | None = None
            grant_calls, grant_usd = 0, 0.0
            if cost_usd is not None:
                grant_calls = min(cfg.lease_calls, math.floor(calls + 1e-9))
                grant_usd = min(cost_usd * cfg.lease_calls, max(usd, 0.0))
                if grant_calls < 1:
                    reason = "budget_calls"
                elif grant_usd + _USD_SLACK < cost_usd:
                    reason = "budget_usd"
                if reason is not None:
                    grant_calls, grant_usd = 0, 0.0
                else:
                    lease_id = uuid.uuid4().hex
                    conn.execute(
                        sa.insert(budget_leases).values(
                            lease_id=lease_id,
                            holder=self.holder,
                            calls=grant_calls,
                            usd=grant_usd,
                            calls_used=0,
                            usd_used=0.0,
                            granted_at=now,
                            expires_at=now + cfg.lease_ttl_s,
                        )
                    )
                    self._lease = _Lease(lease_id, grant_calls, grant_usd, now + cfg.lease_ttl_s / 2)
            for name, level in ((_CALLS, calls - grant_calls), (_USD, usd - grant_usd)):
                conn.execute(
                    sa.update(budget_buckets)
                    .where(budget_buckets.c.name == name)
                    .values(level=level, updated_at=max(buckets[name].updated_at, now))
                )
        return reason

    def _locked_buckets(self, conn: Connection, now: float) -> dict[str, _Bucket]:
        """The bucket rows, locked until the transaction ends; created full the first time."""
        query = sa.select(budget_buckets).with_for_update()
        rows = conn.execute(query).all()
        if len(rows) < 2:
            calls_cap, usd_cap = self.config.capacity()
            conn.execute(
                self._insert_bucket,
                [
                    {"name": _CALLS, "level": calls_cap, "updated_at": now},
                    {"name": _USD, "level": usd_cap, "updated_at": now},
                ],
            )
            rows = conn.execute(query).all()
        return {row.name: _Bucket(row.level, row.updated_at) for row in rows}

    @contextmanager
    def _database(self) -> Iterator[Connection]:
        try:
            with transaction(self.engine, writes=True) as conn:
                yield conn
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
            raise StoreUnavailable(f"judge budget unavailable: {type(exc.orig).__name__}") from exc


def _held(conn: Connection) -> tuple[float, float]:
    """(calls, USD) the outstanding leases hold and have not recorded as spent."""
    leases = budget_leases.c
    calls, usd = conn.execute(
        sa.select(
            sa.func.coalesce(sa.func.sum(leases.calls - leases.calls_used), 0),
            sa.func.coalesce(sa.func.sum(leases.usd - leases.usd_used), 0.0),
        )
    ).one()
    return float(calls), float(usd)


def _refilled(bucket: _Bucket, now: float, rate_per_s: float, room: float, returned: float = 0.0) -> float:
    """The bucket's level at `now`: refilled at `rate_per_s` since it was last touched (a clock
    behind that time adds nothing), plus `returned` tokens, and at most `room` (its capacity less
    what outstanding leases still hold)."""
    elapsed = max(0.0, now - bucket.updated_at)
    return min(room, bucket.level + elapsed * rate_per_s + returned)
