"""`SpanAssembler`: buffers spans by trace until the trace is complete, then emits one `RagTrace`.

A trace is complete when its root span has ended and `grace_s` has passed
(children of a batch exporter often arrive in a later request than the root),
or, with no root, `timeout_s` after its first span arrived (emitted with
`partial=True`). The buffer is bounded in spans and in estimated bytes: when a
new span would break a bound, the oldest open trace is emitted early as
partial and counted (`ragmon_assembled_traces{reason="evicted"}`); nothing is
dropped without a count.

Spans for a trace that was already emitted are counted as late
(`ragmon_late_spans_total`) and not re-assembled: downstream stages are
idempotent by trace id and would ignore a second version anyway. Emitted ids
are remembered for `timeout_s` (and at most 200,000 of them): a span later
than that starts a new partial trace, which the store ignores as a
redelivery. Remembering them for good made memory grow with every trace.

Guarantees: `consume_spans` never blocks on I/O and never raises for bad span
content (bad spans were rejected by the receiver); `stop()` emits every open
trace before returning. `build` is a coroutine over a batch of traces: the
pipeline's runs it in worker processes (service/ingest/pool.py), `in_thread`
adapts a plain per-trace function for a worker thread, so the event loop keeps
serving requests while traces are built. An emission builds in chunks of
`EMIT_CHUNK` traces, all submitted at once, and hands each chunk on as soon
as it is built, in order. A trace taken for emission is handed on exactly
once, even when the emitting task is cancelled mid-build.

Spans are buffered as `Span`, `PackedSpan` or `WireSpan` (service/conventions/spans.py),
and GenAI events sent as log records as `LogEvent`, with the spans of their trace:
the assembler reads only their tenant, trace id, root flag and size. An event
can open a trace (it often arrives before its span); it is never its root.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from service.config import AssemblerConfig
from service.consumer import TraceConsumer
from service.conventions.spans import AnySpan, LogEvent, Span
from service.lifecycle import cancel_task
from service.metrics import Metrics
from service.model import RagTrace

log = logging.getLogger(__name__)

TraceKey = tuple[str, str]  # (tenant, trace_id)
TraceBuilder = Callable[[Sequence[Span | LogEvent], bool], RagTrace]
# (spans, partial) per trace; the spans may be packed
SpanGroups = Sequence[tuple[Sequence[AnySpan], bool]]
# one trace per group, None where it could not be built
BatchBuilder = Callable[[SpanGroups], Awaitable[list[RagTrace | None]]]

# Traces per build call within one emission: each chunk is handed on once built, while the next
# ones are still building.
EMIT_CHUNK = 64

# Emitted trace ids remembered to recognise late spans: for `timeout_s`, and never more than this
# many, whatever the rate.
_RECENT_LIMIT = 200_000


def build_each(
    build: TraceBuilder, groups: Sequence[tuple[Sequence[Span | LogEvent], bool]]
) -> list[RagTrace | None]:
    """One `build` per group; None (and a logged error) where it raised: a builder bug must not
    take the pipeline down."""
    built: list[RagTrace | None] = []
    for spans, partial in groups:
        try:
            built.append(build(spans, partial))
        except Exception:
            built.append(None)
            log.exception("could not assemble trace %s", spans[0].trace_id)
    return built


def in_thread(build: TraceBuilder) -> BatchBuilder:
    """A per-trace builder of unpacked spans, run over each batch in a worker thread."""

    async def build_batch(groups: SpanGroups) -> list[RagTrace | None]:
        return await asyncio.to_thread(build_each, build, groups)  # type: ignore[arg-type]

    return build_batch


@dataclass(slots=True)
class _OpenTrace:
    first_seen: float
    spans: list[AnySpan] = field(default_factory=list)
    size_bytes: int = 0
    root_ended_at: float | None = None


class DropLedger(Protocol):
    """Told of what the assembler drops, so a write-ahead log can let go of it (ingest/ledger.py)."""

    def late(self, key: TraceKey) -> None:
        """One batch's spans of `key` were dropped as late."""

    def done(self, keys: Iterable[TraceKey]) -> None:
        """These traces will never be handed on (their build failed)."""


