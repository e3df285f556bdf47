"""`SpanAssembler`: buffers spans by trace while they keep coming, then emits one `RagTrace`.

A trace stays open while its spans keep arriving. It is flushed when its root
span has ended and `grace_s` has passed (children of a batch exporter often
arrive in a later request than the root), when no span of it came for
`idle_s` (reason `idle`: a slow LLM call sends nothing until it ends), or
`max_age_s` after its first span (reason `max_age`: an agent that keeps
working). Over `evict_above` of the buffer's bound (`max_spans`,
`max_bytes`) the least recently active traces are flushed early (`evicted`);
at the bound itself `full` is true and ingest answers 503 + Retry-After
(`Pipeline.check_room`), or, where nobody can be refused (a sinks worker
reading Kafka: `evict_when_full`), the buffer evicts down to `evict_above`
at once.

A flush is never final. Every flush goes through the span archive first
(`SpanArchive`, service/store/span_archive.py): the flushed spans are kept
with what earlier flushes of the trace kept, and the trace is built from all
of them. So spans that arrive after a trace was flushed, minutes later and
in any process, open it again here, are flushed in their turn, and the trace
built then is the whole one: it replaces the stored version (a higher
`RagTrace.revision`), and the sinks after the store correct their counts
(service/corrections.py). A trace whose root has not arrived is built
`partial`. What the archive reports is counted: spans that completed a
flushed trace (`ragmon_late_spans_total`), and spans dropped, by reason
(`ragmon_dropped_spans_total`: `too_late` past `late_window_s` of the first
flush, `duplicate` kept already, `build_failed`). Nothing else is dropped.

Guarantees: `consume_spans` never blocks on I/O and never raises for bad span
content (bad spans were rejected by the receiver); `stop()` emits every open
trace before returning. `build` is a coroutine over a batch of traces: the
pipeline's runs it in worker processes (service/ingest/pool.py), `in_thread`
adapts a plain per-trace function for a worker thread, so the event loop keeps
serving requests while traces are built. An emission merges and builds in
chunks of `emit_chunk` traces (`EMIT_CHUNK` by default), all submitted at once,
and hands each chunk on as soon as it is built, in order. With a `linger_s`
the tick lets fewer than `emit_chunk` due traces wait up to that long for
more (the pipeline gives the bus's `batch_size` and `linger_s`: each chunk is
a span-archive transaction, and in a sinks worker a sink batch; bench/RESULTS.md,
session 39); evicted traces and `stop()` do not wait. A trace taken for emission is handed on
exactly once, even when the emitting task is cancelled mid-build. The
write-ahead log's ledger (`DropLedger`) is told when a trace is taken and
when it was dropped, so it holds each request until the version of the
trace that carried its spans reached its end (service/ingest/ledger.py).

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
from service.errors import RetryableError
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

# Flushed traces whose root had arrived, remembered so that their late children are flushed after
# `grace_s` rather than `idle_s`: for `late_window_s`, and never more than this many.
_RECENT_LIMIT = 200_000
_MIN_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 5.0


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
    last_seen: float
    spans: list[AnySpan] = field(default_factory=list)
    size_bytes: int = 0
    root_ended_at: float | None = None


@dataclass(frozen=True, slots=True)
class ArchivedTrace:
    """A flushed trace after the span archive: see `service.store.span_archive.Merged`."""

    items: Sequence[AnySpan]
    late: int
    duplicates: int
    too_late: bool


class SpanKeeper(Protocol):
    """Where flushed spans are kept so that late ones complete their trace (the span archive)."""

    async def merge(self, groups: Sequence[Sequence[AnySpan]]) -> Sequence[ArchivedTrace]:
        """Keep each group's items with what is kept for its trace; everything kept, per group."""


