"""SpanAssembler alone (no span archive): completion by root + grace, by activity (idle, maximum age), the
bounded buffer (503 or eviction), late children, out-of-order arrival. Completion of flushed traces from
the span archive: tests/service/test_late_completion.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest

from service.assemble import EMIT_CHUNK, SpanAssembler, SpanGroups, in_thread
from service.config import AssemblerConfig
from service.conventions.pricing import PriceTable
from service.conventions.spans import Span
from service.errors import StoreUnavailable
from service.ingest import otlp_protobuf
from service.ingest.pool import IngestPool
from service.ingest.span_codec import OtlpSpanCodec
from service.metrics import Metrics
from service.model import RagTrace
from service.stages import ArchiveKeeper
from service.store.span_archive import SpanArchive
from service.store.trace_store import Store
from tests.consumers import SinkConsumer
from tests.eventually import eventually
from tests.rag_spans import RagRequest, body


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def build(spans: Sequence[Span], partial: bool) -> RagTrace:
    return RagTrace(
        trace_id=spans[0].trace_id,
        tenant=spans[0].tenant,
        start_time=datetime.fromtimestamp(min(s.start_ns for s in spans) / 1e9, UTC),
        span_count=len(spans),
        partial=partial,
    )


def span(trace: int, n: int, root: bool = False, size: int = 100, tenant: str = "default") -> Span:
    return Span(
        trace_id=f"{trace:032x}",
        span_id=f"{n + 1:016x}",
        parent_span_id=None if root else f"{999:016x}",
        name="s",
        start_ns=1_700_000_000_000_000_000 + n,
        end_ns=1_700_000_000_000_000_100 + n,
        tenant=tenant,
        size_bytes=size,
    )


def make(config: AssemblerConfig | None = None) -> tuple[SpanAssembler, SinkConsumer, FakeClock, Metrics]:
    sink, clock, metrics = SinkConsumer(), FakeClock(), Metrics()
    assembler = SpanAssembler(
        config or AssemblerConfig(grace_s=0.5, idle_s=10), sink, in_thread(build), metrics, clock
    )
    return assembler, sink, clock, metrics


def counter(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return value or 0.0


async def test_trace_emitted_once_after_root_and_grace_with_children_from_later_requests() -> None:
    assembler, sink, clock, _ = make()
    await assembler.consume_spans([span(1, 1)])  # child first, in its own request
    await assembler.consume_spans([span(1, 0, root=True)])
    await assembler.flush_due()
    assert sink.traces == []  # still inside the grace period
    clock.now += 0.3
    await assembler.consume_spans([span(1, 2)])  # a late child within grace joins the trace
    clock.now += 0.3
    await assembler.flush_due()
    assert [t.span_count for t in sink.traces] == [3]
    assert sink.traces[0].partial is False
    assert assembler.open_traces == 0 and assembler.open_spans == 0 and assembler.open_bytes == 0


async def test_trace_without_root_stays_open_while_its_spans_keep_coming_then_goes_idle() -> None:
    assembler, sink, clock, metrics = make()  # idle_s=10
    for n in range(5):  # a span every 9 s: 36 s in all, never idle
        await assembler.consume_spans([span(2, n + 1)])
        clock.now += 9
        await assembler.flush_due()
    assert sink.traces == [] and assembler.open_traces == 1
    clock.now += 1.1  # 10.1 s since the last span
    await assembler.flush_due()
    assert [(t.span_count, t.partial) for t in sink.traces] == [(5, True)]
    assert counter(metrics, "ragmon_assembled_traces_total", reason="idle") == 1


async def test_a_40_s_request_is_flushed_whole_with_the_default_idle_timeout() -> None:
    # the retrieval span comes at once, the LLM call and the root 40 s later: one trace, whole
    assembler, sink, clock, _ = make(AssemblerConfig())
    await assembler.consume_spans([span(9, 1)])
    clock.now += 40
    await assembler.flush_due()
    assert sink.traces == []
    await assembler.consume_spans([span(9, 2), span(9, 0, root=True)])
    clock.now += 0.6
    await assembler.flush_due()
    assert [(t.span_count, t.partial) for t in sink.traces] == [(3, False)]


async def test_a_trace_whose_spans_keep_coming_is_flushed_at_its_maximum_age() -> None:
    assembler, sink, clock, metrics = make(AssemblerConfig(grace_s=0.5, idle_s=10, max_age_s=60))
    for n in range(7):  # a span every 9 s, for 63 s
        await assembler.consume_spans([span(3, n + 1)])
        clock.now += 9
        await assembler.flush_due()
    assert [(t.span_count, t.partial) for t in sink.traces] == [(7, True)]
    assert counter(metrics, "ragmon_assembled_traces_total", reason="max_age") == 1
    await assembler.consume_spans([span(3, 20)])  # later spans open it again (completed from the archive)
    assert assembler.open_traces == 1


async def test_a_full_buffer_refuses_and_the_tick_flushes_the_least_recently_active_traces() -> None:
    assembler, sink, clock, metrics = make(
        AssemblerConfig(max_spans=10, grace_s=1, idle_s=100, evict_above=0.6)
    )
    for trace in range(1, 6):
        await assembler.consume_spans([span(trace, 1), span(trace, 2)])
        clock.now += 1
    await assembler.consume_spans([span(1, 3)])  # trace 1 is active again: 2 is the least recently active
    # 11 spans of a 10-span bound: full (ingest answers 503), nothing flushed or lost yet
    assert assembler.full and assembler.open_spans == 11 and sink.traces == []
    await assembler.flush_due()
    assert [t.trace_id for t in sink.traces] == [f"{n:032x}" for n in (2, 3, 4)]
    assert all(t.partial for t in sink.traces)
    assert assembler.open_spans == 5 and not assembler.full
    assert counter(metrics, "ragmon_assembled_traces_total", reason="evicted") == 3


async def test_a_kafka_worker_buffer_evicts_at_once_as_nobody_can_be_refused() -> None:
    sink, clock, metrics = SinkConsumer(), FakeClock(), Metrics()
    config = AssemblerConfig(max_spans=4, grace_s=1, idle_s=100)
    assembler = SpanAssembler(config, sink, in_thread(build), metrics, clock, evict_when_full=True)
    for trace in range(1, 4):
        await assembler.consume_spans([span(trace, 1), span(trace, 2)])
    # the 4-span buffer is full at the second trace and at the third: each time the least recently
    # active trace goes early, down to evict_above (3.6 spans); nothing lost
    assert [t.trace_id for t in sink.traces] == [f"{1:032x}", f"{2:032x}"]
    assert all(t.partial for t in sink.traces)
    assert assembler.open_spans == 2 and not assembler.full
    assert counter(metrics, "ragmon_assembled_traces_total", reason="evicted") == 2


async def test_byte_bound_is_enforced_too() -> None:
    assembler, sink, _, _ = make(AssemblerConfig(max_bytes=1000, grace_s=1, idle_s=100))
    for trace in range(1, 4):
        await assembler.consume_spans([span(trace, 1, size=400)])
    assert assembler.full and assembler.open_bytes == 1200
    await assembler.flush_due()
    assert assembler.open_bytes <= 900
    assert len(sink.traces) + assembler.open_traces == 3


async def test_a_late_child_of_a_trace_flushed_with_its_root_waits_only_the_grace_period() -> None:
    # without a span archive the late child becomes a trace of its own; with one it completes the
    # stored trace (test_late_completion.py). Either way it is flushed after grace_s, not idle_s.
    assembler, sink, clock, _ = make()
    await assembler.consume_spans([span(3, 0, root=True)])
    clock.now += 1
    await assembler.flush_due()
    await assembler.consume_spans([span(3, 5)])
    clock.now += 0.6
    await assembler.flush_due()
    assert [t.span_count for t in sink.traces] == [1, 1]


async def test_same_trace_id_in_two_tenants_stays_separate() -> None:
    assembler, sink, clock, _ = make()
    await assembler.consume_spans([span(4, 0, root=True, tenant="a"), span(4, 0, root=True, tenant="b")])
    clock.now += 1
    await assembler.flush_due()
    assert sorted(t.tenant for t in sink.traces) == ["a", "b"]


async def test_stop_flushes_every_open_trace() -> None:
    assembler, sink, _, _ = make()
    await assembler.start()
    await assembler.consume_spans([span(5, 0, root=True), span(6, 1)])
    await assembler.stop()
    assert sorted((t.trace_id[-1], t.partial) for t in sink.traces) == [("5", False), ("6", True)]
    await assembler.stop()  # safe twice


async def test_builder_failure_is_counted_and_other_traces_survive() -> None:
    sink, clock, metrics = SinkConsumer(), FakeClock(), Metrics()

    def fragile(spans: Sequence[Span], partial: bool) -> RagTrace:
        if spans[0].trace_id.endswith("7"):
            raise ValueError("boom")
        return build(spans, partial)

    assembler = SpanAssembler(AssemblerConfig(grace_s=0), sink, in_thread(fragile), metrics, clock)
    await assembler.consume_spans([span(7, 0, root=True), span(8, 0, root=True)])
    clock.now += 0.1
    await assembler.flush_due()
    assert [t.trace_id[-1] for t in sink.traces] == ["8"]
    assert counter(metrics, "ragmon_assembly_failures_total") == 1
    assert counter(metrics, "ragmon_dropped_spans_total", reason="build_failed") == 1


async def test_build_runs_off_the_event_loop_and_a_cancelled_emission_loses_nothing() -> None:
    started, release = threading.Event(), threading.Event()
    loop_thread = threading.get_ident()
    build_threads: list[int] = []

    def slow_build(spans: Sequence[Span], partial: bool) -> RagTrace:
        build_threads.append(threading.get_ident())
        started.set()
        release.wait(10)
        return build(spans, partial)

    sink, clock, metrics = SinkConsumer(), FakeClock(), Metrics()
    assembler = SpanAssembler(
        AssemblerConfig(grace_s=0.5, idle_s=10), sink, in_thread(slow_build), metrics, clock
    )
    await assembler.consume_spans([span(7, 0, root=True), span(7, 1)])
    clock.now += 1
    emitting = asyncio.create_task(assembler.flush_due())
    # the loop stays free while the builder works: this wait would never end if build ran on the loop
    await asyncio.to_thread(started.wait, 10)
    emitting.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await emitting
    await assembler.stop()
    assert loop_thread not in build_threads
    assert [t.trace_id for t in sink.traces] == [f"{7:032x}"]
    assert counter(metrics, "ragmon_assembled_traces_total", reason="complete") == 1


async def test_backlog_counts_traces_taken_but_not_yet_handed_on() -> None:
    started, release = threading.Event(), threading.Event()

    def slow_build(spans: Sequence[Span], partial: bool) -> RagTrace:
        started.set()
        release.wait(10)
        return build(spans, partial)

    sink, clock, metrics = SinkConsumer(), FakeClock(), Metrics()
    assembler = SpanAssembler(
        AssemblerConfig(grace_s=0.5, idle_s=10), sink, in_thread(slow_build), metrics, clock
    )
    await assembler.consume_spans([span(1, 0, root=True), span(2, 0, root=True), span(3, 1)])
    # 1 and 2 are complete but in their grace period (normal flight, not behind); 3 has no root
    assert (assembler.open_traces, assembler.backlog) == (3, 0)
    clock.now += 1
    # past their grace and not yet taken (the tick has not run): now they are behind
    assert assembler.backlog == 2
    emitting = asyncio.create_task(assembler.flush_due())
    await asyncio.to_thread(started.wait, 10)
    # both left the open buffer but neither reached the next stage: ingest must still see them
    assert (assembler.open_traces, assembler.backlog, sink.traces) == (1, 2, [])
    await assembler.consume_spans([span(3, 0, root=True)])
    assert assembler.backlog == 2  # 3 is in its grace period while the build of 1 and 2 runs
    clock.now += 1
    assert assembler.backlog == 3  # and behind once that has passed
    release.set()
    await emitting
    clock.now += 1
    await assembler.flush_due()
    assert (assembler.backlog, len(sink.traces)) == (0, 3)


async def test_flushed_roots_are_forgotten_after_the_late_window_so_memory_does_not_grow() -> None:
    assembler, sink, clock, _ = make(AssemblerConfig(grace_s=0.5, idle_s=10, late_window_s=20))
    await assembler.consume_spans([span(4, 0, root=True)])
    clock.now += 1
    await assembler.flush_due()
    clock.now += 20.5  # flushed 20.5 s ago: past late_window_s, so it is no longer remembered
    await assembler.flush_due()
    await assembler.consume_spans([span(4, 6)])
    clock.now += 0.6
    await assembler.flush_due()
    assert len(sink.traces) == 1  # the child waits idle_s now, as for any trace never seen
    clock.now += 10
    await assembler.flush_due()
    assert [(t.span_count, t.partial) for t in sink.traces] == [(1, False), (1, True)]


async def test_the_maximum_age_entries_of_flushed_traces_are_dropped_so_memory_does_not_grow() -> None:
    assembler, sink, clock, _ = make(AssemblerConfig(grace_s=0.1, idle_s=10, max_age_s=10_000))
    for n in range(3000):
        await assembler.consume_spans([span(n + 1, 0, root=True)])
        clock.now += 0.2
        await assembler.flush_due()
    assert len(sink.traces) == 3000 and assembler.open_traces <= 1
    assert len(assembler._age_deadlines) <= 1024 + 2


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


async def test_an_emission_hands_each_chunk_on_when_built_and_a_cancel_loses_nothing() -> None:
    gates = [asyncio.Event() for _ in range(5)]
    calls: list[int] = []

    async def gated(groups: SpanGroups) -> list[RagTrace | None]:
        gate = gates[len(calls)]
        calls.append(len(groups))
        await gate.wait()
        return [build(list(spans), partial) for spans, partial in groups]  # type: ignore[arg-type]

    sink, clock, metrics = SinkConsumer(), FakeClock(), Metrics()
    assembler = SpanAssembler(AssemblerConfig(grace_s=0.5, idle_s=10), sink, gated, metrics, clock)
    n = 2 * EMIT_CHUNK + 5
    await assembler.consume_spans([span(i, 0, root=True) for i in range(1, n + 1)])
    clock.now += 1
    emitting = asyncio.create_task(assembler.flush_due())
    await _until(lambda: len(calls) == 3)
    assert calls == [EMIT_CHUNK, EMIT_CHUNK, 5]  # every chunk submitted at once
    assert assembler.backlog == n and sink.traces == []
    gates[1].set()  # the second chunk is built first: it still waits for the first
    await asyncio.sleep(0.01)
    assert sink.traces == []
    gates[0].set()
    await _until(lambda: len(sink.traces) == 2 * EMIT_CHUNK)
    assert [t.trace_id for t in sink.traces] == [f"{i:032x}" for i in range(1, 2 * EMIT_CHUNK + 1)]
    assert assembler.backlog == 5  # handed-on chunks no longer count as behind

    emitting.cancel()  # while the last chunk is building
    with pytest.raises(asyncio.CancelledError):
        await emitting
    gates[2].set()
    gates[3].set()
    await assembler.stop()  # emits the last chunk again
    assert sorted(t.trace_id for t in sink.traces) == [f"{i:032x}" for i in range(1, n + 1)]
    assert counter(metrics, "ragmon_assembled_traces_total", reason="complete") == n


async def test_flushed_roots_are_remembered_up_to_a_count_whatever_the_rate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("service.assemble._RECENT_LIMIT", 2)
    assembler, sink, clock, _ = make()
    await assembler.consume_spans([span(n, 0, root=True) for n in (1, 2, 3)])
    clock.now += 1
    await assembler.flush_due()
    assert len(sink.traces) == 3
    await assembler.consume_spans([span(3, 7), span(1, 7)])  # 3 is remembered; 1, the oldest, is not
    clock.now += 0.6
    await assembler.flush_due()
    assert [t.trace_id for t in sink.traces[3:]] == [f"{3:032x}"] and assembler.open_traces == 1


class FlakyKeeper:
    """The span archive (real, on SQLite) behind a store that is down for the first `times` merges."""

    def __init__(self, keeper: object, times: int) -> None:
        self.keeper = keeper
        self.times = times
        self.calls = 0

    async def merge(self, groups: object) -> object:
        self.calls += 1
        if self.calls <= self.times:
            raise StoreUnavailable("the store is restarting")
        return await self.keeper.merge(groups)  # type: ignore[attr-defined]


async def test_an_archive_that_cannot_be_reached_holds_the_emission_up_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("service.assemble._MIN_BACKOFF_S", 0.001)
    store = Store(f"sqlite:///{tmp_path / 'ragmon.db'}")
    store.create_schema()
    metrics = Metrics()
    keeper = FlakyKeeper(ArchiveKeeper(SpanArchive(store, OtlpSpanCodec(), late_window_s=600)), times=2)
    sink, clock = SinkConsumer(), FakeClock()
    pool = IngestPool(0, PriceTable.default(), metrics)
    assembler = SpanAssembler(AssemblerConfig(), sink, pool.build_traces, metrics, clock, keeper=keeper)
    request = RagRequest(duration_s=3)
    wire = otlp_protobuf.screen_protobuf(
        body(request.retrieve, request.generate, request.root), "default"
    ).spans
    await assembler.consume_spans(wire)
    clock.now += 1
    await assembler.flush_due()
    assert [(t.span_count, t.answer) for t in sink.traces] == [(3, request.answer)]
    assert counter(metrics, "ragmon_sink_failures_total", sink="span_archive", kind="retryable") == 2
    store.close()


class BatchSink(SinkConsumer):
    """Keeps the size of each batch handed on."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    async def consume_traces(self, batch: Sequence[RagTrace]) -> None:
        self.sizes.append(len(batch))
        await super().consume_traces(batch)


