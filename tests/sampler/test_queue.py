"""Tests for sampler/queue.py, queue_table.py and sql_queue.py: the durable judge queue on SQLite and (with
DATABASE_URL) PostgreSQL."""

from __future__ import annotations

import functools
import os
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from sqlalchemy import Engine, create_engine, event, inspect, make_url, text

from sampler.budget import RefusalReason
from sampler.fair import FairShares
from sampler.queue import (
    EXPIRED,
    ITEM_STATES,
    ItemKey,
    JudgeItem,
    JudgeQueue,
    QueueRecord,
)
from sampler.queue_table import create_tables, metadata
from sampler.sql_queue import SqlJudgeQueue
from service.errors import StoreUnavailable
from service.store.trace_store import Store

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


class ManualClock:
    """A wall clock the test moves by hand, so lease expiry needs no sleeping."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def postgres_url() -> str | None:
    raw = os.environ.get("DATABASE_URL")
    if not raw:
        return None
    url = make_url(raw)
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    return url.render_as_string(hide_password=False)


@pytest.fixture(scope="module")
def pg_database() -> Iterator[str]:
    """A database of its own for this module, dropped afterwards."""
    base = postgres_url()
    if base is None:
        pytest.skip(
            "DATABASE_URL is not set; the PostgreSQL judge-queue tests need a server, "
            "e.g. DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:25432/postgres"
        )
    name = f"ragmon_test_queue_{uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'queue.db'}"
    return str(request.getfixturevalue("pg_database"))


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """The engine ragmon runs the queue on: the store's (`pipeline.py`), on SQLite in WAL mode with
    synchronous=NORMAL and the store's busy timeout. A bare `create_engine` keeps SQLite's rollback
    journal, where every commit fsyncs and four threads took turns at the write lock for up to 2 s
    a call on a loaded machine, past pysqlite's 5 s busy timeout at worst ('database is locked')."""
    store = Store(db_url)
    metadata.drop_all(store.engine)
    create_tables(store.engine)
    yield store.engine
    store.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def queue(engine: Engine, clock: ManualClock) -> SqlJudgeQueue:
    return SqlJudgeQueue(engine, max_attempts=3, clock=clock)


def item(
    n: int,
    *,
    p: float = 0.02,
    stratum: str = "base",
    tenant: str = "default",
    version: str = "judge-v1",
    skip: str | None = None,
) -> JudgeItem:
    return JudgeItem(
        trace_id=f"{n:032x}",
        tenant=tenant,
        app="shop",
        stratum=stratum,
        inclusion_probability=p,
        judge_version=version,
        enqueued_at=T0 + timedelta(seconds=n),
        trace_time=T0 + timedelta(seconds=n) - timedelta(minutes=1),
        release="r1",
        intent="faq",
        skip_reason=skip,
    )


def test_sql_queue_satisfies_the_protocol(queue: SqlJudgeQueue) -> None:
    q: JudgeQueue = queue
    assert q.depth() == 0


def test_enqueue_is_idempotent_by_key(queue: SqlJudgeQueue) -> None:
    items = [item(i) for i in range(5)]
    assert queue.enqueue(items) == 5
    assert queue.enqueue(items) == 0
    assert queue.enqueue([*items[:2], item(0)]) == 0
    assert queue.depth() == 5
    # Another judge version or tenant is another item.
    assert queue.enqueue([item(0, version="judge-v2"), item(0, tenant="acme")]) == 2
    assert queue.depth() == 7


def test_items_round_trip_with_their_design_facts(queue: SqlJudgeQueue) -> None:
    original = item(7, p=0.25, stratum="low_retrieval")
    queue.enqueue([original])
    record = queue.get(original.key)
    assert record is not None
    assert record.item == original
    assert (record.state, record.attempts, record.worker) == ("pending", 0, None)
    assert queue.get(ItemKey("default", f"{8:032x}", "judge-v1")) is None


