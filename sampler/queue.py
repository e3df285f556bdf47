"""The judge queue: what it holds (items and their records) and what it promises (`JudgeQueue`).

An item is one trace the sampler selected for one judge version. Its key is
(tenant, trace_id, judge_version); it carries the stratum and inclusion
probability that selected it, so the estimator can weight its verdict. A
`QueueRecord` is the item with its delivery state (`ITEM_STATES`), attempts,
lease and last error. The durable implementation, `SqlJudgeQueue`, is in
`sql_queue.py`.

The judge budget is asked as work is claimed (`Admission`, in fair shares of
tenants: `sampler.fair`). An item the budget had no room for goes back to
`pending`, marked deferred (its `last_error` is the budget's reason), keeps its
inclusion probability and is claimed again as the budget refills; one still
deferred `max_deferral_s` after it was selected ends `skipped` with reason
`EXPIRED`. A skipped item is never claimed, but the estimator counts it, and
every item not judged yet, to correct the inclusion probability of its cell.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, NamedTuple, Protocol, get_args

from sampler.budget import REFUSAL_REASONS, RefusalReason

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
]

ItemState = Literal["pending", "leased", "done", "failed", "skipped"]
ITEM_STATES: tuple[ItemState, ...] = get_args(ItemState)

_TRACE_ID = re.compile(r"^[0-9a-f]{32}$")

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
    outstanding item (deferred ones left out: they wait for the budget, not for a worker). `done`
    and `skipped` are None where they were not counted (`stats(finished=False)`)."""

    pending: int
    leased: int
    done: int | None
    failed: int
    skipped: int | None
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

    def stats(self, *, finished: bool = True) -> QueueStats: ...
