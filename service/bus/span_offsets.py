"""`SpanOffsets`: which offsets of the spans topic a sinks worker may commit.

A record of the spans topic (one trace's spans from one ingest request) is
done only once the trace built from it is stored, or refused for good. Until
then it is *held*: its trace is open in the worker's `SpanAssembler`, waiting
to be built, or on its way through the sinks. The offset committed for a
partition is the lowest offset still held there (or the next offset to read
when none is), so a worker that dies loses nothing: its successor reads again
from the first record of the oldest trace that was not stored.

It follows the assembler from the outside, without reading its state:

* `hold(key, partition, offset)` when a record's spans are handed to the
  assembler. Every record is held, also one for a trace built and stored
  minutes ago: its spans complete that trace (service/assemble.py), and the
  record is done only once the fuller version is stored.
* `taken(keys)` when the assembler takes a trace for a flush (it is the
  assembler's `DropLedger`): the records held for it so far belong to that
  version (records that arrive later belong to a later one); `done(keys)` when
  it dropped the trace (too late to be completed, or its build failed: retrying
  cannot help, it was counted) releases them at once.

A trace stays open while its spans keep coming, at most
`assembler.max_age_s`; so does the lowest held offset of its partition, and
a worker that restarts reads again from there: every trace it builds again
is merged with what the span archive kept (nothing new: the store keeps the
stored version, and nothing is counted twice).
* `gate(next)` sits between the assembler and the sinks: once the sinks
  returned for a batch, its traces' records are released. A `RetryableError`
  (the store is down) is retried with backoff until it passes, holding up the
  assembler rather than dropping the batch (it would lose those traces); any
  other error is counted and logged, and releases them (the sinks dead-letter
  what they cannot store).
* `disown(partitions)` after a rebalance took partitions away: their records
  are forgotten and their traces, when the assembler hands them on, are not
  stored here; the new owner reads those records again from the committed
  offset and assembles the traces whole.

Keys are (tenant, trace id); every record of a trace id is on one partition
(the record key is the trace id). Everything runs on the event loop.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections import deque
from collections.abc import Iterable, Sequence

from service.consumer import TraceConsumer
from service.errors import RetryableError
from service.metrics import Metrics
from service.model import RagTrace

__all__ = ["Partition", "SpanOffsets", "TraceKey"]

log = logging.getLogger(__name__)

TraceKey = tuple[str, str]  # (tenant, trace_id)
Partition = tuple[str, int]  # (topic, partition)

_MIN_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 5.0


class _Held:
    """The held offsets of one partition: their lowest in O(log n)."""

    __slots__ = ("heap", "live")

    def __init__(self) -> None:
        self.heap: list[int] = []
        self.live: set[int] = set()

    def add(self, offset: int) -> bool:
        if offset in self.live:
            return False
        self.live.add(offset)
        heapq.heappush(self.heap, offset)
        return True

    def lowest(self) -> int | None:
        while self.heap and self.heap[0] not in self.live:
            heapq.heappop(self.heap)  # released earlier; dropped lazily
        return self.heap[0] if self.heap else None


class _Gate:
    """The sinks side of `SpanOffsets` (`TraceConsumer`)."""

    def __init__(self, offsets: SpanOffsets, next: TraceConsumer) -> None:
        self.offsets = offsets
        self.next = next

    async def consume_traces(self, batch: Sequence[RagTrace]) -> None:
        offsets = self.offsets
        keys = [(t.tenant, t.trace_id) for t in batch]
        live = [t for t, key in zip(batch, keys, strict=True) if not offsets._dropped(key)]
        backoff = _MIN_BACKOFF_S
        while live:
            try:
                await self.next.consume_traces(live)
                break
            except RetryableError as exc:
                offsets.metrics.sink_failures.labels(sink="kafka_spans", kind="retryable").inc()
                log.warning(
                    "sinks refused %d assembled traces (%s); retrying in %.1fs", len(live), exc, backoff
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
                # a rebalance meanwhile may have given some of them to another worker
                live = [t for t in live if not offsets._dropped((t.tenant, t.trace_id), forget=False)]
            except Exception:
                offsets.metrics.sink_failures.labels(sink="kafka_spans", kind="permanent").inc()
                log.exception("sinks refused %d assembled traces; releasing them", len(live))
                break
        offsets.release(keys)


class SpanOffsets:
    """Held offsets of the spans topic per partition and trace; see the module docstring."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._held: dict[Partition, _Held] = {}
        self._open: dict[TraceKey, list[tuple[Partition, int]]] = {}  # held, not yet taken by a build
        # per version taken by the assembler, oldest first: the records it carries, not stored yet
        self._claimed: dict[TraceKey, deque[list[tuple[Partition, int]]]] = {}
        self._disowned: set[TraceKey] = set()
        self._closed = False

    @property
    def held(self) -> int:
        """Records held (not yet committable) over all partitions."""
        return sum(len(h.live) for h in self._held.values())

    def hold(self, key: TraceKey, partition: Partition, offset: int) -> None:
        """A record of `key`'s spans at `offset` goes to the assembler now."""
        self._disowned.discard(key)  # read again after a rebalance gave the partition back
        held = self._held.setdefault(partition, _Held())
        if held.add(offset):
            self._open.setdefault(key, []).append((partition, offset))

    def committable(self, partition: Partition, next_offset: int) -> int:
        """The offset to commit for `partition`, whose records before `next_offset` were all read."""
        held = self._held.get(partition)
        lowest = held.lowest() if held is not None else None
        return next_offset if lowest is None else min(lowest, next_offset)

    def taken(self, keys: Iterable[TraceKey]) -> None:
        """The assembler took these traces for a flush (`DropLedger`): the records held for each so far
        belong to that version; records that come later belong to the next one."""
        for key in keys:
            self._claimed.setdefault(key, deque()).append(self._open.pop(key, []))

    def done(self, keys: Iterable[TraceKey]) -> None:
        """The assembler dropped these traces for good (too late, or their build failed)."""
        self.release(keys)

    def release(self, keys: Iterable[TraceKey]) -> None:
        """The oldest version of each trace of `keys` (a key given twice: two versions) is stored or
        refused for good: its records are done."""
        for key in keys:
            versions = self._claimed.get(key)
            if not versions:
                continue
            for partition, offset in versions.popleft():
                held = self._held.get(partition)
                if held is not None:
                    held.live.discard(offset)
            if not versions:
                del self._claimed[key]

    def _dropped(self, key: TraceKey, forget: bool = True) -> bool:
        """Whether a trace handed on must not be stored here (its partition went elsewhere, or this
        worker is stopping)."""
        if self._closed:
            return True
        if key in self._disowned:
            if forget:
                self._disowned.discard(key)
            return True
        return False

    def disown(self, partitions: Iterable[Partition]) -> None:
        """`partitions` are no longer this worker's: forget their records, keep their traces out."""
        gone = set(partitions)
        if not gone:
            return
        for key in [k for k, records in self._open.items() if any(p in gone for p, _ in records)]:
            del self._open[key]
            self._disowned.add(key)
        for key in [
            k for k, versions in self._claimed.items() if any(p in gone for v in versions for p, _ in v)
        ]:
            del self._claimed[key]
            self._disowned.add(key)
        for partition in gone:
            self._held.pop(partition, None)

    def close(self) -> None:
        """The worker is stopping: nothing handed on from now is stored (it was not committed, so
        the partitions' next owner assembles it again)."""
        self._closed = True

    def gate(self, next: TraceConsumer) -> TraceConsumer:
        """The consumer to put between the assembler and the sinks."""
        return _Gate(self, next)