def lingering(
    emit_chunk: int = 4, linger_s: float = 1.0, **config: float
) -> tuple[SpanAssembler, BatchSink, FakeClock]:
    """A sinks worker's assembler (evicting, emissions of `emit_chunk` that linger) whose tick runs
    every 10 ms of real time while its clock (deadlines, the linger) moves only when a test moves it."""
    sink, clock = BatchSink(), FakeClock()
    settings: dict[str, float] = {"grace_s": 0.0, "idle_s": 100.0, "tick_s": 0.01, **config}
    assembler = SpanAssembler(
        AssemblerConfig(**settings),
        sink,
        in_thread(build),
        Metrics(),
        clock,
        evict_when_full=True,
        emit_chunk=emit_chunk,
        linger_s=linger_s,
    )
    return assembler, sink, clock


@asynccontextmanager
async def running(assembler: SpanAssembler) -> AsyncIterator[None]:
    """The assembler with its tick running; stopped (every open trace emitted) on the way out."""
    await assembler.start()
    try:
        yield
    finally:
        await assembler.stop()


async def _ticks(n: int = 10) -> None:
    await asyncio.sleep(0.01 * n)


async def test_due_traces_linger_until_an_emission_is_whole_and_go_as_one_batch() -> None:
    assembler, sink, clock = lingering(emit_chunk=4, linger_s=1.0)
    async with running(assembler):
        for trace in (1, 2, 3):
            await assembler.consume_spans([span(trace, 0, root=True)])  # complete at once (grace 0)
            clock.now += 0.1
            await _ticks()
        assert sink.sizes == [] and assembler.backlog == 3  # due, waiting for a whole emission
        await assembler.consume_spans([span(4, 0, root=True)])
        await eventually(lambda: sink.sizes != [], timeout_s=5.0)
        assert sink.sizes == [4] and assembler.backlog == 0


