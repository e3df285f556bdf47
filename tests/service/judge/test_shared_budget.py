"""`SharedJudgeBudget`: one judge budget for every process on a database, leased in slices.

In-process cases run on SQLite and PostgreSQL with a hand-driven clock (refill and expiry exact);
the cross-process cases start real processes on one PostgreSQL (`spend_budget.py`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from sampler.budget import BudgetConfig, JudgeBudget
from service.config import load_config
from service.errors import StoreUnavailable
from service.judge.shared_budget import SharedJudgeBudget, budget_leases, create_budget_tables
from service.model import RagTrace
from service.pipeline import Pipeline
from service.store.trace_store import Store

ROOT = Path(__file__).resolve().parents[3]
# a refill this slow adds no whole call within a test: what is admitted is the burst, exactly
NO_REFILL: dict[str, Any] = {"calls_per_minute": 0.0001, "usd_per_day": 1000.0}


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def engine(store_url: str) -> Iterator[sa.Engine]:
    store = Store(store_url)
    create_budget_tables(store.engine)
    try:
        yield store.engine
    finally:
        store.close()


def budget(engine: sa.Engine, clock: Clock, holder: str, **settings: Any) -> SharedJudgeBudget:
    return SharedJudgeBudget(engine, BudgetConfig(**settings), holder=holder, clock=clock)


def drain(spender: SharedJudgeBudget | JudgeBudget, cost: float = 0.0) -> int:
    """Admit until the first refusal; the number admitted."""
    admitted = 0
    while spender.try_admit(cost) is None:
        admitted += 1
    return admitted


def lease_rows(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(budget_leases)))


def test_one_process_admits_the_burst_then_refuses(engine: sa.Engine) -> None:
    clock = Clock()
    one = budget(engine, clock, "a", **NO_REFILL, burst_calls=7, lease_calls=3)
    assert [one.try_admit(0.0) for _ in range(10)] == [None] * 7 + ["budget_calls"] * 3
    counts = one.counts()
    assert (counts.admitted, counts.refused["budget_calls"]) == (7, 3)
    one.release()
    assert lease_rows(engine) == []
    assert one.levels()[0] == pytest.approx(0.0, abs=1e-6)


def test_spend_is_refused_for_usd_when_calls_remain(engine: sa.Engine) -> None:
    clock = Clock()
    one = budget(engine, clock, "a", calls_per_minute=60, usd_per_day=0.0001, burst_usd=0.01, lease_calls=5)
    assert [one.try_admit(0.003) for _ in range(5)] == [None] * 3 + ["budget_usd"] * 2
    assert one.counts().admitted_usd == pytest.approx(0.009)


def test_two_processes_share_one_budget_and_a_returned_lease_is_spent_again(engine: sa.Engine) -> None:
    clock = Clock()
    settings = {**NO_REFILL, "burst_calls": 10, "lease_calls": 4, "lease_retry_s": 1.0}
    a, b = budget(engine, clock, "a", **settings), budget(engine, clock, "b", **settings)
    assert a.try_admit(0.0) is None  # a holds a lease of 4 with 3 left
    assert drain(b) == 6  # all that is not leased to a
    a.release()
    assert b.try_admit(0.0) == "budget_calls", "refused for lease_retry_s without asking again"
    clock.now += 1.0
    assert drain(b) == 3  # what a gave back
    assert a.counts().admitted + b.counts().admitted == 10


def test_a_dead_holders_lease_expires_and_comes_back_less_what_it_spent(engine: sa.Engine) -> None:
    clock = Clock()
    settings = {**NO_REFILL, "burst_calls": 20, "lease_calls": 5, "lease_ttl_s": 30.0, "lease_retry_s": 1.0}
    dead, alive = budget(engine, clock, "dead", **settings), budget(engine, clock, "alive", **settings)
    assert [dead.try_admit(0.0), dead.try_admit(0.0)] == [None, None]  # then it dies, lease in hand
    assert drain(alive) == 15
    clock.now += 29.0
    assert drain(alive) == 0, "not expired yet"
    clock.now += 1.0
    assert drain(alive) == 3  # the 5 leased less the 2 recorded as spent
    assert lease_rows(engine) == [] or all(row.holder == "alive" for row in lease_rows(engine))
    # had it lived on, its reclaimed lease would not be spent a second time
    assert dead.try_admit(0.0) == "budget_calls"
    assert dead.counts().admitted + alive.counts().admitted == 20


def test_buckets_and_outstanding_leases_together_hold_at_most_one_bucket(engine: sa.Engine) -> None:
    clock = Clock()
    settings = {**NO_REFILL, "calls_per_minute": 60, "burst_calls": 10, "lease_calls": 5, "lease_ttl_s": 1000}
    a, b = budget(engine, clock, "a", **settings), budget(engine, clock, "b", **settings)
    assert a.try_admit(0.0) is None  # a holds 4 unspent calls
    clock.now += 100.0  # 100 calls of refill, but the bucket holds 10 with a's lease
    assert drain(b) == 6
    assert drain(a) == 4
    clock.now += 3.0  # and from there on it refills at the rate: 1 call a second
    assert drain(b) == 3


def test_refill_follows_the_rate_across_processes(engine: sa.Engine) -> None:
    clock = Clock()
    settings = {"calls_per_minute": 30, "burst_calls": 4, "usd_per_day": 1000, "lease_calls": 2}
    a, b = budget(engine, clock, "a", **settings), budget(engine, clock, "b", **settings)
    assert drain(a) == 4
    for _ in range(10):
        clock.now += 2.0  # one call of refill every 2 s, taken by whichever asks first
        assert drain(b) + drain(a) == 1
    assert a.counts().admitted + b.counts().admitted == 4 + 10


def test_the_database_down_is_an_error_not_a_refusal(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'ragmon.db'}")
    create_budget_tables(store.engine)
    one = SharedJudgeBudget(store.engine, BudgetConfig(**NO_REFILL, burst_calls=3), holder="a")
    assert one.try_admit(0.0) is None
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE judge_budget_leases")
    with pytest.raises(StoreUnavailable):
        one.try_admit(0.0)
    store.close()


# -- the running service -------------------------------------------------------------------------


def _traces(first: int, n: int) -> list[RagTrace]:
    start = datetime(2025, 1, 6, tzinfo=UTC)
    return [
        RagTrace(trace_id=f"{i:032x}", app="shop", start_time=start, query="q", answer="a")
        for i in range(first, first + n)
    ]


@pytest.mark.postgres
@pytest.mark.parametrize(("scope", "judged"), [("deployment", 9), ("process", 18)])
def test_two_pipelines_on_one_postgresql_judge_one_budget(
    tmp_path: Path, postgres_url: str, scope: str, judged: int
) -> None:
    """Two replicas whose judge workers claim from one queue admit the budget once between them
    (scope deployment); with a budget per process they admit it twice."""
    settings = {
        "data_dir": str(tmp_path),
        "store": {"url": postgres_url},
        "sampler": {"rates": {"base": 1.0}},
        "budget": {**NO_REFILL, "burst_calls": 9, "lease_calls": 2, "scope": scope},
    }
    replicas = [Pipeline(load_config(environ={}, overrides=settings)) for _ in range(2)]
    try:
        replicas[0].create_schema()
        replicas[0].judge_queue.enqueue(replicas[0].sampler.select(_traces(0, 40)))
        admitted = 0
        for _ in range(4):  # the replicas' workers take turns, as their claims would come
            for n, replica in enumerate(replicas):
                claim = replica.judge_queue.claim_within(5, 60.0, f"worker-{n}", replica.admission)
                admitted += len(claim.records)
        assert admitted == judged
        stats = replicas[0].judge_queue.stats()
        assert (stats.leased, stats.deferred + stats.pending) == (judged, 40 - judged)
    finally:
        for replica in replicas:
            replica.store.close()


def _spender(url: str, settings: dict[str, Any], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.service.judge.spend_budget", url, json.dumps(settings), *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.postgres
@pytest.mark.parametrize(("scope", "judged"), [("deployment", 60), ("process", 120)])
def test_two_processes_on_one_postgresql_spend_the_budget_exactly(
    postgres_url: str, scope: str, judged: int
) -> None:
    store = Store(postgres_url)
    create_budget_tables(store.engine)
    store.close()
    settings = {**NO_REFILL, "burst_calls": 60, "lease_calls": 3, "scope": scope}
    spenders = [_spender(postgres_url, settings, "drain") for _ in range(2)]
    for spender in spenders:  # both start at once, before either is read
        assert spender.stdin is not None
        spender.stdin.write("go\n")
        spender.stdin.flush()
    outputs = [p.communicate(timeout=60)[0] for p in spenders]
    assert [p.returncode for p in spenders] == [0, 0]
    assert sum(int(out) for out in outputs) == judged, outputs


@pytest.mark.postgres
def test_a_sigkilled_leaseholders_lease_expires_and_is_spent_by_the_others(postgres_url: str) -> None:
    ttl = 5.0
    settings = {**NO_REFILL, "burst_calls": 30, "lease_calls": 10, "lease_ttl_s": ttl, "lease_retry_s": 0.05}
    store = Store(postgres_url)
    try:
        create_budget_tables(store.engine)
        holder = _spender(postgres_url, settings, "hold", "4")
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "held 4"
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait(10)
        survivor = SharedJudgeBudget(store.engine, BudgetConfig(**settings), holder="survivor")
        assert drain(survivor) == 30 - 10  # the dead process's lease is still out
        (lease,) = lease_rows(store.engine)
        assert (lease.calls, lease.calls_used) == (10, 4)
        deadline = time.monotonic() + ttl + 30
        while survivor.try_admit(0.001) is not None:  # until it expired
            assert time.monotonic() < deadline, "the dead process's lease never came back"
            time.sleep(0.1)
        assert 1 + drain(survivor, 0.001) == 10 - 4
        survivor.release()
        assert lease_rows(store.engine) == []
    finally:
        store.close()
