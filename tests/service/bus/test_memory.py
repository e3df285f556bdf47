"""`service/bus/memory.py`: one poison record never costs the other records of its batch.

The store is real (SQLite and PostgreSQL, `store_url`), and so is the failure: each poison record
passes `RagTrace`/`Feedback` validation (as a record that got past an older edge would) and is
refused by the database driver at insert (10**30 in a BigInteger column; a time that has no UTC
datetime). Before the bisecting lane, the bus skipped the whole batch of up to 500 records.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone

import pytest

from service.bus.memory import MemoryBus
from service.config import BusConfig
from service.errors import RetryableError, StoreUnavailable
from service.metrics import Metrics
from service.model import Feedback, ModelUsage, RagTrace
from service.store.store_sink import StoreSink
from service.store.trace_store import Store
from tests.consumers import ErrorConsumer, SinkConsumer
from tests.eventually import eventually

T0 = datetime(2025, 6, 1, tzinfo=UTC)
POISON_TOKENS = 10**30
YEAR_ONE_EAST = datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))  # before year 1 in UTC


def _trace(n: int, tenant: str, *, tokens: int = 100) -> RagTrace:
    return RagTrace(
        trace_id=f"{n:032x}",
        tenant=tenant,
        app=f"{tenant}-app",
        start_time=T0 + timedelta(seconds=n),
        query=f"question {n}",
        usage=(ModelUsage(model="m", input_tokens=tokens, output_tokens=1),),
    )


def _feedback(n: int, tenant: str, *, time: datetime = T0) -> Feedback:
    return Feedback(event_id=f"ev-{n}", trace_id=f"{n:032x}", tenant=tenant, kind="down", time=time)


def _last_success(metrics: Metrics, sink: str = "traces") -> float | None:
    return metrics.registry.get_sample_value("ragmon_sink_last_success_timestamp_seconds", {"sink": sink})


def _sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def _deliver(
    store: Store,
    traces: Sequence[RagTrace] = (),
    feedback: Sequence[Feedback] = (),
    *,
    batch_size: int = 500,
    metrics: Metrics | None = None,
    downstream: SinkConsumer | None = None,
    with_dead_letters: bool = True,
) -> Metrics:
    metrics = metrics or Metrics()
    sink = StoreSink(store, new_traces=downstream, new_feedback=downstream)
    extra = {"dead_letters": sink.dead_letter} if with_dead_letters else {}
    bus = MemoryBus(
        BusConfig(batch_size=batch_size), traces_to=sink, feedback_to=sink, metrics=metrics, **extra
    )
    await bus.start()
    await bus.consume_traces(traces)
    await bus.consume_feedback(feedback)
    assert await bus.drain(60)
    await bus.stop()
    return metrics


async def test_a_poison_trace_amid_two_tenants_costs_no_other_record(store: Store) -> None:
    acme = [_trace(i, "acme") for i in range(300)]
    globex = [_trace(1000 + i, "globex") for i in range(299)]
    poison = _trace(5000, "globex", tokens=POISON_TOKENS)
    # interleaved as two tenants' traffic reaches the bus; the poison lands in the first batch of 500
    mixed: list[RagTrace] = [t for pair in zip(acme, globex, strict=False) for t in pair] + acme[299:]
    mixed.insert(137, poison)
    downstream = SinkConsumer()
    metrics = await _deliver(store, mixed, downstream=downstream)

    assert store.count_traces("acme") == 300 and store.count_traces("globex") == 299
    assert store.get_trace("globex", poison.trace_id) is None
    # every good trace went on downstream exactly once: no part was delivered twice
    assert sorted(t.trace_id for t in downstream.traces) == sorted(t.trace_id for t in acme + globex)
    letters, cursor = store.list_dead_letters("globex")
    assert cursor is None and len(letters) == 1
    (letter,) = letters
    assert letter["kind"] == "trace" and letter["record_id"] == poison.trace_id
    assert letter["error"].startswith("InvalidInput: insert traces:")
    assert letter["record"]["usage"][0]["input_tokens"] == POISON_TOKENS
    assert store.list_dead_letters("acme") == ([], None)
    assert _sample(metrics, "ragmon_dead_letters_total", kind="trace") == 1
    assert _sample(metrics, "ragmon_sink_failures_total", sink="traces", kind="permanent") == 1
    assert _last_success(metrics) is not None  # the good parts were accepted


async def test_a_batch_that_is_all_poison_never_moves_last_success(store: Store) -> None:
    metrics = await _deliver(store, [_trace(1, "acme", tokens=POISON_TOKENS)])
    assert _last_success(metrics) is None
    assert _sample(metrics, "ragmon_dead_letters_total", kind="trace") == 1
    assert store.count_traces("acme") == 0

    # and a later poison-only batch leaves the time a good batch set
    await _deliver(store, [_trace(2, "acme")], metrics=metrics)
    good_at = _last_success(metrics)
    assert good_at is not None
    await _deliver(
        store,
        [_trace(3, "acme", tokens=POISON_TOKENS), _trace(4, "acme", tokens=POISON_TOKENS)],
        metrics=metrics,
    )
    assert _last_success(metrics) == good_at
    assert _sample(metrics, "ragmon_dead_letters_total", kind="trace") == 3
    assert [letter["record_id"] for letter in store.list_dead_letters("acme")[0]] == [
        f"{4:032x}",
        f"{3:032x}",
        f"{1:032x}",
    ]


async def test_poison_feedback_is_dead_lettered_and_the_rest_stored(store: Store) -> None:
    events = [_feedback(i, "acme" if i % 2 else "globex") for i in range(40)]
    events.insert(7, _feedback(99, "acme", time=YEAR_ONE_EAST))
    metrics = await _deliver(store, feedback=events, batch_size=16)
    stored = store.feedback_for((e.tenant, e.trace_id) for e in events)
    assert sum(len(v) for v in stored.values()) == 40
    (letter,), _ = store.list_dead_letters("acme", kind="feedback")
    assert letter["record_id"] == "ev-99" and "OverflowError" in letter["error"]
    assert _sample(metrics, "ragmon_dead_letters_total", kind="feedback") == 1
    assert _sample(metrics, "ragmon_sink_failures_total", sink="feedback", kind="permanent") == 1


async def test_several_poisons_across_batches_are_each_set_aside(store: Store) -> None:
    traces = [_trace(i, "acme", tokens=POISON_TOKENS if i % 97 == 5 else 10) for i in range(1200)]
    poisons = {t.trace_id for t in traces if t.input_tokens == POISON_TOKENS}
    metrics = await _deliver(store, traces, batch_size=500)
    assert store.count_traces("acme") == 1200 - len(poisons)
    letters, _ = store.list_dead_letters("acme", limit=1000)
    assert {letter["record_id"] for letter in letters} == poisons
    assert _sample(metrics, "ragmon_dead_letters_total", kind="trace") == len(poisons) == 13
    assert _sample(metrics, "ragmon_sink_failures_total", sink="traces", kind="permanent") == 3


async def test_without_a_handler_poison_is_logged_and_counted(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="service.bus.memory")
    poison = _trace(7, "acme", tokens=POISON_TOKENS)
    metrics = await _deliver(store, [_trace(1, "acme"), poison, _trace(2, "acme")], with_dead_letters=False)
    assert store.count_traces("acme") == 2
    assert store.list_dead_letters("acme") == ([], None)
    assert _sample(metrics, "ragmon_dead_letters_total", kind="trace") == 1
    assert any(f"trace acme/{poison.trace_id} refused for good" in r.getMessage() for r in caplog.records)


async def test_a_retryable_error_while_splitting_resumes_where_it_stopped(store: Store) -> None:
    """The dead-letter handler cannot write at first (the store is briefly away): the poison stays at
    the head and is retried; parts already delivered are not delivered again."""
    sink = StoreSink(store, new_traces=(downstream := SinkConsumer()))
    attempts: list[int] = []

    async def flaky(records: Sequence[RagTrace | Feedback], error: Exception) -> None:
        attempts.append(len(records))
        if len(attempts) == 1:
            raise StoreUnavailable("the store is restarting")
        await sink.dead_letter(records, error)

    metrics = Metrics()
    bus = MemoryBus(
        BusConfig(batch_size=8), traces_to=sink, feedback_to=sink, metrics=metrics, dead_letters=flaky
    )
    traces = [_trace(i, "acme", tokens=POISON_TOKENS if i == 5 else 1) for i in range(20)]
    await bus.start()
    await bus.consume_traces(traces)
    assert await bus.drain(60)
    await bus.stop()
    assert attempts == [1, 1]
    assert store.count_traces("acme") == 19 and len(store.list_dead_letters("acme")[0]) == 1
    assert sorted(t.trace_id for t in downstream.traces) == sorted(
        t.trace_id for t in traces if t.input_tokens == 1
    )
    assert _sample(metrics, "ragmon_sink_failures_total", sink="traces", kind="retryable") == 1


async def test_retryable_errors_keep_todays_backoff_and_lose_nothing() -> None:
    failing = ErrorConsumer(RetryableError("down"), times=3)
    metrics = Metrics()
    letters: list[Sequence[RagTrace | Feedback]] = []

    async def keep(records: Sequence[RagTrace | Feedback], error: Exception) -> None:
        letters.append(records)

    bus = MemoryBus(
        BusConfig(batch_size=10), traces_to=failing, feedback_to=failing, metrics=metrics, dead_letters=keep
    )
    await bus.start()
    await bus.consume_traces([_trace(i, "acme") for i in range(25)])
    started = asyncio.get_running_loop().time()
    assert await bus.drain(30)
    await bus.stop()
    assert len(failing.traces) == 25 and letters == []
    assert asyncio.get_running_loop().time() - started >= 0.05 + 0.1 + 0.2  # 0.05 s doubling
    assert _sample(metrics, "ragmon_sink_failures_total", sink="traces", kind="retryable") == 3
    assert _sample(metrics, "ragmon_sink_failures_total", sink="traces", kind="permanent") == 0


async def test_a_handler_that_fails_for_good_drops_only_that_record() -> None:
    sink = SinkConsumer()

    class Picky(SinkConsumer):
        async def consume_traces(self, batch: Sequence[RagTrace]) -> None:
            if any(t.trace_id == f"{3:032x}" for t in batch):
                raise ValueError("cannot take trace 3")
            await sink.consume_traces(batch)

    async def broken(records: Sequence[RagTrace | Feedback], error: Exception) -> None:
        raise RuntimeError("the dead-letter table is gone")

    metrics = Metrics()
    picky = Picky()
    bus = MemoryBus(
        BusConfig(batch_size=10), traces_to=picky, feedback_to=picky, metrics=metrics, dead_letters=broken
    )
    await bus.start()
    await bus.consume_traces([_trace(i, "acme") for i in range(10)])
    assert await bus.drain(30)
    await bus.stop()
    assert sorted(int(t.trace_id, 16) for t in sink.traces) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    assert _sample(metrics, "ragmon_dead_letters_total", kind="trace") == 0
    assert _sample(metrics, "ragmon_sink_failures_total", sink="traces", kind="permanent") == 2


# -- linger: a batch that starts small waits for more (bus.linger_s)


@pytest.mark.parametrize(("linger_s", "batches"), [(3.0, 1), (0.0, 2)])
async def test_a_batch_that_starts_small_waits_for_the_next_records(linger_s: float, batches: int) -> None:
    """Two hand-overs 0.2 s apart: with a linger they reach the sink as one batch, without one as two
    (the first goes the moment it is queued)."""
    sink = SinkConsumer()
    bus = MemoryBus(BusConfig(batch_size=100, linger_s=linger_s), sink, sink, Metrics())
    await bus.start()
    await bus.consume_traces([_trace(i, "acme") for i in range(10)])
    await asyncio.sleep(0.2)
    await bus.consume_traces([_trace(i, "acme") for i in range(10, 25)])
    await eventually(lambda: len(sink.traces) == 25)
    await bus.stop()
    assert sink.batches == batches
    assert [t.trace_id for t in sink.traces] == [f"{i:032x}" for i in range(25)]


async def test_a_whole_batch_goes_without_lingering() -> None:
    """Once `batch_size` records are queued the batch goes at once, however long the linger."""
    sink = SinkConsumer()
    bus = MemoryBus(BusConfig(batch_size=10, linger_s=5.0), sink, sink, Metrics())
    await bus.start()
    await bus.consume_traces([_trace(i, "acme") for i in range(4)])
    await asyncio.sleep(0.1)
    assert sink.traces == []  # lingering
    await bus.consume_traces([_trace(i, "acme") for i in range(4, 23)])
    await eventually(lambda: len(sink.traces) == 20, timeout_s=3.0)  # two whole batches, not 5 s later
    assert sink.batches == 2
    assert await bus.drain(1.0)  # the 3 left over go at once for a drain (see below)
    assert len(sink.traces) == 23
    await bus.stop()


async def test_a_drain_does_not_wait_out_the_linger() -> None:
    """`drain` (and `stop`, which drains) delivers what is queued now: a lingering batch goes at once,
    and the linger applies again after it."""
    sink = SinkConsumer()
    bus = MemoryBus(BusConfig(batch_size=100, linger_s=5.0), sink, sink, Metrics())
    await bus.start()
    await bus.consume_traces([_trace(i, "acme") for i in range(5)])
    await bus.consume_feedback([_feedback(i, "acme") for i in range(3)])
    await asyncio.sleep(0.1)
    assert sink.batches == 0
    assert await bus.drain(1.0)  # not the 5 s linger
    assert (len(sink.traces), len(sink.feedback), sink.batches) == (5, 3, 2)
    await bus.consume_traces([_trace(i, "acme") for i in range(5, 7)])
    await asyncio.sleep(0.2)
    assert len(sink.traces) == 5  # lingering again
    await bus.stop(1.0)
    assert len(sink.traces) == 7
