"""Distributed-mode bus: `KafkaBus` publishes what ingest accepted, `KafkaReceiver` feeds it to the sinks.

Topics and keys (DESIGN.md, "bus"): the spans and GenAI log events that
ingest accepted go to `kafka.spans_topic` (OTLP protobuf, one trace per
record: service/ingest/span_records.py); JSON-API `RagTrace` records go to
`kafka.traces_topic` and `Feedback` events to `kafka.feedback_topic`, both
as UTF-8 JSON (the pydantic model's own serialization). Every record is
keyed by its trace id, so the default (murmur2) key partitioner puts all the
records of one trace on the same partition number of each topic.

Producer guarantees (`KafkaBus`, in the ingest process), DESIGN.md "A 200 is
a promise":

* `publish` (and `consume_traces` / `consume_feedback`) returns only once
  the broker acknowledged every record with `acks="all"`; ingest answers
  200 after that. It raises `QueueFull` (503 + Retry-After) instead when
  the local buffer is full (`kafka.buffer_records`), while the producer is
  unavailable (a send failed and no send or probe has passed since, or one
  has waited longer than `kafka.publish_timeout_s`), or when the
  acknowledgement does not come within `kafka.publish_timeout_s`. Records
  of a refused call that were not yet handed to the producer are
  withdrawn; any already sent may still arrive (the caller retries, and
  consumers are idempotent by trace id, event id and span id).
* One task sends the buffer in order and removes a record only once it is
  acknowledged. After a failed send the producer is closed and a new one is
  built for the next attempt: kafka-python's idempotent producer that lost
  its producer id (or its broker) never recovers by itself. With nothing
  to send, a failed producer is probed (a metadata request from a new
  producer) with backoff until the broker answers, so `available` (and
  with it 200s instead of 503s) comes back on its own after an outage of
  any length. Ingest stays ready meanwhile: a 503 is an answer.
* `stop(timeout_s)` waits up to `timeout_s` for the buffer to be delivered.

Consumer guarantees (`KafkaReceiver`, in `ragmon worker`):

* A consumer-group member; partitions move to the other members when one
  leaves or dies. Traces and feedback: offsets are committed only after the
  sinks returned for the whole batch (at-least-once). A `RetryableError`
  from the sinks (the store is down) rewinds those partitions and retries
  with backoff; a `PermanentError` or a record that does not decode is
  counted and skipped, since retrying the same input would fail the same way.
* Spans: each record's spans go to the worker's span assembler; a spans
  partition is committed only up to its lowest offset still held by a trace
  that is not stored yet (`service.bus.span_offsets`). After a rebalance
  the partitions this worker kept go on from where it was (its open traces
  are still here); those it lost are disowned.
* Lag per group and partition is exported after every poll
  (`service.bus.lag`, from the fetch high watermark): records not yet read.
  What is not yet stored, the group's backlog, is measured from the broker's
  committed offsets by `service.bus.backlog`, in ingest and in every worker.

kafka-python exceptions are caught only in this module and `service.bus.lag`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from kafka import ConsumerRebalanceListener, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError
from kafka.structs import OffsetAndMetadata
from pydantic import ValidationError

from service.bus.bisect import deliver_in_parts
from service.bus.lag import LagExporter, partition_lags
from service.bus.outage_log import OutageLog
from service.bus.span_offsets import SpanOffsets
from service.config import KafkaConfig
from service.consumer import FeedbackConsumer, TraceConsumer
from service.conventions.spans import AnySpan
from service.errors import QueueFull, RagmonError, RetryableError
from service.lifecycle import cancel_task
from service.metrics import Metrics
from service.model import Feedback, RagTrace

__all__ = [
    "KafkaBus",
    "KafkaReceiver",
    "OutRecord",
    "RecordSink",
    "SpanIntake",
    "client_settings",
    "ensure_topics",
]

log = logging.getLogger(__name__)

R = TypeVar("R")

_MIN_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 5.0
_SEND_CHUNK = 2000


def quiet_client_logs() -> None:
    """Keep kafka-python's own loggers to CRITICAL unless ragmon logs at DEBUG.

    kafka-python logs every connection attempt (six lines at INFO to ERROR per failed bootstrap,
    several a second while the broker is down); ragmon reports the outage itself (`OutageLog`, with
    the client's error text), so its lines add only noise. With ragmon at DEBUG they all show.
    A level set on the `kafka` logger by the user (not NOTSET) is left alone."""
    client = logging.getLogger("kafka")
    if client.level == logging.NOTSET and not logging.getLogger().isEnabledFor(logging.DEBUG):
        client.setLevel(logging.CRITICAL)


class RecordSink(TraceConsumer, FeedbackConsumer, Protocol):
    """What a `KafkaReceiver` hands batches to: the same sinks the memory bus feeds."""


# Where records refused for good are kept (the store sink's `dead_letter`), as for the memory bus.
DeadLetters = Callable[[Sequence[RagTrace | Feedback], Exception], Awaitable[None]]


def client_settings(config: KafkaConfig) -> dict[str, Any]:
    """Connection and security settings shared by producer, consumer and admin client (every client
    is made with them, so this is also where kafka-python's logs are quieted: `quiet_client_logs`)."""
    quiet_client_logs()
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
            sasl_plain_password=config.sasl_password.get_secret_value() if config.sasl_password else None,
        )
    if config.security_protocol in ("SSL", "SASL_SSL"):
        settings["ssl_check_hostname"] = config.ssl_check_hostname
    if config.ssl_cafile is not None:
        settings["ssl_cafile"] = config.ssl_cafile
    if config.ssl_certfile is not None:  # mutual TLS: the client's certificate (Strimzi tls users)
        settings["ssl_certfile"] = config.ssl_certfile
        settings["ssl_keyfile"] = config.ssl_keyfile
        settings["ssl_password"] = config.ssl_password.get_secret_value() if config.ssl_password else None
    return settings


def ensure_topics(config: KafkaConfig) -> None:
    """Create the spans, traces and feedback topics when missing (a no-op for topics that exist)."""
    admin = KafkaAdminClient(client_id=f"{config.client_id}-admin", **client_settings(config))
    try:
        for topic in (config.spans_topic, config.traces_topic, config.feedback_topic):
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(
                    [NewTopic(topic, config.partitions, config.replication_factor)],
                    timeout_ms=int(config.request_timeout_s * 1000),
                )
    finally:
        admin.close()


@dataclass(frozen=True, slots=True)
class OutRecord:
    """One record to publish: topic, key (the trace id), value and headers."""

    topic: str
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()


class _Publish:
    """The records of one `publish` call: `done` resolves once the broker acknowledged them all."""

    __slots__ = ("done", "remaining", "withdrawn")

    def __init__(self, records: int) -> None:
        self.remaining = records
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.withdrawn = False


@dataclass(slots=True)
class _Entry:
    record: OutRecord
    owner: _Publish


class _OneThread:
    """Runs blocking client calls on one dedicated thread: kafka-python clients are not thread-safe."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def __call__(self, fn: Callable[..., R], *args: Any) -> R:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False)


class KafkaBus:
    """Producer side of distributed mode: `publish` returns once the broker acknowledged (acks=all).

    Implements `TraceConsumer` and `FeedbackConsumer` for ingest's JSON API;
    see the module docstring for what is guaranteed."""

    def __init__(self, config: KafkaConfig, metrics: Metrics, *, retry_after_s: float = 1.0) -> None:
        self.config = config
        self.metrics = metrics
        self.retry_after_s = retry_after_s
        self._buffer: deque[_Entry] = deque()
        self._inflight = 0
        self._sending_since: float | None = None
        self._failing = False
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._producer: KafkaProducer | None = None
        self._topics_ready = not config.create_topics
        self._thread = _OneThread("kafka-producer")
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
        return len(self._buffer) + self._inflight

    @property
    def capacity(self) -> int:
        """Records held before ingest answers 503: `kafka.buffer_records`."""
        return self.config.buffer_records

    @property
    def available(self) -> bool:
        """The broker takes records: no failed send since the last success (or probe), and no send
        waiting longer than `publish_timeout_s` for its acknowledgement."""
        if self._failing:
            return False
        since = self._sending_since
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
        self._buffer.extend(_Entry(record, owner) for record in records)
        self._idle.clear()
        self._ready.set()
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
        owner.withdrawn = True
        if any(entry.owner is owner for entry in self._buffer):
            self._buffer = deque(entry for entry in self._buffer if entry.owner is not owner)

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
            max_request_size=c.max_record_bytes + 64 * 1024,  # the record plus its batch framing
            **client_settings(c),
        )

    def _send(self, records: list[OutRecord]) -> list[bool]:
        """Send `records` and wait for their acknowledgements; True where the broker acknowledged."""
        if self._producer is None:
            self._producer = self._open_producer()
        producer = self._producer
        futures: list[Any] = []
        for record in records:
            try:
                futures.append(
                    producer.send(
                        record.topic, key=record.key, value=record.value, headers=list(record.headers) or None
                    )
                )
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

    def _discard_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            self.metrics.kafka_producer_rebuilds.inc()
            with contextlib.suppress(Exception):
                producer.close(timeout=0)  # aborts what it still holds: those records are ours to resend

    def _probe(self) -> None:
        """Raises unless a new producer gets the spans topic's metadata from the broker."""
        self._discard_producer()
        self._producer = self._open_producer()
        self._producer.partitions_for(self.config.spans_topic)

    async def _run(self) -> None:
        backoff = _MIN_BACKOFF_S
        while True:
            if not self._buffer:
                self._idle.set()
                if not self._failing:
                    self._ready.clear()
                    await self._ready.wait()
                    continue
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
            chunk = [self._buffer.popleft() for _ in range(min(_SEND_CHUNK, len(self._buffer)))]
            self._inflight = len(chunk)
            self._sending_since = time.monotonic()
            raised = False
            try:
                acked = await self._thread(self._send, [entry.record for entry in chunk])
            except (KafkaError, OSError) as exc:
                # no producer (broker unreachable at bootstrap) or topics could not be created
                raised = True
                acked = [False] * len(chunk)
                self._outage.failed(f"{exc}; {self.depth} records waiting")
            finally:
                self._inflight = 0
                self._sending_since = None
            failed: list[_Entry] = []
            for entry, ok in zip(chunk, acked, strict=True):
                topic = entry.record.topic
                if ok:
                    self.metrics.kafka_produced.labels(topic=topic).inc()
                    owner = entry.owner
                    owner.remaining -= 1
                    if owner.remaining == 0 and not owner.done.done():
                        owner.done.set_result(None)
                    continue
                self.metrics.kafka_produce_errors.labels(topic=topic).inc()
                if not entry.owner.withdrawn:
                    failed.append(entry)
            if len(failed) or not all(acked):
                if not raised:  # the send returned, with records the broker did not acknowledge in time
                    self._outage.failed(f"{acked.count(False)} of {len(acked)} records not acknowledged")
                self._failing = True
                await self._thread(self._discard_producer)
                # failed records go back to the head, in their order, to be sent first next time
                self._buffer.extendleft(reversed(failed))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
            else:
                self._failing = False
                backoff = _MIN_BACKOFF_S
                self._outage.recovered()

    @property
    def failure(self) -> str | None:
        """Why the send loop ended when it was not stopped (liveness); None while it runs or before
        start."""
        task = self._task
        return None if task is None or not task.done() else KafkaReceiver.failure_of(task)

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
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await self._thread(producer.close, self.config.request_timeout_s)
        self._thread.shutdown()


class SpanIntake(Protocol):
    """Where a `KafkaReceiver` hands the spans topic's records: decoded, then assembled."""

    def decode(self, value: bytes, headers: Sequence[tuple[str, bytes]]) -> Sequence[AnySpan]:
        """The spans of one record; raises `DecodeError` for a record that is not one."""

    async def consume_spans(self, batch: Sequence[AnySpan]) -> None:
        """The span assembler's input."""


class _Rebalances(ConsumerRebalanceListener):  # type: ignore[misc]
    """Called on the consumer's thread inside `poll()`: keeps kept spans partitions where this
    worker was (its open traces are still in memory) and notes the lost ones for the loop."""

    def __init__(self, receiver: KafkaReceiver) -> None:
        self.receiver = receiver
        self.before: set[TopicPartition] = set()
        self.lost: list[TopicPartition] = []

    def on_partitions_revoked(self, revoked: Any) -> None:
        self.before = set(revoked)

    def on_partitions_assigned(self, assigned: Any) -> None:
        now = set(assigned)
        self.lost.extend(self.before - now)
        consumer = self.receiver._consumer
        positions = self.receiver._positions
        for tp in self.before & now:
            if tp in positions and consumer is not None:
                consumer.seek(tp, positions[tp])
        self.before = set()


class KafkaReceiver:
    """Receiver of distributed mode: a consumer-group member that hands each batch to the sinks.

    Traces and feedback go to `sinks`; spans, when `spans` is given, to its
    assembler, with `offsets` deciding what may be committed. See the module
    docstring for commits, retries and rebalances."""

    def __init__(
        self,
        config: KafkaConfig,
        sinks: RecordSink,
        metrics: Metrics,
        *,
        group: str | None = None,
        spans: SpanIntake | None = None,
        offsets: SpanOffsets | None = None,
        dead_letters: DeadLetters | None = None,
    ) -> None:
        if (spans is None) != (offsets is None):
            raise ValueError("spans and offsets come together")
        self.config = config
        self.sinks = sinks
        self.metrics = metrics
        # where a record the sinks refuse for good goes (after the batch was split down to it)
        self.dead_letters = dead_letters
        self.group = group or config.sinks_group
        self.spans = spans
        self.offsets = offsets
        self._consumer: KafkaConsumer | None = None
        self._listener = _Rebalances(self)
        # spans partitions: the next offset to read, as this worker read them (after a rebalance
        # that kept a partition, reading goes on from here rather than from the committed offset)
        self._positions: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._thread = _OneThread("kafka-consumer")
        self._lag = LagExporter(metrics.kafka_consumer_lag, self.group)
        self._outage = OutageLog(log, f"Kafka (sinks worker, group {self.group})")
        self._task: asyncio.Task[None] | None = None
        # when the consume loop's current turn (poll, hand-on, commit) began: a turn that never ends
        # (a store call hanging on a frozen server) leaves the loop "running" but doing nothing
        self._turn_began: float | None = None
        self.assigned: frozenset[tuple[str, int]] = frozenset()
        self.batches = 0
        if offsets is not None:
            metrics.state.add(
                "ragmon_kafka_spans_held_records",
                "records of the spans topic a sinks worker holds uncommitted: their traces are open, "
                "being built or being stored",
                lambda: offsets.held,
            )

    @property
    def topics(self) -> list[str]:
        c = self.config
        return [c.traces_topic, c.feedback_topic] + ([c.spans_topic] if self.spans is not None else [])

    def _open(self) -> KafkaConsumer:
        c = self.config
        settings = client_settings(c)
        # a request must be allowed to outlive a group rebalance, which waits up to the session timeout
        settings["request_timeout_ms"] = int(max(c.request_timeout_s, c.session_timeout_s + 5) * 1000)
        consumer = KafkaConsumer(
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
        consumer.subscribe(topics=self.topics, listener=self._listener)
        return consumer

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
        if self._consumer is None or not offsets:
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

    async def _deliver_in_parts(
        self, traces: list[RagTrace], feedback: list[Feedback], error: Exception
    ) -> int:
        """Deliver a refused batch in parts (`bisect.py`); returns the records the sinks took."""
        taken = 0

        def delivered(n: int) -> None:
            nonlocal taken
            taken += n

        async def dead_letter(records: Sequence[Any], refused: Exception) -> None:
            if self.dead_letters is not None:
                await self.dead_letters(records, refused)
            else:
                log.error(
                    "sinks refused %d records for good and no dead-letter store is set: %s",
                    len(records),
                    refused,
                )
            self.metrics.dead_letters.labels(
                kind="trace" if isinstance(records[0], RagTrace) else "feedback"
            ).inc(len(records))

        if traces:
            await deliver_in_parts(traces, error, self.sinks.consume_traces, dead_letter, delivered)
        if feedback:
            await deliver_in_parts(feedback, error, self.sinks.consume_feedback, dead_letter, delivered)
        return taken

    def _disown_lost(self) -> None:
        lost, self._listener.lost = self._listener.lost, []
        if not lost or self.offsets is None:
            return
        for tp in lost:
            self._positions.pop(tp, None)
            self._committed.pop(tp, None)
        self.offsets.disown((tp.topic, tp.partition) for tp in lost)

    async def _take_spans(self, polled: dict[TopicPartition, list[Any]]) -> None:
        """Hand the spans records to the assembler, each held until its trace is stored."""
        intake, offsets = self.spans, self.offsets
        if intake is None or offsets is None:
            return
        batch: list[AnySpan] = []
        for tp, records in polled.items():
            partition = (tp.topic, tp.partition)
            for record in records:
                try:
                    spans = intake.decode(record.value, record.headers or ())
                except RagmonError:
                    self.metrics.kafka_bad_records.labels(topic=tp.topic).inc()
                    spans = []
                if spans:
                    offsets.hold((spans[0].tenant, spans[0].trace_id), partition, record.offset)
                    batch.extend(spans)
            self._positions[tp] = records[-1].offset + 1
            self.metrics.kafka_consumed.labels(group=self.group, topic=tp.topic).inc(len(records))
        if batch:
            await intake.consume_spans(batch)

    def _spans_commits(self) -> dict[TopicPartition, int]:
        """Spans partitions whose committable offset moved since the last commit."""
        if self.offsets is None:
            return {}
        moved: dict[TopicPartition, int] = {}
        for tp, position in self._positions.items():
            offset = self.offsets.committable((tp.topic, tp.partition), position)
            if offset > self._committed.get(tp, -1):
                moved[tp] = offset
        return moved

    async def _commit_spans(self) -> None:
        moved = self._spans_commits()
        if not moved:
            return
        if await self._thread(self._commit, moved):
            self._committed.update(moved)

    async def _run(self) -> None:
        backoff = _MIN_BACKOFF_S
        spans_topic = self.config.spans_topic if self.spans is not None else None
        while True:
            self._turn_began = time.monotonic()
            try:
                polled = await self._thread(self._poll)
            except (KafkaError, OSError) as exc:
                self._outage.failed(exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
                continue
            self._outage.recovered()
            self._disown_lost()
            spans = {tp: records for tp, records in polled.items() if tp.topic == spans_topic and records}
            others = {tp: records for tp, records in polled.items() if tp.topic != spans_topic and records}
            # spans first and never rewound: once held, a record is the assembler's
            await self._take_spans(spans)
            if not others:
                await self._commit_spans()
                await self._thread(self._export_lag)
                continue
            first = {tp: records[0].offset for tp, records in others.items()}
            nxt = {tp: records[-1].offset + 1 for tp, records in others.items()}
            traces, feedback = self._decode(others)
            try:
                await self._deliver(traces, feedback)
            except RetryableError as exc:
                self.metrics.sink_failures.labels(sink="kafka", kind="retryable").inc()
                log.warning("sinks refused a batch (%s); rewinding, retry in %.1fs", exc, backoff)
                await self._thread(self._rewind, first)
                await self._commit_spans()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
                continue
            except Exception as exc:
                accepted = False
                # one bad record must not cost the others: deliver the batch in parts, dead-letter
                # the records still refused alone (a RetryableError on the way rewinds, as above)
                self.metrics.sink_failures.labels(sink="kafka", kind="permanent").inc()
                log.warning(
                    "sinks refused a batch of %d records (%s); delivering it in parts", len(first), exc
                )
                try:
                    accepted = await self._deliver_in_parts(traces, feedback, exc) > 0
                except RetryableError as retry:
                    self.metrics.sink_failures.labels(sink="kafka", kind="retryable").inc()
                    log.warning("sinks refused a part (%s); rewinding, retry in %.1fs", retry, backoff)
                    await self._thread(self._rewind, first)
                    await self._commit_spans()
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, _MAX_BACKOFF_S)
                    continue
            else:
                accepted = True
            backoff = _MIN_BACKOFF_S
            moved = self._spans_commits()
            commits: dict[TopicPartition, int] = {**nxt, **moved}
            if await self._thread(self._commit, commits):
                self._committed.update(moved)
                for tp, records in others.items():
                    self.metrics.kafka_consumed.labels(group=self.group, topic=tp.topic).inc(len(records))
            self.batches += 1
            if accepted:  # a batch that was all poison is no success
                self.metrics.sink_last_success.labels(sink="kafka").set(time.time())
            await self._thread(self._export_lag)

    @property
    def running(self) -> bool:
        """The consume loop is alive (a consumer with no partitions assigned still counts)."""
        return self._task is not None and not self._task.done()

    def turn_age_s(self) -> float:
        """Seconds the consume loop's current turn has run; 0 while the loop does not run. A turn
        polls, hands the batch on and commits, waiting at most its retry backoff: one that lasts
        several `kafka.max_poll_interval_s` is stuck, and the group has given its partitions away."""
        began = self._turn_began
        return time.monotonic() - began if began is not None and self.running else 0.0

    @property
    def failure(self) -> str | None:
        """Why the consume loop ended when it was not stopped (the exception); None while it runs."""
        task = self._task
        return None if task is None or not task.done() else self.failure_of(task)

    @staticmethod
    def failure_of(task: asyncio.Task[None]) -> str:
        if task.cancelled():
            return "cancelled"
        exc = task.exception()
        return f"{type(exc).__name__}: {exc}" if exc is not None else "returned"

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"kafka-receiver-{self.group}")

    async def stop(self) -> None:
        """Stop consuming, commit what is done, and leave the group (a batch not yet committed,
        and every trace still open here, is read again by the partitions' next owner). Safe twice,
        and after the loop ended on an error (logged here, not raised: shutdown goes on)."""
        if self._task is not None:
            task, self._task = self._task, None
            if task.done() and not task.cancelled() and task.exception() is not None:
                log.error("the Kafka consume loop had ended: %s", self.failure_of(task))
            else:
                await cancel_task(task)
        if self._consumer is not None:
            with contextlib.suppress(KafkaError, OSError):
                await self._commit_spans()
            consumer, self._consumer = self._consumer, None
            await self._thread(consumer.close, False, int(self.config.request_timeout_s * 1000))
        self._lag.update({})
        self._thread.shutdown()