def test_claim_leases_oldest_first_and_never_twice(queue: SqlJudgeQueue) -> None:
    queue.enqueue([item(i) for i in range(5)])
    first = queue.claim(3, lease_s=30, worker="w1")
    second = queue.claim(10, lease_s=30, worker="w2")
    assert [r.item.trace_id for r in first] == [f"{i:032x}" for i in range(3)]
    assert [r.item.trace_id for r in second] == [f"{i:032x}" for i in range(3, 5)]
    assert all(r.state == "leased" and r.attempts == 1 for r in first + second)
    assert {r.worker for r in first} == {"w1"}
    assert queue.claim(10, lease_s=30, worker="w3") == []
    assert queue.depth() == 5
    stats = queue.stats()
    assert (stats.pending, stats.leased) == (0, 5)


def test_complete_is_idempotent(queue: SqlJudgeQueue) -> None:
    queue.enqueue([item(1), item(2)])
    (claimed, _) = queue.claim(2, lease_s=30, worker="w1")
    assert queue.complete(claimed.key) is True
    assert queue.complete(claimed.key) is False
    record = queue.get(claimed.key)
    assert record is not None and record.state == "done" and record.completed_at is not None
    assert queue.depth() == 1
    assert queue.stats().done == 1


def test_expired_lease_returns_the_item(queue: SqlJudgeQueue, clock: ManualClock) -> None:
    queue.enqueue([item(1)])
    (first,) = queue.claim(1, lease_s=30, worker="slow")
    clock.advance(29)
    assert queue.claim(1, lease_s=30, worker="fast") == []
    clock.advance(2)
    (again,) = queue.claim(1, lease_s=30, worker="fast")
    assert again.key == first.key and again.attempts == 2 and again.worker == "fast"
    # The slow worker lost its lease: its failure changes nothing ...
    assert queue.fail(first.key, worker="slow", reason="timeout") is None
    assert queue.release(first.key, worker="slow") is False
    # ... but its success still counts once, and the fast worker's is then a no-op.
    assert queue.complete(first.key) is True
    assert queue.complete(again.key) is False


def test_failures_retry_until_max_attempts_then_stay_visible(
    queue: SqlJudgeQueue, clock: ManualClock
) -> None:
    queue.enqueue([item(1)])
    states = []
    for _ in range(3):
        (claimed,) = queue.claim(1, lease_s=30, worker="w")
        states.append(queue.fail(claimed.key, worker="w", reason="HTTP 503"))
    assert states == ["pending", "pending", "failed"]
    assert queue.claim(1, lease_s=30, worker="w") == []
    record = queue.get(item(1).key)
    assert record is not None
    assert (record.state, record.attempts, record.last_error) == ("failed", 3, "HTTP 503")
    assert queue.stats().failed == 1 and queue.depth() == 0


def test_lease_expiry_on_the_last_attempt_ends_failed(queue: SqlJudgeQueue, clock: ManualClock) -> None:
    queue.enqueue([item(1)])
    for _ in range(3):
        assert len(queue.claim(1, lease_s=10, worker="crashy")) == 1
        clock.advance(11)
    assert queue.claim(1, lease_s=10, worker="w") == []
    record = queue.get(item(1).key)
    assert record is not None and record.state == "failed" and record.last_error == "lease expired"


def test_permanent_failure_and_retry_delay(queue: SqlJudgeQueue, clock: ManualClock) -> None:
    queue.enqueue([item(1), item(2)])
    a, b = queue.claim(2, lease_s=30, worker="w")
    assert queue.fail(a.key, worker="w", reason="partition broken", permanent=True) == "failed"
    assert queue.fail(b.key, worker="w", reason="429", retry_after_s=60) == "pending"
    clock.advance(59)
    assert queue.claim(5, lease_s=30, worker="w") == []
    clock.advance(2)
    assert [r.key for r in queue.claim(5, lease_s=30, worker="w")] == [b.key]


