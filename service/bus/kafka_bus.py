"""Ingest's side of distributed mode: `KafkaBus` publishes what ingest accepted, acknowledged by the broker.

Topics and keys (DESIGN.md, "bus"): the spans and GenAI log events that
ingest accepted go to `kafka.spans_topic` (OTLP protobuf, one trace per
record: service/ingest/span_records.py); JSON-API `RagTrace` records go to
`kafka.traces_topic` and `Feedback` events to `kafka.feedback_topic`, both
as UTF-8 JSON (the pydantic model's own serialization). Every record is
keyed by its trace id, so the default (murmur2) key partitioner puts all the
records of one trace on the same partition number of each topic.

Guarantees, DESIGN.md "A 200 is a promise":

* `publish` (and `consume_traces` / `consume_feedback`) returns only once
  the broker acknowledged every record with `acks="all"`; ingest answers
  200 after that. It raises `QueueFull` (503 + Retry-After) instead when
  the local buffer is full (`kafka.buffer_records`), while the producer is
  unavailable (a send failed and no send or probe has passed since, or a
  record has waited longer than `kafka.publish_timeout_s` for its
  acknowledgement), or when the acknowledgement does not come within
  `kafka.publish_timeout_s`. Records of a refused call that were not yet
  handed to the producer are withdrawn; any already handed over may still
  arrive (the caller retries, and consumers are idempotent by trace id,
  event id and span id).
* Records go to the producer as they come, without waiting for the
  acknowledgement of earlier ones: the producer batches them (`kafka.batch_bytes`
  a partition) and keeps several produce requests in flight (the idempotent
  producer keeps each partition's order with up to five), so the rate follows
  the broker's throughput, not its acknowledgement latency, and rises with the
  number of requests ingest serves at once.
* One record per key in flight: a record of a trace (topic and key) goes to
  the producer only once the one before it of the same trace was
  acknowledged. Whatever a broker or a rebuilt producer does with a failed
  request, a trace's records therefore first reach the topic in the order
  they were published (a resend may add a later duplicate, which consumers
  drop). Records of different traces do not wait for each other.
* The first record the producer fails ends that producer: it is closed (what
  it still holds is aborted and ignored from then on), every record not
  acknowledged goes back to the head of the buffer in publish order, and a
  new producer sends them first after a backoff. kafka-python's idempotent
  producer that lost its producer id (or its broker) never recovers by
  itself. With nothing to send, a failed producer is probed (a metadata
  request from a new producer) with backoff until the broker answers, so
  `available` (and with it 200s instead of 503s) comes back on its own after
  an outage of any length. Ingest stays ready meanwhile: a 503 is an answer.
* The producer, kafka-python's batching and compression, runs in processes of
  its own where a CPU is to spare (`kafka.producer_processes`,
  producer_process.py says why); a producer process that dies is a failed send
  like any other: what the group held is sent again through a new one. With
  `kafka.producer_client: librdkafka` the producer is librdkafka's, in C
  threads of this process (librdkafka_producer.py), under the same rules.
* `stop(timeout_s)` waits up to `timeout_s` for the buffer to be delivered.

kafka-python exceptions are caught only in the bus package.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, get_args

from kafka.errors import KafkaError

from service.bus.kafka_client import (
    ClientThread,
    compression_refused,
    ensure_topics,
    producer_settings,
    task_failure,
)
from service.bus.librdkafka_producer import LibrdkafkaProducer, librdkafka_available
from service.bus.outage_log import OutageLog
from service.bus.producer_process import Producer, ProducerGroup, ThreadProducer
from service.config import KafkaConfig
from service.errors import QueueFull
from service.lifecycle import cancel_task
from service.metrics import Metrics
from service.model import Feedback, RagTrace
from service.processes import usable_cpus

__all__ = ["KafkaBus", "OutRecord"]

log = logging.getLogger(__name__)

_MIN_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 5.0
# records handed to the producer in one call on its thread (each call is one hop between threads)
_SEND_CHUNK = 2000
# producer processes when `kafka.producer_processes` is unset and more than one CPU is usable
# (two beat one and the server's own thread on two cores: bench/RESULTS.md, issue 36)
DEFAULT_PRODUCER_PROCESSES = 2

# the codecs `kafka.compression` offers: one series each of ragmon_kafka_producer_compression_info
_CODECS: tuple[str, ...] = get_args(KafkaConfig.model_fields["compression"].annotation)

# where an entry is: behind an earlier record of its trace, in the buffer to send, with the
# producer, or finished (acknowledged, or dropped after its caller withdrew)
_WAITING, _READY, _SENT, _DONE = range(4)


@dataclass(frozen=True, slots=True)
class OutRecord:
    """One record to publish: topic, key (the trace id), value and headers."""

    topic: str
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()


class _Publish:
    """The records of one `publish` call: `done` resolves once the broker acknowledged them all."""

    __slots__ = ("done", "entries", "remaining", "withdrawn")

    def __init__(self, records: int) -> None:
        self.remaining = records
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.withdrawn = False
        self.entries: list[_Entry] = []


@dataclass(slots=True, eq=False)
class _Entry:
    record: OutRecord
    owner: _Publish
    seq: int  # publish order
    lane: tuple[str, bytes]  # (topic, key): one record of a lane with the producer at a time
    state: int = _READY
    generation: int = 0  # the producer it was handed to
    sent_at: float = 0.0


class KafkaBus:
    """Producer side of distributed mode: `publish` returns once the broker acknowledged (acks=all).

    Implements `TraceConsumer` and `FeedbackConsumer` for ingest's JSON API;
    see the module docstring for what is guaranteed."""

    def __init__(self, config: KafkaConfig, metrics: Metrics, *, retry_after_s: float = 1.0) -> None:
        self.config = config
        self.metrics = metrics
        self.retry_after_s = retry_after_s
        self._seq = itertools.count()
        # entries to hand to the producer, each the first unfinished record of its lane
        self._ready: deque[_Entry] = deque()
        # lanes that have a record ready or with the producer -> the records waiting behind it
        self._lanes: dict[tuple[str, bytes], deque[_Entry]] = {}
        self._sent: dict[int, _Entry] = {}  # with the producer, by seq
        self._sent_times: deque[_Entry] = deque()  # the same in the order handed over (oldest first)
        self._depth = 0  # accepted, not yet acknowledged or withdrawn
        # producer callbacks (on kafka-python's threads) -> the event loop
        self._done: deque[tuple[_Entry, int, Any]] = deque()
        self._done_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._generation = 0  # bumped when a producer is given up: its callbacks are stale after
        self._failing = False
        self._discard = False  # a producer failed and must be closed before the next send
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._producer: Producer | None = None
        if config.producer_client == "librdkafka" and not librdkafka_available():
            raise ValueError(
                "kafka.producer_client is librdkafka but confluent-kafka is not installed "
                "(pip install 'ragmon[kafka]')"
            )
        # kafka-python's producer in processes of its own (producer_process.py says why); unset: with a
        # CPU to spare. librdkafka's own C threads do that work: it needs none.
        if config.producer_client == "librdkafka":
            if config.producer_processes:
                log.warning("kafka.producer_processes does not apply to producer_client librdkafka")
            self.producer_processes = 0
        elif config.producer_processes is not None:
            self.producer_processes = config.producer_processes
        else:
            self.producer_processes = DEFAULT_PRODUCER_PROCESSES if usable_cpus() > 1 else 0
        self._topics_ready = not config.create_topics
        # the codec producers are built with: kafka.compression until the broker refuses it (gzip then)
        self._compression: str = config.compression
        self._thread = ClientThread("kafka-producer")
        self._closers: list[threading.Thread] = []  # producers given up, closing once they are done
        self._task: asyncio.Task[None] | None = None
        self._outage = OutageLog(log, "Kafka (ingest producer)")
        metrics.state.add(
            "ragmon_kafka_buffer_records",
            "records waiting in the ingest Kafka buffer (sent or not) for the broker's acknowledgement",
            lambda: self.depth,
        )
        metrics.state.add(
            "ragmon_kafka_buffer_fill_ratio",
            "ingest-side Kafka buffer use (0-1); at 1 ingest answers 503",
            lambda: self.depth / self.config.buffer_records,
        )
        metrics.state.add(
            "ragmon_kafka_producer_available",
            "1 while ingest can publish to Kafka, 0 after a failed send until the broker answers again "
            "(meanwhile ingest answers 503 + Retry-After, and stays ready)",
            lambda: 1.0 if self.available else 0.0,
        )

    @property
    def depth(self) -> int:
        """Records accepted for publishing and not yet acknowledged by the broker."""
        return self._depth

    @property
    def in_flight(self) -> int:
        """Records handed to the producer and not yet acknowledged (or failed)."""
        return len(self._sent)

    @property
    def capacity(self) -> int:
        """Records held before ingest answers 503: `kafka.buffer_records`."""
        return self.config.buffer_records

    def _oldest_sent_at(self) -> float | None:
        times = self._sent_times
        while times and (times[0].state != _SENT or times[0].seq not in self._sent):
            times.popleft()
        return times[0].sent_at if times else None

    @property
    def available(self) -> bool:
        """The broker takes records: no failed send since the last success (or probe), and no record
        waiting longer than `publish_timeout_s` for its acknowledgement."""
        if self._failing:
            return False
        since = self._oldest_sent_at()
        return since is None or time.monotonic() - since < self.config.publish_timeout_s

    def has_room(self) -> bool:
        return self.depth < self.capacity

    def _refuse(self, reason: str, message: str) -> QueueFull:
        self.metrics.kafka_publish_refused.labels(reason=reason).inc()
        return QueueFull(message, retry_after_s=self.retry_after_s)

    async def publish(self, records: Sequence[OutRecord]) -> None:
        """Publish `records`; returns once the broker acknowledged every one of them (acks=all).

        Raises `QueueFull` (nothing acknowledged can be assumed; retry later) when
        the buffer is full, the producer is unavailable, or the acknowledgement
        does not come within `kafka.publish_timeout_s`."""
        if not records:
            return
        if not self.available:
            raise self._refuse("unavailable", "Kafka is unavailable to ingest; retry later")
        if not self.has_room():
            raise self._refuse("buffer_full", f"the Kafka buffer is full ({self.depth} records); retry later")
        owner = _Publish(len(records))
        for record in records:
            entry = _Entry(record, owner, next(self._seq), (record.topic, record.key))
            owner.entries.append(entry)
            behind = self._lanes.get(entry.lane)
            if behind is None:
                self._lanes[entry.lane] = deque()
                self._ready.append(entry)
            else:
                entry.state = _WAITING
                behind.append(entry)
        self._depth += len(records)
        self._idle.clear()
        self._wake.set()
        try:
            async with asyncio.timeout(self.config.publish_timeout_s):
                await asyncio.shield(owner.done)
        except TimeoutError:
            self._withdraw(owner)
            raise self._refuse(
                "timeout",
                f"Kafka did not acknowledge within {self.config.publish_timeout_s:g}s; retry later",
            ) from None
        except asyncio.CancelledError:
            self._withdraw(owner)  # the caller went away: it never got an answer, so it will retry
            raise

    def _withdraw(self, owner: _Publish) -> None:
        """Drop the records of a refused call that the producer does not have yet."""
        owner.withdrawn = True
        ready = False
        for entry in owner.entries:
            if entry.state == _WAITING:
                self._lanes[entry.lane].remove(entry)
                self._finish(entry)
            elif entry.state == _READY:
                ready = True
        if ready:
            self._ready = deque(e for e in self._ready if e.owner is not owner)
            for entry in owner.entries:
                if entry.state == _READY:
                    self._finish(entry)
                    self._hand_on(entry.lane)
        self._check_idle()

    def _finish(self, entry: _Entry) -> None:
        entry.state = _DONE
        self._depth -= 1

    def _hand_on(self, lane: tuple[str, bytes]) -> None:
        """The lane's record finished: the next one waiting behind it (if any) may go."""
        behind = self._lanes[lane]
        if behind:
            entry = behind.popleft()
            entry.state = _READY
            self._ready.append(entry)
            self._wake.set()
        else:
            del self._lanes[lane]

    def _check_idle(self) -> None:
        if self._depth == 0:
            self._idle.set()

    async def consume_traces(self, batch: Sequence[RagTrace]) -> None:
        topic = self.config.traces_topic
        await self.publish(
            [OutRecord(topic, t.trace_id.encode(), t.model_dump_json().encode()) for t in batch]
        )

    async def consume_feedback(self, batch: Sequence[Feedback]) -> None:
        topic = self.config.feedback_topic
        await self.publish(
            [OutRecord(topic, f.trace_id.encode(), f.model_dump_json().encode()) for f in batch]
        )

    # -- on the producer's thread -------------------------------------------------------------

    def _open_producer(self) -> Producer:
        c = self.config
        if not self._topics_ready:
            ensure_topics(c)
            self._topics_ready = True
        producer: Producer
        if c.producer_client == "librdkafka":
            producer = LibrdkafkaProducer(c, self._compression)
        elif self.producer_processes == 0:
            producer = ThreadProducer(producer_settings(c, self._compression))
        else:
            producer = ProducerGroup(producer_settings(c, self._compression), self.producer_processes)
        # kept: a fallback to gzip at the bootstrap (an old broker) is not paid again by the next one
        self._compression = producer.compression
        for codec_name in _CODECS:
            self.metrics.kafka_producer_compression.labels(codec=codec_name).set(
                1.0 if codec_name == producer.compression else 0.0
            )
        return producer

    def _hand_over(self, chunk: list[_Entry], generation: int) -> None:
        """Give `chunk` to the producer (made first if there is none); each record's outcome comes
        back through `_completed`. Raises what opening a producer raises."""
        if self._producer is None:
            self._producer = self._open_producer()
        self._producer.send_many(
            [(e, e.record.topic, e.record.key, e.record.value, e.record.headers, None) for e in chunk],
            functools.partial(self._completed, generation),
        )

    def _completed(self, generation: int, entry: _Entry, outcome: Any) -> None:
        """A record's outcome (metadata or exception), on whichever thread the client reports it."""
        self._done.append((entry, generation, outcome))
        if not self._done_scheduled and self._loop is not None:
            self._done_scheduled = True
            with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
                self._loop.call_soon_threadsafe(self._take_done)

    def _discard_producer(self) -> None:
        """Give the producer up: what it still holds is aborted (ours to resend with the next one)."""
        producer, self._producer = self._producer, None
        if producer is None:
            return
        self.metrics.kafka_producer_rebuilds.inc()
        closer = producer.abort()
        if closer is not None:
            self._closers.append(closer)

    def _probe(self) -> None:
        """Raises unless a new producer gets the spans topic's metadata from the broker."""
        self._discard_producer()
        self._producer = self._open_producer()
        self._producer.partition_count(self.config.spans_topic)

    # -- on the event loop ----------------------------------------------------------------------

    def _take_done(self) -> None:
        """Apply the outcomes the producer reported: acknowledge, or give the producer up."""
        self._done_scheduled = False
        failed: list[_Entry] = []
        acked_now = False
        while self._done:
            entry, generation, outcome = self._done.popleft()
            if entry.state != _SENT or entry.generation != generation:
                continue  # reported by a producer given up since: the record was already resent
            del self._sent[entry.seq]
            if isinstance(outcome, BaseException):
                self.metrics.kafka_produce_errors.labels(topic=entry.record.topic).inc()
                if self._compression == "zstd" and compression_refused(outcome):
                    # a broker that speaks Kafka 2.1+ but does not take zstd: the records go again,
                    # with the rest, through a new producer that compresses with gzip
                    log.warning(
                        "the Kafka broker refused zstd batches (%s); ingest's producer now uses gzip", outcome
                    )
                    self._compression = "gzip"
                failed.append(entry)
                continue
            acked_now = True
            self.metrics.kafka_produced.labels(topic=entry.record.topic).inc()
            self._finish(entry)
            owner = entry.owner
            owner.remaining -= 1
            if owner.remaining == 0 and not owner.done.done():
                owner.done.set_result(None)
            self._hand_on(entry.lane)
        if failed:
            self._give_up(failed)
        elif acked_now and self._failing and not self._discard:
            self._failing = False
            self._outage.recovered()
        self._check_idle()
        self._wake.set()

    def _give_up(self, failed: list[_Entry]) -> None:
        """The producer failed `failed`: everything it still holds goes back to the head of the buffer
        in publish order (what a withdrawn call published is dropped), and it is closed."""
        self._outage.failed(f"{len(failed)} records not acknowledged; {self.depth} records waiting")
        self._failing = True
        self._discard = True
        self._generation += 1
        for entry in self._sent.values():  # aborted with their producer
            self.metrics.kafka_produce_errors.labels(topic=entry.record.topic).inc()
        back = sorted([*failed, *self._sent.values()], key=lambda e: e.seq)
        self._sent.clear()
        self._sent_times.clear()
        resend: list[_Entry] = []
        for entry in back:
            if entry.owner.withdrawn:
                self._finish(entry)
                self._hand_on(entry.lane)
            else:
                entry.state = _READY
                resend.append(entry)
        self._ready.extendleft(reversed(resend))

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        backoff = _MIN_BACKOFF_S
        while True:
            if self._discard:
                self._discard = False
                await self._thread(self._discard_producer)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
                continue
            if not self._failing:
                backoff = _MIN_BACKOFF_S
            if not self._ready:
                if self._failing and not self._sent and self._depth == 0:
                    try:
                        await self._thread(self._probe)
                        self._failing = False
                        backoff = _MIN_BACKOFF_S
                        self._outage.recovered()
                    except (KafkaError, OSError) as exc:
                        self._outage.failed(exc)
                        await asyncio.sleep(backoff)
                        backoff = min(backoff * 2, _MAX_BACKOFF_S)
                    continue
                self._wake.clear()
                await self._wake.wait()
                continue
            chunk = [self._ready.popleft() for _ in range(min(_SEND_CHUNK, len(self._ready)))]
            generation = self._generation
            now = time.monotonic()
            for entry in chunk:
                entry.state = _SENT
                entry.generation = generation
                entry.sent_at = now
                self._sent[entry.seq] = entry
            self._sent_times.extend(chunk)
            try:
                await self._thread(self._hand_over, chunk, generation)
            except (KafkaError, OSError) as exc:
                # no producer (broker unreachable at bootstrap) or topics could not be created
                error = exc
                for entry in chunk:
                    self._completed(generation, entry, error)

    @property
    def failure(self) -> str | None:
        """Why the send loop ended when it was not stopped (liveness); None while it runs or before
        start."""
        task = self._task
        return None if task is None or not task.done() else task_failure(task)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kafka-bus")

    async def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until every record accepted so far is acknowledged by the broker; False on timeout."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Publish what is buffered (up to `timeout_s`), then close the producer.

        Safe twice and before start."""
        if self._task is not None:
            if not await self.drain(timeout_s):
                log.error("Kafka bus stopped with %d records unacknowledged", self.depth)
            await cancel_task(self._task)
            self._task = None
        self._loop = None
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await self._thread(producer.close, self.config.request_timeout_s)
        for closer in self._closers:
            await asyncio.to_thread(
                closer.join, self.config.delivery_timeout_s + self.config.request_timeout_s
            )
        self._thread.shutdown()
