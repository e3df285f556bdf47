"""Tests for sampler/fair.py: weighted fair shares of the judge budget between tenants, through the
real judge queue (SQLite) and the real token buckets on a hand-moved clock."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from sampler.budget import BudgetConfig, JudgeBudget
from sampler.fair import FairAdmission, FairShares
from sampler.queue import JudgeItem
from sampler.queue_table import create_tables
from sampler.sql_queue import SqlJudgeQueue

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def admit(shares: FairShares, waiting: dict[str, int], n: int) -> list[str]:
    """Take `n` turns from `waiting` (tenant -> traces), one at a time, as a worker would."""
    taken = []
    for _ in range(n):
        (tenant,) = shares.order({t: k for t, k in waiting.items() if k}, 1) or [None]
        if tenant is None:
            break
        shares.admitted(tenant)
        waiting[tenant] -= 1
        taken.append(tenant)
    return taken


def test_equal_weights_take_turns_and_order_plans_several() -> None:
    shares = FairShares()
    assert shares.order({"acme": 5, "beta": 2}, 5) == ["acme", "beta", "acme", "beta", "acme"]
    assert shares.order({"acme": 1}, 3) == ["acme"], "never more turns than traces"
    assert shares.order({}, 3) == []
    assert Counter(admit(shares, {"acme": 100, "beta": 100}, 100)) == {"acme": 50, "beta": 50}


def test_weights_set_the_shares() -> None:
    shares = FairShares({"gold": 3.0}, default_weight=1.0)
    taken = Counter(admit(shares, {"gold": 1000, "acme": 1000, "beta": 1000}, 500))
    assert taken == {"gold": 300, "acme": 100, "beta": 100}


def test_an_idle_tenant_lends_its_share_and_banks_no_credit() -> None:
    shares = FairShares()
    # beta has nothing waiting: acme takes every turn (beta's share is lent, not held back)
    assert admit(shares, {"acme": 100, "beta": 0}, 60) == ["acme"] * 60
    # beta starts waiting: from now on the two alternate; beta's idle minute buys it no burst
    taken = admit(shares, {"acme": 40, "beta": 10}, 20)
    assert Counter(taken) == {"acme": 10, "beta": 10}
    assert all(taken[i] != taken[i + 1] for i in range(len(taken) - 1))


def test_bad_weights_are_refused() -> None:
    for weights, default in (({"acme": 0.0}, 1.0), ({}, -1.0), ({"acme": float("inf")}, 1.0)):
        with pytest.raises(ValueError):
            FairShares(weights, default)
    with pytest.raises(ValueError):
        FairAdmission(FairShares(), None, cost_usd=-0.1)


class Clock:
    def __init__(self) -> None:
        self.wall = T0
        self.mono = 0.0

    def advance(self, seconds: float) -> None:
        self.wall += timedelta(seconds=seconds)
        self.mono += seconds


def flood(tenant: str, first: int, n: int, at: datetime) -> list[JudgeItem]:
    return [
        JudgeItem(
            trace_id=f"{first + i:032x}",
            tenant=tenant,
            app="shop",
            stratum="thumbs_down",
            inclusion_probability=1.0,
            judge_version="v1",
            enqueued_at=at,
            trace_time=at,
        )
        for i in range(n)
    ]


def test_one_tenant_floods_and_anothers_few_traces_are_all_judged(tmp_path: Path) -> None:
    """The issue's run: acme sent 600 thumbs-downs, then beta 5. With the budget asked first come
    first served, acme's took every token (69 judged), and beta's 5 were skipped for good. Here
    beta's 5 are judged within the next ten judgments, and nothing is skipped."""
    clock = Clock()
    engine = create_engine(f"sqlite:///{tmp_path / 'queue.db'}")
    create_tables(engine)
    queue = SqlJudgeQueue(engine, clock=lambda: clock.wall)
    budget = JudgeBudget(BudgetConfig(calls_per_minute=60.0, burst_calls=60.0), clock=lambda: clock.mono)
    admission = FairAdmission(FairShares(), budget, cost_usd=0.0005)
    judged: list[str] = []

    def work(seconds: int) -> None:
        """A worker claiming 32 at a time, once a second, judging (completing) what it got."""
        for _ in range(seconds):
            claim = queue.claim_within(32, 60.0, "w", admission)
            for record in claim.records:
                queue.complete(record.key)
                judged.append(record.item.tenant)
            clock.advance(1.0)

    queue.enqueue(flood("acme", 0, 600, clock.wall))
    work(5)  # acme's flood empties the burst
    assert Counter(judged) == {"acme": 64}
    queue.enqueue(flood("beta", 10_000, 5, clock.wall))
    before = len(judged)
    work(10)
    after_beta = judged[before:]
    assert after_beta.count("beta") == 5, after_beta
    positions = [i for i, tenant in enumerate(after_beta) if tenant == "beta"]
    assert positions[0] <= 1 and positions[-1] < 10, f"beta's traces came {positions} judgments after"
    stats = queue.stats()
    assert stats.skipped == 0 and stats.done == len(judged)
    assert stats.deferred + stats.pending == 605 - len(judged)
    assert stats.deferred > 0, "acme's traces over the budget wait in the queue, deferred"