def test_an_unavailable_endpoint_never_uses_up_the_attempts(queue: SqlJudgeQueue, clock: ManualClock) -> None:
    """A judge outage longer than max_attempts rounds leaves the item waiting, not failed."""
    queue.enqueue([item(1)])
    for _ in range(10):  # max_attempts is 3 here
        (claimed,) = queue.claim(1, lease_s=30, worker="w")
        assert claimed.attempts == 1
        state = queue.fail(claimed.key, worker="w", reason="connection_error", retry_after_s=5, refund=True)
        assert state == "pending"
        assert queue.claim(1, lease_s=30, worker="w") == []  # the retry delay still holds
        clock.advance(6)
    record = queue.get(item(1).key)
    assert record is not None
    assert (record.state, record.attempts, record.last_error) == ("pending", 0, "connection_error")
    # a failure of the item itself still counts
    (claimed,) = queue.claim(1, lease_s=30, worker="w")
    assert queue.fail(claimed.key, worker="w", reason="garbage output") == "pending"
    assert queue.get(item(1).key).attempts == 1  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="cannot be permanent"):
        queue.fail(claimed.key, worker="w", reason="x", permanent=True, refund=True)


def test_release_refunds_the_attempt(queue: SqlJudgeQueue) -> None:
    queue.enqueue([item(1)])
    (claimed,) = queue.claim(1, lease_s=30, worker="w")
    assert queue.release(claimed.key, worker="other") is False
    assert queue.release(claimed.key, worker="w") is True
    (again,) = queue.claim(1, lease_s=30, worker="w")
    assert again.attempts == 1


def test_higher_inclusion_probability_replaces_the_recorded_one(queue: SqlJudgeQueue) -> None:
    queue.enqueue([item(1, p=0.02)])
    (claimed,) = queue.claim(1, lease_s=30, worker="w")
    queue.complete(claimed.key)
    # A late thumbs-down raises the design probability of an already judged trace.
    assert queue.enqueue([item(1, p=1.0, stratum="thumbs_down")]) == 0
    record = queue.get(claimed.key)
    assert record is not None
    assert (record.state, record.item.inclusion_probability, record.item.stratum) == (
        "done",
        1.0,
        "thumbs_down",
    )
    # A lower one never lowers it.
    queue.enqueue([item(1, p=0.25, stratum="regeneration")])
    record = queue.get(claimed.key)
    assert record is not None and record.item.inclusion_probability == 1.0


def test_skipped_items_are_kept_but_never_claimed(queue: SqlJudgeQueue) -> None:
    assert queue.enqueue([item(1, skip="budget_calls"), item(2)]) == 1
    assert queue.depth() == 1
    assert [r.item.trace_id for r in queue.claim(5, lease_s=30, worker="w")] == [f"{2:032x}"]
    record = queue.get(item(1).key)
    assert record is not None
    assert (record.state, record.item.skip_reason) == ("skipped", "budget_calls")
    assert queue.stats().skipped == 1
    # The same trace offered again (a redelivery) revives nothing ...
    assert queue.enqueue([item(1)]) == 0
    assert queue.claim(5, lease_s=30, worker="w") == []
    # ... a new sampling decision with a higher probability (a late thumbs-down) makes it work again.
    assert queue.enqueue([item(1, p=1.0, stratum="thumbs_down")]) == 1
    assert [r.item.trace_id for r in queue.claim(5, lease_s=30, worker="w")] == [f"{1:032x}"]


class Budget:
    """An admission that admits `room` judgments, in the order the tenants come (`FairShares`)."""

    def __init__(self, room: int, shares: FairShares | None = None) -> None:
        self.room = room
        self.shares = shares or FairShares()
        self.admitted: list[str] = []

    def order(self, waiting: Mapping[str, int], n: int) -> list[str]:
        return self.shares.order(waiting, n)

    def admit(self, tenant: str) -> RefusalReason | None:
        if self.room <= 0:
            return "budget_calls"
        self.room -= 1
        self.shares.admitted(tenant)
        self.admitted.append(tenant)
        return None