class DropLedger(Protocol):
    """Told when traces are taken and dropped, so a write-ahead log holds each request until the
    version of its trace that carries it reached its end (ingest/ledger.py)."""

    def taken(self, keys: Iterable[TraceKey]) -> None:
        """These traces were taken for a flush: what holds them now belongs to that version."""

    def done(self, keys: Iterable[TraceKey]) -> None:
        """These traces will never be handed on (dropped too late, or their build failed)."""


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
        keeper: SpanKeeper | None = None,
        *,
        evict_when_full: bool = False,
        emit_chunk: int = EMIT_CHUNK,
        linger_s: float = 0.0,
    ) -> None:
        """`emit_chunk`: traces merged with the archive and handed on together; `linger_s`: how long
        the tick lets fewer than `emit_chunk` due traces wait for more (0: none)."""
        if emit_chunk < 1 or not linger_s >= 0:
            raise ValueError(f"emit_chunk must be positive and linger_s at least 0: {emit_chunk}, {linger_s}")
        self.config = config
        self.next = next
        self.build = build
        self.metrics = metrics
        self.clock = clock
        self.ledger = ledger
        # None: traces are built from the spans buffered here only (a flushed trace stays flushed)
        self.keeper = keeper
        self.evict_when_full = evict_when_full
        self.emit_chunk = emit_chunk
        self.linger_s = linger_s
        # open traces, least recently active first (a span moves its trace to the end)
        self._open: OrderedDict[TraceKey, _OpenTrace] = OrderedDict()
        self._root_deadlines: deque[tuple[float, TraceKey]] = deque()
        self._age_deadlines: deque[tuple[float, TraceKey]] = deque()
        # Flushed traces whose root had arrived, oldest first: when, and the hash of their key (a
        # 64-bit hash stands for the key; a collision only makes a late child wait `grace_s`).
        self._recent_at: deque[float] = deque()
        self._recent_hashes: deque[int] = deque()
        self._recent: set[int] = set()
        self._span_count = 0
        self._byte_count = 0
        self._pending: list[tuple[_OpenTrace, str]] = []
        self._pending_since = 0.0  # when the first of `_pending` was taken
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

    def open_items(self, key: TraceKey) -> list[AnySpan] | None:
        """The spans (and events) buffered for an open trace, None when it is not open."""
        open_trace = self._open.get(key)
        return list(open_trace.spans) if open_trace is not None else None

    @property
    def fill_ratio(self) -> float:
        return max(self._span_count / self.config.max_spans, self._byte_count / self.config.max_bytes)

    @property
    def full(self) -> bool:
        """The buffer is at its bound: ingest refuses new spans (503) until the tick made room."""
        return self.fill_ratio >= 1.0

    async def consume_spans(self, batch: Sequence[AnySpan]) -> None:
        now = self.clock()
        grace = self.config.grace_s
        for span in batch:
            key = (span.tenant, span.trace_id)
            open_trace = self._open.get(key)
            if open_trace is None:
                open_trace = self._open[key] = _OpenTrace(first_seen=now, last_seen=now)
                self._age_deadlines.append((now + self.config.max_age_s, key))
                if self._recent and hash(key) in self._recent:
                    # a late child of a trace flushed with its root: the root has ended, wait `grace_s`
                    self._root_ended(open_trace, key, now, grace)
            else:
                open_trace.last_seen = now
                self._open.move_to_end(key)
            open_trace.spans.append(span)
            open_trace.size_bytes += span.size_bytes
            self._span_count += 1
            self._byte_count += span.size_bytes
            if span.is_root and open_trace.root_ended_at is None:
                self._root_ended(open_trace, key, now, grace)
        evicted = False
        if self.evict_when_full and self.full:
            waiting = len(self._pending)
            self._evict(keep=batch[-1] if batch else None)
            evicted = len(self._pending) > waiting
        # what lingers waits for the tick; what was evicted goes now
        if self._pending and (evicted or not self.linger_s):
            await self._emit_pending()

    def _root_ended(self, open_trace: _OpenTrace, key: TraceKey, now: float, grace: float) -> None:
        open_trace.root_ended_at = now
        self._ended_open += 1
        self._root_deadlines.append((now + grace, key))

    def _evict(self, keep: AnySpan | None = None) -> None:
        """Flush the least recently active open traces until the buffer is under `evict_above`."""
        limit = self.config.evict_above
        kept = (keep.tenant, keep.trace_id) if keep is not None else None
        while self.fill_ratio > limit and self._open:
            oldest = next(iter(self._open))
            if oldest == kept:
                if len(self._open) == 1:
                    return
                oldest = list(self._open)[1]
            self._take(oldest, reason="evicted")

    def _take(self, key: TraceKey, reason: str) -> None:
        open_trace = self._open.pop(key)
        if open_trace.root_ended_at is not None:
            self._ended_open -= 1
            key_hash = hash(key)
            if key_hash not in self._recent:
                self._recent.add(key_hash)
                self._recent_at.append(self.clock())
                self._recent_hashes.append(key_hash)
                if len(self._recent_hashes) > _RECENT_LIMIT:
                    self._forget_oldest()
        self._span_count -= len(open_trace.spans)
        self._byte_count -= open_trace.size_bytes
        if self.ledger is not None:
            self.ledger.taken((key,))
        if not self._pending:
            self._pending_since = self.clock()
        self._pending.append((open_trace, reason))

    def _forget_oldest(self) -> None:
        self._recent_at.popleft()
        self._recent.discard(self._recent_hashes.popleft())

    def _collect_due(self, now: float, everything: bool = False) -> None:
        config = self.config
        forget_before = now - config.late_window_s
        while self._recent_at and self._recent_at[0] < forget_before:
            self._forget_oldest()
        while self._root_deadlines and (everything or self._root_deadlines[0][0] <= now):
            _, key = self._root_deadlines.popleft()
            open_trace = self._open.get(key)
            if open_trace is not None and open_trace.root_ended_at is not None:
                self._take(key, reason="complete")
        # first-seen order: traces past their maximum age sit at the front (an entry whose trace was
        # taken, and maybe opened again since, is skipped: its own entry comes later)
        while self._age_deadlines and (everything or self._age_deadlines[0][0] <= now):
            _, key = self._age_deadlines.popleft()
            open_trace = self._open.get(key)
            if open_trace is None or (not everything and open_trace.first_seen + config.max_age_s > now):
                continue
            if open_trace.root_ended_at is not None:
                reason = "complete"
            else:
                reason = "shutdown" if everything else "max_age"
            self._take(key, reason=reason)
        # activity order: idle traces sit at the front
        while self._open:
            key, open_trace = next(iter(self._open.items()))
            if open_trace.last_seen + config.idle_s > now:
                break
            self._take(key, reason="idle")
        self._evict()
        if len(self._age_deadlines) > 2 * len(self._open) + 1024:
            # entries of traces taken since stay until their deadline: max_age_s x the trace rate
            # (~900k at 1,000 traces/s) if never dropped, so they are, now and then, all at once
            self._age_deadlines = deque(
                sorted((t.first_seen + config.max_age_s, key) for key, t in self._open.items())
            )

    async def _emit_pending(self) -> None:
        async with self._flush_lock:
            pending, self._pending = self._pending, []
            if not pending:
                return
            # Merging and building cost ~0.5 ms of CPU a trace, so they run off the event loop. All
            # chunks are submitted at once and each is handed on as soon as it is built, in order:
            # one build of a tick's ~1,000 traces held them all, as backlog, until the last was
            # done, and left the store idle meanwhile.
            size = self.emit_chunk
            chunks = [pending[start : start + size] for start in range(0, len(pending), size)]
            builds = [asyncio.ensure_future(self._merge_and_build(chunk)) for chunk in chunks]
            self._building = len(pending)
            taken = 0  # chunks built and handed on (or being handed on)
            try:
                for chunk, build in zip(chunks, builds, strict=True):
                    merged, built = await build
                    taken += 1
                    await self._hand_on(chunk, merged, built)
                    # counted as backlog until handed on, so "no backlog" means "all passed on"
                    self._building -= len(chunk)
            except BaseException as stopped:
                for later in builds[taken:]:
                    later.cancel()
                if isinstance(stopped, asyncio.CancelledError):
                    # The chunks not taken must not be lost: `stop()` emits them again. Their
                    # builds' results are dropped, so each trace is handed on once (merging again
                    # is idempotent).
                    self._pending[:0] = [item for rest in chunks[taken:] for item in rest]
                raise
            finally:
                self._building = 0

    async def _merge_and_build(
        self, chunk: Sequence[tuple[_OpenTrace, str]]
    ) -> tuple[Sequence[ArchivedTrace], list[RagTrace | None]]:
        """Keep the chunk's spans with what earlier flushes kept (the archive) and build each trace
        from all of it; a trace too late to be completed is not built (None)."""
        merged = await self._merged(chunk)
        wanted = [m for m in merged if not m.too_late]
        if not wanted:
            return merged, [None] * len(merged)
        built = iter(await self.build([(m.items, not any(i.is_root for i in m.items)) for m in wanted]))
        return merged, [None if m.too_late else next(built) for m in merged]

    async def _merged(self, chunk: Sequence[tuple[_OpenTrace, str]]) -> Sequence[ArchivedTrace]:
        """The chunk merged with what the archive keeps. While the store cannot be reached this retries
        with backoff, holding the emission up (ingest answers 503 meanwhile, the backlog grows): a
        trace built without what was kept of it would replace nothing. Any other error (logged and
        counted) builds the chunk from its buffered spans alone."""
        alone = [ArchivedTrace(t.spans, 0, 0, False) for t, _ in chunk]
        if self.keeper is None:
            return alone
        backoff = _MIN_BACKOFF_S
        while True:
            try:
                return await self.keeper.merge([t.spans for t, _ in chunk])
            except RetryableError as exc:
                self.metrics.sink_failures.labels(sink="span_archive", kind="retryable").inc()
                log.warning("span archive unavailable (%s); retrying in %.1fs", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
            except Exception:
                self.metrics.sink_failures.labels(sink="span_archive", kind="permanent").inc()
                log.exception(
                    "span archive refused %d traces; building them from their buffered spans", len(chunk)
                )
                return alone

    async def _hand_on(
        self,
        chunk: Sequence[tuple[_OpenTrace, str]],
        merged: Sequence[ArchivedTrace],
        built: Sequence[RagTrace | None],
    ) -> None:
        traces = [trace for trace in built if trace is not None]
        # one increment per reason, not per trace: `labels()` costs microseconds on the loop
        for reason, count in Counter(reason for _, reason in chunk).items():
            self.metrics.assembled.labels(reason=reason).inc(count)
        late = sum(m.late for m in merged)
        if late:
            self.metrics.late_spans.inc(late)
        duplicates = sum(m.duplicates for m in merged)
        if duplicates:
            self.metrics.dropped_spans.labels(reason="duplicate").inc(duplicates)
        ended: list[TraceKey] = []
        too_late = failed = 0
        for (open_trace, _), m, trace in zip(chunk, merged, built, strict=True):
            if trace is not None:
                continue
            ended.append((open_trace.spans[0].tenant, open_trace.spans[0].trace_id))
            if m.too_late:
                too_late += len(open_trace.spans)
            else:
                self.metrics.assembly_failures.inc()
                failed += len(m.items)
        if too_late:
            self.metrics.dropped_spans.labels(reason="too_late").inc(too_late)
        if failed:
            self.metrics.dropped_spans.labels(reason="build_failed").inc(failed)
        if ended and self.ledger is not None:
            self.ledger.done(ended)
        if traces:
            await self.next.consume_traces(traces)

    async def flush_due(self) -> None:
        """Emit every trace whose time has come, now (the background tick does the same, but lets a
        short emission linger)."""
        self._collect_due(self.clock())
        if self._pending:
            await self._emit_pending()

    def _lingering(self, now: float) -> bool:
        """Fewer than `emit_chunk` traces are due, the first of them less than `linger_s` ago, and the
        buffer has room: the tick lets them wait for more."""
        return (
            len(self._pending) < self.emit_chunk
            and now - self._pending_since < self.linger_s
            and not self.full
        )

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.config.tick_s)
            try:
                now = self.clock()
                self._collect_due(now)
                if self._pending and not self._lingering(now):
                    await self._emit_pending()
            except Exception:
                log.exception("span assembler tick failed; retrying next tick")

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="span-assembler")

    async def abandon(self) -> None:
        """Stop the tick and forget every open trace without building it: a sinks worker leaving its
        partitions, whose next owner reads their records again (nothing of them was committed)."""
        await cancel_task(self._task)
        self._task = None
        async with self._flush_lock:
            self._open.clear()
            self._pending.clear()
            self._root_deadlines.clear()
            self._age_deadlines.clear()
            self._span_count = self._byte_count = self._ended_open = 0

    async def stop(self) -> None:
        """Stop the tick and emit every open trace (complete or partial). Safe twice and before start."""
        await cancel_task(self._task)
        self._task = None
        self._collect_due(self.clock(), everything=True)
        if self._pending:
            await self._emit_pending()