async def test_a_short_emission_goes_once_the_first_of_it_lingered_linger_s() -> None:
    assembler, sink, clock = lingering(emit_chunk=100, linger_s=1.0)
    async with running(assembler):
        await assembler.consume_spans([span(1, 0, root=True)])
        await _ticks()  # taken (due) at 1000.0
        clock.now += 0.6
        await assembler.consume_spans([span(2, 0, root=True)])
        await _ticks()
        assert sink.sizes == []
        clock.now += 0.5  # the first has waited 1.1 s, the second 0.5 s: both go
        await eventually(lambda: sink.sizes != [], timeout_s=5.0)
        assert sink.sizes == [2]


async def test_without_a_linger_each_tick_hands_on_what_is_due() -> None:
    assembler, sink, _ = lingering(emit_chunk=100, linger_s=0.0)
    async with running(assembler):
        for handed_on, trace in enumerate((1, 2), start=1):
            await assembler.consume_spans([span(trace, 0, root=True)])
            await eventually(lambda n=handed_on: len(sink.traces) == n, timeout_s=5.0)
        assert sink.sizes == [1, 1]


async def test_evicted_traces_and_a_stop_do_not_wait_out_the_linger() -> None:
    assembler, sink, _ = lingering(emit_chunk=100, linger_s=60.0, max_spans=4)
    async with running(assembler):
        await assembler.consume_spans([span(1, 0, root=True)])
        await _ticks()
        assert sink.sizes == []  # lingering; spans that come without evicting do not hand it on
        await assembler.consume_spans([span(2, 1), span(2, 2)])
        assert sink.sizes == []
        # a full buffer evicts the least recently active open trace: handed on at once, with the
        # trace that lingered
        await assembler.consume_spans([span(3, 1), span(3, 2)])
        assert sorted(t.trace_id for t in sink.traces) == [f"{1:032x}", f"{2:032x}"]
        await assembler.consume_spans([span(4, 0, root=True)])
        await _ticks()
        assert len(sink.traces) == 2
    assert sorted(t.trace_id for t in sink.traces) == [f"{n:032x}" for n in (1, 2, 3, 4)]