def test_claim_within_takes_turns_and_defers_what_the_budget_has_no_room_for(
    queue: SqlJudgeQueue, clock: ManualClock
) -> None:
    queue.enqueue(
        [item(n, tenant="acme") for n in range(20)] + [item(100 + n, tenant="beta") for n in range(3)]
    )
    budget = Budget(room=4)
    claim = queue.claim_within(6, 30.0, "w", budget)
    # turns alternate (ties by name), each tenant's oldest first; the rest of the six went back, deferred
    assert [(r.item.tenant, r.item.trace_id) for r in claim.records] == [
        ("acme", f"{0:032x}"),
        ("beta", f"{100:032x}"),
        ("acme", f"{1:032x}"),
        ("beta", f"{101:032x}"),
    ]
    assert (claim.deferred, claim.refused) == ({"acme": 1, "beta": 1}, "budget_calls")
    stats = queue.stats()
    assert (stats.leased, stats.deferred, stats.pending, stats.depth) == (4, 2, 17, 21)
    deferred = queue.get(item(102, tenant="beta").key)
    assert deferred is not None and deferred.deferred and deferred.attempts == 0
    assert deferred.item.inclusion_probability == 0.02, "a deferred item keeps its probability"
    # turned back again, a deferred item is not counted again
    assert queue.claim_within(6, 30.0, "w", Budget(room=0)).deferred == {"acme": 4}
    assert queue.deferred_by_tenant() == {"acme": 5, "beta": 1}
    # as the budget refills, beta's last trace comes on its turn, not after acme's backlog
    budget.room = 2
    refilled = queue.claim_within(6, 30.0, "w", budget)
    assert sorted(r.item.tenant for r in refilled.records) == ["acme", "beta"]
    taken = queue.get(item(102, tenant="beta").key)
    assert taken is not None and (taken.state, taken.attempts, taken.deferred) == ("leased", 1, False)


def test_deferrals_expire_into_skipped(queue: SqlJudgeQueue, clock: ManualClock) -> None:
    queue.enqueue([item(n, tenant="acme") for n in range(3)] + [item(10, tenant="beta")])
    queue.claim_within(4, 30.0, "w", Budget(room=1))  # acme's oldest admitted, three deferred
    assert queue.expire_deferred(3600.0) == {}
    clock.advance(3600 + 11)
    assert queue.expire_deferred(3600.0) == {"acme": 2, "beta": 1}
    assert queue.expire_deferred(3600.0) == {}, "each expiry is counted once"
    expired = queue.get(item(10, tenant="beta").key)
    assert expired is not None and (expired.state, expired.item.skip_reason) == ("skipped", EXPIRED)
    leased = queue.get(item(0, tenant="acme").key)
    assert leased is not None and leased.state == "leased", "only deferred items expire"
    assert queue.stats().skipped == 3


