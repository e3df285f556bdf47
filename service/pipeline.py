"""`Pipeline`: the one place that knows the topology and wires receivers → processors → sinks.

    receivers ──spans──▶ SpanAssembler ──▶ ReaskDetector ──▶ bus ──▶ PersistThenFanout
    JSON API ──traces──────────────────────▲                          ├─ store (dedup by trace id)
    feedback ─────────────────────────────────────────────────▶ bus ──┤
                                                                      └─ metrics, then later stages

`start()` starts the sinks first, then the bus, then the assembler (receivers
are started by the API once this returns); `stop()` runs the other way round
and flushes every open trace, so each stage drains into a live consumer.

Back-pressure: `accept_*` raise `QueueFull` (503 + Retry-After) while the bus
holds more than its capacity; nothing is taken that cannot be delivered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from service.assemble import SpanAssembler
from service.bus import MemoryBus
from service.config import RagmonConfig
from service.consumer import TraceConsumer
from service.errors import QueueFull
from service.metrics import Metrics
from service.model import Feedback, RagTrace
from service.pricing import PriceTable
from service.regeneration import ReaskDetector
from service.semconv import build_trace
from service.spans import Span
from service.store import Store

log = logging.getLogger(__name__)

_RETENTION_EVERY_S = 3600.0


class PersistThenFanout:
    """Sink node: store the batch, then hand only the traces that were new to metrics and later stages.

    This is where idempotency by trace id is enforced for everything
    downstream: a redelivered trace is stored once and counted once.
    """

    def __init__(self, store: Store, metrics: Metrics, downstream: Sequence[TraceConsumer] = ()) -> None:
        self.store = store
        self.metrics = metrics
        self.downstream = list(downstream)

    async def consume_traces(self, batch: Sequence[RagTrace]) -> None:
        new_ids = set(await asyncio.to_thread(self.store.insert_traces, batch))
        fresh = [t for t in batch if t.trace_id in new_ids]
        if not fresh:
            return
        self.metrics.count_traces(fresh)
        for consumer in self.downstream:
            await consumer.consume_traces(fresh)

    async def consume_feedback(self, batch: Sequence[Feedback]) -> None:
        new_ids = set(await asyncio.to_thread(self.store.insert_feedback, batch))
        fresh = [f for f in batch if f.event_id in new_ids]
        if not fresh:
            return
        labels = await asyncio.to_thread(self.store.trace_labels, {(f.tenant, f.trace_id) for f in fresh})
        self.metrics.count_feedback(fresh, labels)


class Pipeline:
    """Everything between the receivers and the sinks of one ragmon process."""

    def __init__(self, config: RagmonConfig, metrics: Metrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or Metrics(config.metrics)
        self.prices = PriceTable.default().with_overrides(config.pricing.overrides)
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self.store = Store(
            config.store_url,
            connect_timeout_s=config.store.timeout_s,
            statement_timeout_s=config.store.timeout_s,
        )
        self.sinks = PersistThenFanout(self.store, self.metrics)
        self.bus = MemoryBus(config.bus, traces_to=self.sinks, feedback_to=self.sinks, metrics=self.metrics)
        self.reask = ReaskDetector(config.regeneration, next=self.bus)
        self.assembler = SpanAssembler(
            config.assembler,
            next=self.reask,
            build=lambda spans, partial: build_trace(spans, partial=partial, prices=self.prices),
            metrics=self.metrics,
        )
        self._retention_task: asyncio.Task[None] | None = None
        self.started = False
        state = self.metrics.state
        state.add("ragmon_open_traces", "traces being assembled (spans buffered)", lambda: self.assembler.open_traces)
        state.add("ragmon_open_trace_spans", "spans in the open-trace buffer", lambda: self.assembler.open_spans)
        state.add("ragmon_open_trace_bytes", "estimated bytes in the open-trace buffer",
                  lambda: self.assembler.open_bytes)
        state.add("ragmon_open_trace_buffer_fill_ratio", "open-trace buffer use (0-1) of its span or byte bound",
                  lambda: self.assembler.fill_ratio)
        state.add("ragmon_bus_queue_depth", "records waiting in the bus", lambda: self.bus.depth)
        state.add("ragmon_bus_capacity", "records the bus holds before ingest answers 503",
                  lambda: self.config.bus.capacity)

    def _check_room(self) -> None:
        """Refuse new work while the bus is over capacity (the receiver counts the refusal)."""
        if not self.bus.has_room():
            raise QueueFull(
                f"ragmon is behind ({self.bus.depth} records queued); retry later",
                retry_after_s=self.config.bus.retry_after_s,
            )

    async def accept_spans(self, spans: Sequence[Span], receiver: str) -> None:
        self._check_room()
        await self.assembler.consume_spans(spans)
        self.metrics.spans_received.labels(receiver=receiver).inc(len(spans))

    async def accept_traces(self, traces: Sequence[RagTrace]) -> None:
        self._check_room()
        await self.reask.consume_traces(traces)

    async def accept_feedback(self, events: Sequence[Feedback]) -> None:
        self._check_room()
        await self.bus.consume_feedback(events)

    async def _retention(self) -> None:
        while True:
            cutoff = datetime.now(UTC) - timedelta(days=self.config.store.retention_days)
            try:
                deleted = await asyncio.to_thread(self.store.delete_older_than, cutoff)
                if deleted:
                    log.info("retention: deleted %d traces older than %s", deleted, cutoff.isoformat())
            except Exception:
                log.exception("retention run failed; will retry")
            await asyncio.sleep(_RETENTION_EVERY_S)

    async def start(self) -> None:
        await asyncio.to_thread(self.store.create_schema)
        await self.bus.start()
        await self.assembler.start()
        self._retention_task = asyncio.create_task(self._retention(), name="retention")
        self.started = True

    async def stop(self) -> None:
        """Flush open traces, drain the bus, close the store. Safe twice and before start."""
        self.started = False
        if self._retention_task is not None:
            self._retention_task.cancel()
            self._retention_task = None
        await self.assembler.stop()
        await self.bus.stop()
        await asyncio.to_thread(self.store.close)

    async def ready(self) -> tuple[bool, str]:
        if not self.started:
            return False, "starting"
        if not self.bus.has_room():
            return False, "bus full"
        try:
            await asyncio.to_thread(self.store.ping)
        except Exception as exc:
            return False, f"store unavailable: {type(exc).__name__}"
        return True, "ok"

    async def flush(self, timeout_s: float = 10.0) -> bool:
        """Emit every open trace now and wait until the bus delivered everything (tests, demo, shutdown)."""
        await self.assembler.stop()
        await self.assembler.start()
        return await self.bus.drain(timeout_s)
