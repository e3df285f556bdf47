"""The bus between assembly and the sinks. Embedded mode: `MemoryBus`, an in-process bounded queue.

The bus accepts every trace the assembler emits (the assembler's own buffer
is bounded, so the total held is bounded too). Ingest adds its `depth` to
the assembler's backlog (`Pipeline.has_room`) and answers 503 with
Retry-After at `bus.capacity` instead of taking more spans. Nothing is dropped.

Delivery: one task per record kind takes batches of up to `batch_size`
records and hands each batch to the subscriber. A batch that starts with
fewer records waits up to `linger_s` for more (or until `batch_size` are
queued): every batch costs the sinks the same dozen statements and thread
hand-offs whatever its size, and without the wait each assembler tick under
moderate load made a batch of its own (bench/RESULTS.md, session 38). The
assembler's emissions wait up to the same `linger_s` since session 39; this
wait tops them up, and batches traces that come by the JSON API.

* A `RetryableError` from the subscriber keeps the batch at the head of the
  queue and retries it with backoff (0.05 s doubling to 5 s).
* A `PermanentError`, or any other exception, means the same input fails the
  same way, but it need not be every record's fault: one bad record must not
  cost the others. So the batch is split in halves, each delivered on its
  own, recursively (depth first, in queue order); every part that succeeds is
  delivered, and each single record that still fails goes to the
  dead-letter handler with its error (a poison record amid 500 costs about
  2 log2(500) = 18 extra deliveries). A `RetryableError` met while splitting
  keeps the records not yet settled at the head and retries them as above;
  those settled (delivered or dead-lettered) are not delivered again.
* The dead-letter handler (`DeadLetterHandler`, a `MemoryBus` argument; the
  default only logs) is awaited with `[record]` and the error. When it raises
  a `RetryableError` the record stays at the head and is tried again later;
  any other error from it is logged and counted, and the record dropped.

Counted: `ragmon_sink_failures_total{sink,kind}` once per refused head batch
(`retryable` or `permanent`; `permanent` again for a record the handler
refused), `ragmon_dead_letters_total{kind}` per record the handler took, and
`ragmon_sink_last_success_timestamp_seconds{sink}` is set only when the
subscriber accepted a batch or a part of one: a batch that is all poison never
moves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, Literal, TypeVar

from service.bus.bisect import deliver_in_parts
from service.config import BusConfig
from service.consumer import FeedbackConsumer, TraceConsumer
from service.errors import PermanentError, RetryableError
from service.lifecycle import cancel_task
from service.metrics import Metrics
from service.model import Feedback, RagTrace

__all__ = ["DeadLetterHandler", "MemoryBus", "log_dead_letters"]

log = logging.getLogger(__name__)

T = TypeVar("T", RagTrace, Feedback)

DeadLetterHandler = Callable[[Sequence[RagTrace | Feedback], Exception], Awaitable[None]]
"""`async (records, error) -> None`: keeps records a sink refused for good (`StoreSink.dead_letter`).
Raising `RetryableError` means "not now": the bus offers the records again later."""

_MIN_BACKOFF_S = 0.05
_MAX_BACKOFF_S = 5.0


def _record_id(record: RagTrace | Feedback) -> str:
    # getattr: a record that failed to store may have been built without validation
    return str(getattr(record, "event_id" if isinstance(record, Feedback) else "trace_id", "?"))


async def log_dead_letters(records: Sequence[RagTrace | Feedback], error: Exception) -> None:
    """The default dead-letter handler: logs each record (tenant, kind, id) with the error; keeps nothing."""
    for record in records:
        kind = "feedback" if isinstance(record, Feedback) else "trace"
        log.error(
            "dead letter: %s %s/%s refused for good and not kept: %s: %s",
            kind,
            getattr(record, "tenant", "?"),
            _record_id(record),
            type(error).__name__,
            error,
        )


class _Lane(Generic[T]):
    """One record kind's queue and its delivery loop (see the module docstring)."""

    def __init__(
        self,
        name: str,
        kind: Literal["trace", "feedback"],
        batch_size: int,
        deliver: Callable[[Sequence[T]], Awaitable[None]],
        metrics: Metrics,
        dead_letters: Callable[[Sequence[T], Exception], Awaitable[None]],
        linger_s: float = 0.0,
    ) -> None:
        self.name = name
        self.kind = kind
        self.batch_size = batch_size
        self.linger_s = linger_s
        self.deliver: Callable[[Sequence[T]], Awaitable[None]] = deliver
        self.metrics = metrics
        self.dead_letters: Callable[[Sequence[T], Exception], Awaitable[None]] = dead_letters
        self.items: deque[T] = deque()
        self.ready = asyncio.Event()
        self.full = asyncio.Event()  # a whole batch is queued (or a drain waits): a lingering batch goes now
        self.draining = 0  # drains waiting on this lane: nothing lingers meanwhile
        self.idle = asyncio.Event()
        self.idle.set()
        self.task: asyncio.Task[None] | None = None

    def put(self, batch: Sequence[T]) -> None:
        if batch:
            self.items.extend(batch)
            self.idle.clear()
            self.ready.set()
            if len(self.items) >= self.batch_size:
                self.full.set()

    async def _fill(self) -> None:
        """Wait up to `linger_s` for a whole batch to be queued (not while a drain waits)."""
        if self.linger_s <= 0 or self.draining or len(self.items) >= self.batch_size:
            return
        self.full.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.linger_s):
                await self.full.wait()

    async def run(self) -> None:
        backoff = _MIN_BACKOFF_S
        while True:
            await self.ready.wait()
            if not self.items:
                self.ready.clear()
                self.idle.set()
                continue
            if backoff == _MIN_BACKOFF_S:  # not while a failed batch is retried: it waited already
                await self._fill()
            batch = [self.items[i] for i in range(min(self.batch_size, len(self.items)))]
            try:
                await self._deliver_head(batch)
            except RetryableError as exc:
                self.metrics.sink_failures.labels(sink=self.name, kind="retryable").inc()
                log.warning("%s delivery failed, retrying in %.2fs: %s", self.name, backoff, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
                continue
            backoff = _MIN_BACKOFF_S

    async def _deliver_head(self, batch: list[T]) -> None:
        """Deliver the batch at the head of the queue, splitting it on a permanent error; pops each
        part from the queue as it is settled. Raises `RetryableError` with the rest still queued."""
        try:
            await self.deliver(batch)
        except RetryableError:
            raise
        except Exception as exc:
            self.metrics.sink_failures.labels(sink=self.name, kind="permanent").inc()
            log.warning(
                "%s delivery refused a batch of %d (%s: %s); delivering it in parts",
                self.name,
                len(batch),
                type(exc).__name__,
                exc,
                exc_info=not isinstance(exc, PermanentError),  # not one of ours: a bug, show where
            )
            await deliver_in_parts(batch, exc, self.deliver, self._dead_letter, self._delivered)
        else:
            self._delivered(len(batch))

    async def _dead_letter(self, record: Sequence[T], error: Exception) -> None:
        try:
            await self.dead_letters(record, error)
        except RetryableError:
            raise
        except Exception:
            self.metrics.sink_failures.labels(sink=self.name, kind="permanent").inc()
            log.exception(
                "%s: the dead-letter handler refused %s %s; the record is dropped",
                self.name,
                self.kind,
                _record_id(record[0]),
            )
        else:
            self.metrics.dead_letters.labels(kind=self.kind).inc(len(record))
        self._pop(len(record))

    def _delivered(self, n: int) -> None:
        self._pop(n)
        self.metrics.sink_last_success.labels(sink=self.name).set(time.time())

    def _pop(self, n: int) -> None:
        # the head of the queue is the batch being settled, in order: `put` only appends
        for _ in range(n):
            self.items.popleft()


class MemoryBus:
    """In-process bus: implements `TraceConsumer` and `FeedbackConsumer` for the producers.

    `dead_letters` receives each record a sink refused for good (see the
    module docstring); by default they are only logged (and counted).
    """

    def __init__(
        self,
        config: BusConfig,
        traces_to: TraceConsumer,
        feedback_to: FeedbackConsumer,
        metrics: Metrics,
        dead_letters: DeadLetterHandler = log_dead_letters,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self._traces: _Lane[RagTrace] = _Lane(
            "traces",
            "trace",
            config.batch_size,
            traces_to.consume_traces,
            metrics,
            dead_letters,
            config.linger_s,
        )
        self._feedback: _Lane[Feedback] = _Lane(
            "feedback",
            "feedback",
            config.batch_size,
            feedback_to.consume_feedback,
            metrics,
            dead_letters,
            config.linger_s,
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
        """Wait until everything queued so far was delivered (a lingering batch goes at once); False on
        timeout."""
        lanes = (self._traces, self._feedback)
        for lane in lanes:
            lane.draining += 1
            lane.full.set()
        try:
            async with asyncio.timeout(timeout_s):
                for lane in lanes:
                    await lane.idle.wait()
        except TimeoutError:
            return False
        finally:
            for lane in lanes:
                lane.draining -= 1
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
