"""Distributed-mode bus: `KafkaBus` publishes traces and feedback, `KafkaReceiver` feeds them to the sinks.

Topics and keys (DESIGN.md, "bus"): normalized `RagTrace` records go to
`kafka.traces_topic`, `Feedback` events to `kafka.feedback_topic`, both as
UTF-8 JSON (the pydantic model's own serialization) keyed by the trace id.
With the same partition count on both topics, the default (murmur2) key
partitioner puts a trace and its feedback in the same partition number.

Producer guarantees (`KafkaBus`, in the ingest process):

* `acks="all"` with the idempotent producer; every call has a timeout from
  `KafkaConfig` (request, delivery, metadata wait).
* Records first enter a bounded local buffer (`kafka.buffer_records`). One
  task sends them and removes a record only once the broker acknowledged
  it. While the broker is slow or unreachable the records stay and are sent
  again with backoff; once the buffer is full `has_room()` is False and
  ingest answers 503 with Retry-After. Nothing is dropped; a record may be
  published twice (a retry after a lost acknowledgement), which consumers
  absorb because processing is idempotent by trace id and event id.

Consumer guarantees (`KafkaReceiver`, in `ragmon worker`):

* A consumer-group member; partitions move to the other members when one
  leaves or dies. Offsets are committed only after the sinks returned for
  the whole batch (at-least-once). A `RetryableError` from the sinks (the
  store is down) rewinds the batch's partitions and retries with backoff; a
  `PermanentError` or a record that does not decode is counted and skipped,
  since retrying the same input would fail the same way.
* Lag per group and partition is exported after every commit
  (`service.bus.lag`, from the fetch high watermark).

kafka-python exceptions are caught only in this module and `service.bus.lag`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError
from kafka.structs import OffsetAndMetadata
from pydantic import ValidationError

from service.bus.lag import LagExporter, partition_lags
from service.config import KafkaConfig
from service.consumer import FeedbackConsumer, TraceConsumer
from service.errors import RetryableError
from service.lifecycle import cancel_task
from service.metrics import Metrics
from service.model import Feedback, RagTrace

__all__ = ["KafkaBus", "KafkaReceiver", "RecordSink", "client_settings", "ensure_topics"]

log = logging.getLogger(__name__)

R = TypeVar("R")

_MIN_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 5.0
_SEND_CHUNK = 2000


class RecordSink(TraceConsumer, FeedbackConsumer, Protocol):
    """What a `KafkaReceiver` hands batches to: the same sinks the memory bus feeds."""


def client_settings(config: KafkaConfig) -> dict[str, Any]:
    """Connection and security settings shared by producer, consumer and admin client."""
    settings: dict[str, Any] = {
        "bootstrap_servers": list(config.bootstrap_servers),
        "security_protocol": config.security_protocol,
        "request_timeout_ms": int(config.request_timeout_s * 1000),
        "bootstrap_timeout_ms": int(config.request_timeout_s * 1000),
    }
    if config.sasl_mechanism is not None:
        settings.update(
            sasl_mechanism=config.sasl_mechanism,
            sasl_plain_username=config.sasl_username,
            sasl_plain_password=config.sasl_password,
        )
    if config.ssl_cafile is not None:
        settings["ssl_cafile"] = config.ssl_cafile
    return settings


def ensure_topics(config: KafkaConfig) -> None:
    """Create the traces and feedback topics when missing (a no-op for topics that exist)."""
    admin = KafkaAdminClient(client_id=f"{config.client_id}-admin", **client_settings(config))
    try:
        for topic in (config.traces_topic, config.feedback_topic):
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(
                    [NewTopic(topic, config.partitions, config.replication_factor)],
                    timeout_ms=int(config.request_timeout_s * 1000),
                )
    finally:
        admin.close()


@dataclass(frozen=True, slots=True)
class _Record:
    topic: str
    key: bytes
    value: bytes


class _OneThread:
    """Runs blocking client calls on one dedicated thread: kafka-python clients are not thread-safe."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def __call__(self, fn: Callable[..., R], *args: Any) -> R:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False)