def _sqlite_steps(engine: Engine, call: Callable[[], object]) -> int:
    """How many SQLite virtual-machine instructions `call` ran, in hundreds (every connection)."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.set_progress_handler(count, 100)

    engine.dispose()  # pooled connections reconnect, each with the handler
    event.listen(engine, "connect", on_connect)
    try:
        call()
    finally:
        event.remove(engine, "connect", on_connect)
        engine.dispose()
    return steps


def test_a_claim_reads_as_much_however_many_items_wait_deferred(tmp_path: Path) -> None:
    """Under a spent budget the backlog grows by every trace sampled and not judged (hours of it,
    up to `max_deferral_s`), and the worker claims about once a second. A claim reads each tenant's
    first few items through an index: the window over every claimable row it replaced, and the
    lease found through the claim index, grew with the backlog (bench/RESULTS.md, session 40)."""
    steps = {}
    for backlog in (300, 6_000):
        store = Store(f"sqlite:///{tmp_path / f'{backlog}.db'}")
        create_tables(store.engine)
        clock = ManualClock()
        queue = SqlJudgeQueue(store.engine, max_attempts=3, clock=clock)
        queue.enqueue([item(n, tenant=("acme", "beta", "gamma")[n % 3]) for n in range(backlog)])
        queue.claim_within(32, 30.0, "w", Budget(room=0))  # the first turns are deferred already
        clock.advance(1)
        one_claim = functools.partial(queue.claim_within, 32, 30.0, "w", Budget(room=1))
        steps[backlog] = _sqlite_steps(store.engine, one_claim)
        store.close()
    assert steps[300] > 0, steps
    # 20 times the backlog: the same reads (the window and the OR read 14 times as much)
    assert steps[6_000] <= 1.5 * steps[300], steps


def test_unfinished_stats_leave_the_history_out_and_read_as_much_however_long_it_is(
    tmp_path: Path,
) -> None:
    """The gauges read the queue's stats on every scrape; the table keeps every decision (done,
    skipped), so counting those read the whole history each time."""
    steps, seen = {}, {}
    for history in (300, 6_000):
        store = Store(f"sqlite:///{tmp_path / f'{history}.db'}")
        create_tables(store.engine)
        queue = SqlJudgeQueue(store.engine, max_attempts=3, clock=ManualClock())
        queue.enqueue([item(n) for n in range(history + 10)])
        for record in queue.claim(history, 30.0, "w"):
            queue.complete(record.key)
        queue.claim(2, 30.0, "w")  # two leased, eight pending
        queue.claim_within(8, 30.0, "w", Budget(room=0))  # ... all eight deferred
        full = queue.stats()
        seen[history] = unfinished = queue.stats(finished=False)
        assert (full.done, full.skipped) == (history, 0)
        assert (unfinished.done, unfinished.skipped) == (None, None)
        assert unfinished == replace(full, done=None, skipped=None)
        steps[history] = _sqlite_steps(store.engine, functools.partial(queue.stats, finished=False))
        store.close()
    assert (seen[300].leased, seen[300].deferred, seen[300].depth) == (2, 8, 2)
    assert steps[300] > 0, steps
    assert steps[6_000] <= 1.5 * steps[300], steps


def test_retention_deletes_the_items_of_traces_from_before_the_cutoff(queue: SqlJudgeQueue) -> None:
    queue.enqueue([item(n) for n in range(7)])  # trace n started at T0 + n s - 1 min
    for record in queue.claim(3, 30.0, "w"):  # a mix of states goes: done, leased, pending
        if record.item.trace_id == f"{0:032x}":
            queue.complete(record.key)
    cutoff = T0 + timedelta(seconds=5) - timedelta(minutes=1)
    assert queue.delete_older_than(cutoff, chunk_size=2) == 5  # in chunks of 2, 2, 1
    assert [queue.get(item(n).key) is not None for n in range(7)] == [False] * 5 + [True] * 2
    assert queue.delete_older_than(cutoff) == 0


def test_an_existing_queue_table_gets_the_indexes_added_since(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("DROP INDEX judge_queue_turns"))
    create_tables(engine)
    assert "judge_queue_turns" in {index["name"] for index in inspect(engine).get_indexes("judge_queue")}


def test_claim_within_survives_a_budget_that_cannot_be_asked(queue: SqlJudgeQueue) -> None:
    class Unreachable(Budget):
        def admit(self, tenant: str) -> RefusalReason | None:
            if self.room <= 0:
                raise StoreUnavailable("judge budget unavailable: OperationalError")
            return super().admit(tenant)

    queue.enqueue([item(n) for n in range(4)])
    claim = queue.claim_within(4, 30.0, "w", Unreachable(room=1))
    assert len(claim.records) == 1 and claim.deferred == {}
    with pytest.raises(StoreUnavailable):
        queue.claim_within(4, 30.0, "w", Unreachable(room=0))
    stats = queue.stats()
    assert (stats.leased, stats.pending, stats.deferred) == (1, 3, 0), (
        "what was not admitted went back untried"
    )
    assert all(r.attempts == 0 for r in queue.records(since=T0 - timedelta(hours=1)) if r.state == "pending")


def test_depth_and_oldest_age(queue: SqlJudgeQueue, clock: ManualClock) -> None:
    assert (queue.depth(), queue.oldest_age_s()) == (0, 0.0)
    queue.enqueue([item(0), item(5)])
    clock.advance(42)
    assert queue.oldest_age_s() == pytest.approx(42.0)
    (oldest,) = queue.claim(1, lease_s=30, worker="w")
    queue.complete(oldest.key)
    assert queue.oldest_age_s() == pytest.approx(37.0)
    stats = queue.stats()
    assert stats.depth == 1 and stats.oldest_enqueued_at == item(5).enqueued_at
    assert set(ITEM_STATES) == {"pending", "leased", "done", "failed", "skipped"}


def test_records_select_by_trace_time(queue: SqlJudgeQueue) -> None:
    queue.enqueue([item(i) for i in range(10)] + [item(3, tenant="acme")])
    since = item(4).trace_time
    got = queue.records(since=since, until=item(8).trace_time)
    assert sorted(r.item.trace_id for r in got) == [f"{i:032x}" for i in range(4, 8)]
    assert len(queue.records(since=item(0).trace_time, tenant="acme")) == 1


def test_items_survive_a_restart_and_leases_expire(db_url: str, engine: Engine, clock: ManualClock) -> None:
    queue = SqlJudgeQueue(engine, clock=clock)
    queue.enqueue([item(i) for i in range(4)])
    leased = queue.claim(2, lease_s=60, worker="before-restart")
    engine.dispose()

    fresh = Store(db_url)
    try:
        create_tables(fresh.engine)  # what a restarting service does: must keep the rows
        restarted = SqlJudgeQueue(fresh.engine, clock=clock)
        assert restarted.depth() == 4
        assert [r.worker for r in (restarted.get(r.key) for r in leased) if r] == ["before-restart"] * 2
        waiting = restarted.claim(10, lease_s=600, worker="after-restart")
        assert len(waiting) == 2
        clock.advance(61)
        reclaimed = restarted.claim(10, lease_s=60, worker="after-restart")
        assert sorted(r.key for r in reclaimed) == sorted(r.key for r in leased)
        assert all(r.attempts == 2 for r in reclaimed)
    finally:
        fresh.close()


def test_concurrent_workers_never_share_an_item(engine: Engine, clock: ManualClock) -> None:
    queue = SqlJudgeQueue(engine, clock=clock)
    queue.enqueue([item(i) for i in range(120)])
    claimed: list[QueueRecord] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(name: str) -> None:
        try:
            while batch := queue.claim(3, lease_s=300, worker=name):
                with lock:
                    claimed.extend(batch)
                for record in batch:
                    queue.complete(record.key)
        except BaseException as exc:  # surfaced to the test thread below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    counts = Counter(r.key for r in claimed)
    assert len(counts) == 120 and max(counts.values()) == 1
    assert queue.stats().done == 120


def test_every_item_ends_done_or_failed_under_random_faults(engine: Engine, clock: ManualClock) -> None:
    """The invariant: nothing disappears, nothing is judged twice per judge version."""
    queue = SqlJudgeQueue(engine, max_attempts=3, clock=clock)
    keys = {item(i).key for i in range(60)}
    queue.enqueue([item(i) for i in range(60)])
    rng = random.Random(5)
    judged: Counter[ItemKey] = Counter()
    crashed: list[QueueRecord] = []
    for _ in range(100):
        if queue.depth() == 0:
            break
        for record in queue.claim(7, lease_s=10, worker=f"w{rng.randrange(3)}"):
            action = rng.random()
            if action < 0.5:
                if queue.complete(record.key):
                    judged[record.key] += 1
            elif action < 0.8:
                queue.fail(record.key, worker=record.worker or "", reason="HTTP 500")
            else:
                crashed.append(record)  # the worker died holding the lease
        clock.advance(11)
        # Some crashed workers come back late and report a success.
        while crashed and rng.random() < 0.3:
            late = crashed.pop()
            if queue.complete(late.key):
                judged[late.key] += 1
    final = {k: queue.get(k) for k in keys}
    assert all(r is not None and r.state in ("done", "failed") for r in final.values())
    done = {k for k, r in final.items() if r is not None and r.state == "done"}
    assert set(judged) == done and all(n == 1 for n in judged.values())
    failed = [r for r in final.values() if r is not None and r.state == "failed"]
    assert failed and all(r.attempts == 3 and r.last_error for r in failed)
    stats = queue.stats()
    assert (stats.done, stats.failed, stats.depth) == (len(done), len(failed), 0)


def test_database_outage_raises_store_unavailable(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'missing' / 'queue.db'}")
    queue = SqlJudgeQueue(engine)
    with pytest.raises(StoreUnavailable):
        queue.depth()
    engine.dispose()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"trace_id": "XYZ"},
        {"inclusion_probability": 0.0},
        {"inclusion_probability": 1.01},
        {"inclusion_probability": float("nan")},
        {"judge_version": ""},
        {"enqueued_at": datetime(2025, 3, 1)},
    ],
)
def test_malformed_items_are_rejected(kwargs: dict[str, object]) -> None:
    fields: dict[str, object] = {
        "trace_id": f"{1:032x}",
        "tenant": "default",
        "app": "shop",
        "stratum": "base",
        "inclusion_probability": 0.5,
        "judge_version": "v1",
        "enqueued_at": T0,
        "trace_time": T0,
    }
    with pytest.raises(ValueError):
        JudgeItem(**(fields | kwargs))  # type: ignore[arg-type]


def test_bad_arguments_are_rejected(queue: SqlJudgeQueue, engine: Engine) -> None:
    with pytest.raises(ValueError):
        queue.claim(0, lease_s=30, worker="w")
    with pytest.raises(ValueError):
        queue.claim(1, lease_s=0, worker="w")
    with pytest.raises(ValueError):
        queue.claim(1, lease_s=30, worker="")
    with pytest.raises(ValueError):
        SqlJudgeQueue(engine, max_attempts=0)
    with pytest.raises(TypeError):
        queue.enqueue(["not an item"])  # type: ignore[list-item]


def test_rejudge_queues_judged_and_failed_items_again_and_leaves_the_rest(queue: SqlJudgeQueue) -> None:
    queue.enqueue([item(i, p=0.25, stratum="low_retrieval") for i in range(4)] + [item(9, skip="budget")])
    done, failed, leased = queue.claim(3, lease_s=30, worker="w1")
    queue.complete(done.key)
    queue.fail(failed.key, worker="w1", reason="no_answer", permanent=True)
    pending = item(3).key
    keys = [done.key, failed.key, leased.key, pending, item(9).key, item(42).key]
    assert queue.rejudge(keys) == {done.key, failed.key}
    for key in (done.key, failed.key):
        record = queue.get(key)
        assert record is not None
        assert (record.state, record.attempts, record.completed_at, record.last_error) == (
            "pending",
            0,
            None,
            None,
        )
        # the sampling design is the trace's: one sample, same stratum and inclusion probability
        assert (record.item.stratum, record.item.inclusion_probability) == ("low_retrieval", 0.25)
    assert queue.get(leased.key).state == "leased"  # type: ignore[union-attr]
    assert queue.get(item(9).key).state == "skipped"  # type: ignore[union-attr]
    assert queue.rejudge(keys) == set()  # pending now: nothing more
    assert queue.stats().depth == 4