class SpanAssembler:
    """Processor: spans in (`SpanConsumer`), traces out to `next` (`TraceConsumer`)."""

    def __init__(
        self,
        config: AssemblerConfig,
        next: TraceConsumer,
        build: BatchBuilder,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
        ledger: DropLedger | None = None,
    ) -> None:
        self.config = config
        self.next = next
        self.build = build
        self.metrics = metrics
        self.clock = clock
        self.ledger = ledger
        self._open: OrderedDict[TraceKey, _OpenTrace] = OrderedDict()
        self._root_deadlines: deque[tuple[float, TraceKey]] = deque()
        # Emitted traces, oldest first: when (clock time) and the hash of their key. ~30k of them at
        # 1,000 traces/s; as an ordered dict of key tuples they took ~20 MiB of the server's memory.
        # A 64-bit hash stands for its key: two traces sharing one within `timeout_s` would make
        # the later one's spans count as late (about 1 in 10^10 at that size).
        self._recent_at: deque[float] = deque()
        self._recent_hashes: deque[int] = deque()
        self._recent: set[int] = set()
        self._span_count = 0
        self._byte_count = 0
        self._pending: list[tuple[_OpenTrace, str]] = []
        self._building = 0  # traces in the build running now
        self._ended_open = 0  # open traces whose root has ended: complete, waiting for grace or a tick
        self._task: asyncio.Task[None] | None = None
        self._flush_lock = asyncio.Lock()

    # -- state read by the metrics collector and the ingest back-pressure check
    @property
    def open_traces(self) -> int:
        return len(self._open)

    @property
    def open_spans(self) -> int:
        return self._span_count

    @property
    def open_bytes(self) -> int:
        return self._byte_count

    @property
    def backlog(self) -> int:
        """Traces that could have been handed on and were not: complete and past their grace
        period but still in the buffer (the tick is busy building), taken and waiting, or being
        built.

        Ingest counts them with the bus when it decides whether to take more, so a
        build that falls behind is back-pressure (503), not a buffer that grows.
        Traces inside their grace period are not behind: they are rate x `grace_s`
        of normal flight (~450 at 900 traces/s), and counting them made ingest answer
        503 while every stage had room. Open traces whose root has not arrived are
        not counted either; both are bounded by `max_spans`/`max_bytes`."""
        overdue = max(0, self._ended_open - self._in_grace(self.clock()))
        return overdue + len(self._pending) + self._building

    def _in_grace(self, now: float) -> int:
        # Deadlines are appended in time order, so those still ahead are a suffix: binary search.
        # A trace taken early (evicted) leaves its entry behind until the deadline passes, which
        # can only make this count high and the backlog low, never the other way.
        deadlines = self._root_deadlines
        low, high = 0, len(deadlines)
        while low < high:
            middle = (low + high) // 2
            if deadlines[middle][0] <= now:
                low = middle + 1
            else:
                high = middle
        return len(deadlines) - low

    @property
    def fill_ratio(self) -> float:
        return max(self._span_count / self.config.max_spans, self._byte_count / self.config.max_bytes)

    async def consume_spans(self, batch: Sequence[AnySpan]) -> None:
        now = self.clock()
        late: set[TraceKey] = set()
        for span in batch:
            key = (span.tenant, span.trace_id)
            if hash(key) in self._recent:
                self.metrics.late_spans.inc()
                late.add(key)
                continue
            open_trace = self._open.get(key)
            if open_trace is None:
                open_trace = self._open[key] = _OpenTrace(first_seen=now)
            open_trace.spans.append(span)
            open_trace.size_bytes += span.size_bytes
            self._span_count += 1
            self._byte_count += span.size_bytes
            if span.is_root and open_trace.root_ended_at is None:
                open_trace.root_ended_at = now
                self._ended_open += 1
                self._root_deadlines.append((now + self.config.grace_s, key))
            self._evict_over_bounds(keep=key)
        if late and self.ledger is not None:
            for key in late:
                self.ledger.late(key)
        if self._pending:
            await self._emit_pending()

    def _evict_over_bounds(self, keep: TraceKey) -> None:
        while (self._span_count > self.config.max_spans or self._byte_count > self.config.max_bytes) and len(
            self._open
        ) > 1:
            oldest = next(iter(self._open))
            if oldest == keep:
                # The trace being filled is the oldest; evict the next one instead.
                oldest = list(self._open)[1]
            self._take(oldest, reason="evicted")

    def _take(self, key: TraceKey, reason: str) -> None:
        open_trace = self._open.pop(key)
        if open_trace.root_ended_at is not None:
            self._ended_open -= 1
        self._span_count -= len(open_trace.spans)
        self._byte_count -= open_trace.size_bytes
        key_hash = hash(key)
        if key_hash not in self._recent:
            self._recent.add(key_hash)
            self._recent_at.append(self.clock())
            self._recent_hashes.append(key_hash)
            if len(self._recent_hashes) > _RECENT_LIMIT:
                self._forget_oldest()
        self._pending.append((open_trace, reason))

    def _forget_oldest(self) -> None:
        self._recent_at.popleft()
        self._recent.discard(self._recent_hashes.popleft())

    def _collect_due(self, now: float, everything: bool = False) -> None:
        # Insertion order is emission order, so expired ids sit at the front.
        forget_before = now - self.config.timeout_s
        while self._recent_at and self._recent_at[0] < forget_before:
            self._forget_oldest()
        while self._root_deadlines and (everything or self._root_deadlines[0][0] <= now):
            _, key = self._root_deadlines.popleft()
            if key in self._open:
                self._take(key, reason="complete")
        # Insertion order is first-seen order, so timed-out traces sit at the front.
        while self._open:
            key, open_trace = next(iter(self._open.items()))
            if not everything and open_trace.first_seen + self.config.timeout_s > now:
                break
            self._take(key, reason="timeout" if open_trace.root_ended_at is None else "complete")

    async def _emit_pending(self) -> None:
        async with self._flush_lock:
            pending, self._pending = self._pending, []
            if not pending:
                return
            # Building costs ~0.5 ms of CPU a trace, so it runs off the event loop (`build`). All
            # chunks are submitted at once and each is handed on as soon as it is built, in order:
            # one build of a tick's ~1,000 traces held them all, as backlog, until the last was
            # done, and left the store idle meanwhile.
            chunks = [pending[start : start + EMIT_CHUNK] for start in range(0, len(pending), EMIT_CHUNK)]
            builds = [
                asyncio.ensure_future(self.build([(t.spans, reason != "complete") for t, reason in chunk]))
                for chunk in chunks
            ]
            self._building = len(pending)
            taken = 0  # chunks built and handed on (or being handed on)
            try:
                for chunk, build in zip(chunks, builds, strict=True):
                    built = await build
                    taken += 1
                    await self._hand_on(chunk, built)
                    # counted as backlog until handed on, so "no backlog" means "all passed on"
                    self._building -= len(chunk)
            except BaseException as stopped:
                for later in builds[taken:]:
                    later.cancel()
                if isinstance(stopped, asyncio.CancelledError):
                    # The chunks not taken must not be lost: `stop()` emits them again. Their
                    # builds' results are dropped, so each trace is handed on once.
                    self._pending[:0] = [item for rest in chunks[taken:] for item in rest]
                raise
            finally:
                self._building = 0

    async def _hand_on(
        self, chunk: Sequence[tuple[_OpenTrace, str]], built: Sequence[RagTrace | None]
    ) -> None:
        traces = [trace for trace in built if trace is not None]
        # one increment per reason, not per trace: `labels()` costs microseconds on the loop
        for reason, count in Counter(reason for _, reason in chunk).items():
            self.metrics.assembled.labels(reason=reason).inc(count)
        if len(traces) < len(built):
            self.metrics.assembly_failures.inc(len(built) - len(traces))
            if self.ledger is not None:
                failed = [
                    (t.spans[0].tenant, t.spans[0].trace_id)
                    for (t, _), b in zip(chunk, built, strict=True)
                    if b is None
                ]
                self.ledger.done(failed)
        if traces:
            await self.next.consume_traces(traces)

    async def flush_due(self) -> None:
        """Emit every trace whose time has come (called by the background tick)."""
        self._collect_due(self.clock())
        if self._pending:
            await self._emit_pending()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.config.tick_s)
            try:
                await self.flush_due()
            except Exception:
                log.exception("span assembler tick failed; retrying next tick")

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="span-assembler")

    async def stop(self) -> None:
        """Stop the tick and emit every open trace (complete or partial). Safe twice and before start."""
        await cancel_task(self._task)
        self._task = None
        self._collect_due(self.clock(), everything=True)
        if self._pending:
            await self._emit_pending()
