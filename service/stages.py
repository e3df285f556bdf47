"""The small stages `pipeline.py` places between its components; each does one thing and holds no topology.

* `Fanout`: one batch to several sinks in order, updates to those that take them;
* `MetricsSink`: counts new traces and feedback, and corrects the counts of updated traces;
* `Delivered`: what the memory bus delivers to: the store sink, then the write-ahead log lets go of
  what was stored (`trace_keys`, `feedback_keys` are the log's keys);
* `ArchiveKeeper`: the span assembler's keeper of flushed spans, the store's span archive in a thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

from service.assemble import ArchivedTrace
from service.conventions.spans import AnySpan
from service.corrections import TraceUpdate, count_updates
from service.ingest.durable import DurableAcks
from service.metrics import Metrics
from service.model import Feedback, RagTrace
from service.store.span_archive import SpanArchive
from service.store.store_sink import StoreSink
from service.store.trace_store import Store

__all__ = ["ArchiveKeeper", "Delivered", "Fanout", "MetricsSink", "feedback_keys", "trace_keys"]


class MetricsSink:
    """Sink: counts NEW traces and feedback (the store in front of it drops redeliveries)."""

    def __init__(self, metrics: Metrics, store: Store) -> None:
        self.metrics = metrics
        self.store = store

    async def consume_traces(self, batch: Sequence[RagTrace]) -> None:
        # ~50 us a trace: on the event loop a batch held requests waiting (bench/RESULTS.md, p99)
        await asyncio.to_thread(self.metrics.count_traces, batch)

    async def consume_feedback(self, batch: Sequence[Feedback]) -> None:
        labels = await asyncio.to_thread(self.store.trace_labels, {(f.tenant, f.trace_id) for f in batch})
        self.metrics.count_feedback(batch, labels)

    async def consume_updates(self, batch: Sequence[TraceUpdate]) -> None:
        """Stored traces their late spans completed: corrections, never a second count."""
        await asyncio.to_thread(count_updates, self.metrics, batch)


class Fanout:
    """One batch to several sinks, in order; a sink's error stops the fan-out and goes to the bus."""

    def __init__(self, sinks: Sequence[Any]) -> None:
        self.sinks = list(sinks)

    async def consume_traces(self, batch: Sequence[RagTrace]) -> None:
        for sink in self.sinks:
            await sink.consume_traces(batch)

    async def consume_feedback(self, batch: Sequence[Feedback]) -> None:
        for sink in self.sinks:
            await sink.consume_feedback(batch)

    async def consume_updates(self, batch: Sequence[TraceUpdate]) -> None:
        """To the sinks that take updates; the drift windows keep a trace's first version only."""
        for sink in self.sinks:
            consume = getattr(sink, "consume_updates", None)
            if consume is not None:
                await consume(batch)


class ArchiveKeeper:
    """The span assembler's `SpanKeeper`: the span archive of the store, merged in a worker thread."""

    def __init__(self, archive: SpanArchive) -> None:
        self.archive = archive

    async def merge(self, groups: Sequence[Sequence[AnySpan]]) -> list[ArchivedTrace]:
        merged = await asyncio.to_thread(self.archive.merge, groups)
        return [ArchivedTrace(m.items, m.late, m.duplicates, m.too_late) for m in merged]


class Delivered:
    """What the memory bus delivers to: the store sink, then the write-ahead log lets go of what was
    stored (a failed delivery raises first, so nothing unstored is let go of)."""

    def __init__(self, sinks: StoreSink, durable: DurableAcks) -> None:
        self.sinks = sinks
        self.durable = durable

    async def consume_traces(self, batch: Sequence[RagTrace]) -> None:
        await self.sinks.consume_traces(batch)
        # one end per version: a batch may carry two versions of one trace
        self.durable.done([(t.tenant, t.trace_id) for t in batch])

    async def consume_feedback(self, batch: Sequence[Feedback]) -> None:
        await self.sinks.consume_feedback(batch)
        self.durable.done(feedback_keys(batch))

    async def dead_letter(self, records: Sequence[RagTrace | Feedback], error: Exception) -> None:
        """Keep records the store refused for good; once kept, the write-ahead log lets go of them."""
        await self.sinks.dead_letter(records, error)
        self.durable.done([(r.tenant, r.trace_id) for r in records if isinstance(r, RagTrace)])
        self.durable.done(feedback_keys(r for r in records if isinstance(r, Feedback)))


def trace_keys(items: Iterable[RagTrace | AnySpan]) -> set[tuple[str, str]]:
    """The ledger keys of traces, or of the traces some spans belong to."""
    return {(item.tenant, item.trace_id) for item in items}


def feedback_keys(events: Iterable[Feedback]) -> set[tuple[str, str, str]]:
    return {("feedback", event.tenant, event.event_id) for event in events}
