"""The bus between assembly and the sinks. Embedded mode: `MemoryBus`, an in-process bounded queue.

The bus accepts every trace the assembler emits (the assembler's own buffer
is bounded, so the total held is bounded too). Ingest adds its `depth` to
the assembler's backlog (`Pipeline.has_room`) and answers 503 with
Retry-After at `bus.capacity` instead of taking more spans. Nothing is dropped.

Delivery: one task takes batches of up to `batch_size` records and hands
each batch to the subscriber. A `RetryableError` from the subscriber keeps
the batch at the head of the queue and retries with backoff; a
`PermanentError` or any other exception is counted and logged, and the batch
is skipped (retrying the same input would fail the same way).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Generic, TypeVar

from service.config import BusConfig
from service.consumer import FeedbackConsumer, TraceConsumer
from service.errors import RetryableError
from service.lifecycle import cancel_task
from service.metrics import Metrics
from service.model import Feedback, RagTrace

log = logging.getLogger(__name__)

T = TypeVar("T", RagTrace, Feedback)

_MAX_BACKOFF_S = 5.0


class _Lane(Generic[T]):
    """One record kind's queue and its delivery loop."""

    def __init__(self, name: str, batch_size: int, deliver: object, metrics: Metrics) -> None:
        self.name = name
        self.batch_size = batch_size
        self.deliver = deliver
        self.metrics = metrics
        self.items: deque[T] = deque()
        self.ready = asyncio.Event()
        self.idle = asyncio.Event()
        self.idle.set()
        self.task: asyncio.Task[None] | None = None

    def put(self, batch: Sequence[T]) -> None:
        if batch:
            self.items.extend(batch)
            self.idle.clear()
            self.ready.set()

    async def run(self) -> None:
        backoff = 0.05
        while True:
            await self.ready.wait()
            if not self.items:
                self.ready.clear()
                self.idle.set()
                continue
            batch = [self.items[i] for i in range(min(self.batch_size, len(self.items)))]
            try:
                await self.deliver(batch)  # type: ignore[operator]
            except RetryableError as exc:
                self.metrics.sink_failures.labels(sink=self.name, kind="retryable").inc()
                log.warning("%s delivery failed, retrying in %.2fs: %s", self.name, backoff, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
                continue
            except Exception:
                self.metrics.sink_failures.labels(sink=self.name, kind="permanent").inc()
                log.exception("%s delivery refused a batch of %d; skipping it", self.name, len(batch))
            backoff = 0.05
            for _ in batch:
                self.items.popleft()
            self.metrics.sink_last_success.labels(sink=self.name).set(time.time())


class MemoryBus:
    """In-process bus: implements `TraceConsumer` and `FeedbackConsumer` for the producers."""

    def __init__(
        self, config: BusConfig, traces_to: TraceConsumer, feedback_to: FeedbackConsumer, metrics: Metrics
    ) -> None:
        self.config = config
        self.metrics = metrics
        self._traces: _Lane[RagTrace] = _Lane("traces", config.batch_size, traces_to.consume_traces, metrics)
        self._feedback: _Lane[Feedback] = _Lane(
            "feedback", config.batch_size, feedback_to.consume_feedback, metrics
        )

    @property
    def depth(self) -> int:
        return len(self._traces.items) + len(self._feedback.items)

    @property
    def capacity(self) -> int:
        """Records held (with the assembler's backlog) before ingest answers 503: `bus.capacity`."""
        return self.config.capacity

    async def consume_traces(self, batch: Sequence[RagTrace]) -> None:
        self._traces.put(batch)

    async def consume_feedback(self, batch: Sequence[Feedback]) -> None:
        self._feedback.put(batch)

    async def start(self) -> None:
        for lane in (self._traces, self._feedback):
            if lane.task is None:
                lane.task = asyncio.create_task(lane.run(), name=f"bus-{lane.name}")

    async def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until everything queued so far was delivered; False on timeout."""
        try:
            async with asyncio.timeout(timeout_s):
                for lane in (self._traces, self._feedback):
                    await lane.idle.wait()
        except TimeoutError:
            return False
        return True

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued (up to `timeout_s`), then stop. Safe twice and before start."""
        if self._traces.task is not None:
            drained = await self.drain(timeout_s)
            if not drained:
                log.error("bus stopped with %d records undelivered", self.depth)
        for lane in (self._traces, self._feedback):
            await cancel_task(lane.task)
            lane.task = None