class KafkaBus:
    """Producer side of distributed mode: implements `TraceConsumer` and `FeedbackConsumer` for ingest."""

    def __init__(self, config: KafkaConfig, metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        self._buffer: deque[_Record] = deque()
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._producer: KafkaProducer | None = None
        self._topics_ready = not config.create_topics
        self._thread = _OneThread("kafka-producer")
        self._task: asyncio.Task[None] | None = None
        metrics.state.add(
            "ragmon_kafka_buffer_records",
            "records waiting in the ingest Kafka buffer",
            lambda: self.depth,
        )
        metrics.state.add(
            "ragmon_kafka_buffer_fill_ratio",
            "ingest-side Kafka buffer use (0-1); at 1 ingest answers 503",
            lambda: self.depth / self.config.buffer_records,
        )

    @property
    def depth(self) -> int:
        """Records accepted but not yet acknowledged by the broker."""
        return len(self._buffer)

    @property
    def capacity(self) -> int:
        """Records held (with the assembler's backlog) before ingest answers 503: `kafka.buffer_records`."""
        return self.config.buffer_records

    def has_room(self) -> bool:
        return len(self._buffer) < self.capacity

    def _put(self, records: list[_Record]) -> None:
        if records:
            self._buffer.extend(records)
            self._idle.clear()
            self._ready.set()

    async def consume_traces(self, batch: Sequence[RagTrace]) -> None:
        topic = self.config.traces_topic
        self._put([_Record(topic, t.trace_id.encode(), t.model_dump_json().encode()) for t in batch])

    async def consume_feedback(self, batch: Sequence[Feedback]) -> None:
        topic = self.config.feedback_topic
        self._put([_Record(topic, f.trace_id.encode(), f.model_dump_json().encode()) for f in batch])

    def _open_producer(self) -> KafkaProducer:
        c = self.config
        if not self._topics_ready:
            ensure_topics(c)
            self._topics_ready = True
        return KafkaProducer(
            client_id=f"{c.client_id}-ingest",
            acks="all",
            enable_idempotence=True,
            linger_ms=c.linger_ms,
            compression_type=None if c.compression == "none" else c.compression,
            max_block_ms=int(c.max_block_s * 1000),
            delivery_timeout_ms=int(c.delivery_timeout_s * 1000),
            **client_settings(c),
        )

    def _send(self, records: list[_Record]) -> list[bool]:
        """Send `records` and wait for their acknowledgements; True where the broker acknowledged."""
        if self._producer is None:
            self._producer = self._open_producer()
        producer = self._producer
        futures: list[Any] = []
        for record in records:
            try:
                futures.append(producer.send(record.topic, key=record.key, value=record.value))
            except KafkaError:
                futures.append(None)
        deadline = time.monotonic() + self.config.delivery_timeout_s
        acked: list[bool] = []
        for future in futures:
            if future is None:
                acked.append(False)
                continue
            try:
                future.get(timeout=max(0.0, deadline - time.monotonic()))
                acked.append(True)
            except KafkaError:
                acked.append(False)
        return acked

    async def _run(self) -> None:
        backoff = _MIN_BACKOFF_S
        while True:
            await self._ready.wait()
            if not self._buffer:
                self._ready.clear()
                self._idle.set()
                continue
            chunk = [self._buffer[i] for i in range(min(_SEND_CHUNK, len(self._buffer)))]
            try:
                acked = await self._thread(self._send, chunk)
            except (KafkaError, OSError) as exc:
                # no producer (broker unreachable at bootstrap) or topics could not be created
                acked = [False] * len(chunk)
                log.warning("Kafka unavailable (%s); %d records buffered", exc, len(self._buffer))
            failed = [record for record, ok in zip(chunk, acked, strict=True) if not ok]
            for record, ok in zip(chunk, acked, strict=True):
                (self.metrics.kafka_produced if ok else self.metrics.kafka_produce_errors).labels(
                    topic=record.topic
                ).inc()
            for _ in chunk:
                self._buffer.popleft()
            # failed records go back to the head, in their order, to be sent first next time
            self._buffer.extendleft(reversed(failed))
            if failed:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
            else:
                backoff = _MIN_BACKOFF_S

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

        Safe twice and before start.
        """
        if self._task is not None:
            if not await self.drain(timeout_s):
                log.error("Kafka bus stopped with %d records unpublished", self.depth)
            await cancel_task(self._task)
            self._task = None
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await self._thread(producer.close, self.config.request_timeout_s)
        self._thread.shutdown()


class KafkaReceiver:
    """Receiver of distributed mode: a consumer-group member that hands each batch to the sinks.

    Offsets are committed only after `sinks` returned for the batch; see the
    module docstring for what happens on retryable and permanent errors.
    """

    def __init__(
        self, config: KafkaConfig, sinks: RecordSink, metrics: Metrics, *, group: str | None = None
    ) -> None:
        self.config = config
        self.sinks = sinks
        self.metrics = metrics
        self.group = group or config.sinks_group
        self._consumer: KafkaConsumer | None = None
        self._thread = _OneThread("kafka-consumer")
        self._lag = LagExporter(metrics.kafka_consumer_lag, self.group)
        self._task: asyncio.Task[None] | None = None
        self.assigned: frozenset[tuple[str, int]] = frozenset()
        self.batches = 0

    def _open(self) -> KafkaConsumer:
        c = self.config
        settings = client_settings(c)
        # a request must be allowed to outlive a group rebalance, which waits up to the session timeout
        settings["request_timeout_ms"] = int(max(c.request_timeout_s, c.session_timeout_s + 5) * 1000)
        return KafkaConsumer(
            c.traces_topic,
            c.feedback_topic,
            group_id=self.group,
            client_id=f"{c.client_id}-worker",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=int(c.session_timeout_s * 1000),
            heartbeat_interval_ms=int(c.heartbeat_interval_s * 1000),
            max_poll_interval_ms=int(c.max_poll_interval_s * 1000),
            max_poll_records=c.max_poll_records,
            **settings,
        )

    def _poll(self) -> dict[TopicPartition, list[Any]]:
        if self._consumer is None:
            if self.config.create_topics:
                ensure_topics(self.config)
            self._consumer = self._open()
        polled: dict[TopicPartition, list[Any]] = self._consumer.poll(
            timeout_ms=int(self.config.poll_timeout_s * 1000), max_records=self.config.max_poll_records
        )
        self.assigned = frozenset((tp.topic, tp.partition) for tp in self._consumer.assignment())
        return polled

    def _commit(self, offsets: dict[TopicPartition, int]) -> bool:
        if self._consumer is None:
            return False
        try:
            self._consumer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in offsets.items()})
        except KafkaError as exc:
            # the partitions moved during the batch: the new owner redelivers it, which is harmless
            log.warning("offset commit failed (%s); the batch will be redelivered", exc)
            self.metrics.kafka_commit_failures.labels(group=self.group).inc()
            return False
        return True

    def _rewind(self, first: dict[TopicPartition, int]) -> None:
        if self._consumer is None:
            return
        assigned = self._consumer.assignment()
        for tp, offset in first.items():
            if tp in assigned:
                self._consumer.seek(tp, offset)

    def _export_lag(self) -> None:
        if self._consumer is not None:
            self._lag.update(partition_lags(self._consumer))

    def _decode(self, polled: dict[TopicPartition, list[Any]]) -> tuple[list[RagTrace], list[Feedback]]:
        traces: list[RagTrace] = []
        feedback: list[Feedback] = []
        for tp, records in polled.items():
            for record in records:
                try:
                    if tp.topic == self.config.traces_topic:
                        traces.append(RagTrace.model_validate_json(record.value))
                    elif tp.topic == self.config.feedback_topic:
                        feedback.append(Feedback.model_validate_json(record.value))
                except (ValidationError, ValueError, TypeError):
                    self.metrics.kafka_bad_records.labels(topic=tp.topic).inc()
        return traces, feedback

    async def _deliver(self, traces: list[RagTrace], feedback: list[Feedback]) -> None:
        # traces first: feedback that finds its trace stored needs no later join
        if traces:
            await self.sinks.consume_traces(traces)
        if feedback:
            await self.sinks.consume_feedback(feedback)

    async def _run(self) -> None:
        backoff = _MIN_BACKOFF_S
        while True:
            try:
                polled = await self._thread(self._poll)
            except (KafkaError, OSError) as exc:
                log.warning("Kafka unavailable to the worker (%s); retrying in %.1fs", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
                continue
            if not polled:
                await self._thread(self._export_lag)
                continue
            first = {tp: records[0].offset for tp, records in polled.items()}
            nxt = {tp: records[-1].offset + 1 for tp, records in polled.items()}
            traces, feedback = self._decode(polled)
            try:
                await self._deliver(traces, feedback)
            except RetryableError as exc:
                self.metrics.sink_failures.labels(sink="kafka", kind="retryable").inc()
                log.warning("sinks refused a batch (%s); rewinding, retry in %.1fs", exc, backoff)
                await self._thread(self._rewind, first)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
                continue
            except Exception:
                self.metrics.sink_failures.labels(sink="kafka", kind="permanent").inc()
                log.exception("sinks refused a batch of %d records; skipping it", len(first))
            backoff = _MIN_BACKOFF_S
            if await self._thread(self._commit, nxt):
                for tp, records in polled.items():
                    self.metrics.kafka_consumed.labels(group=self.group, topic=tp.topic).inc(len(records))
            self.batches += 1
            self.metrics.sink_last_success.labels(sink="kafka").set(time.time())
            await self._thread(self._export_lag)

    @property
    def running(self) -> bool:
        """The consume loop is alive (a consumer with no partitions assigned still counts)."""
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"kafka-receiver-{self.group}")

    async def stop(self) -> None:
        """Stop consuming and leave the group (a batch not yet committed is redelivered). Safe twice."""
        if self._task is not None:
            await cancel_task(self._task)
            self._task = None
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await self._thread(consumer.close, False, int(self.config.request_timeout_s * 1000))
        self._lag.update({})
        self._thread.shutdown()
