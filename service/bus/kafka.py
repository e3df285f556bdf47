"""Distributed mode's receiver: `KafkaReceiver` feeds what ingest published to the sinks.

What ingest publishes, to which topics and with which keys, and what its
acknowledgement means: `service.bus.kafka_bus` (`KafkaBus`). Connection
settings shared by every client: `service.bus.kafka_client`.

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
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata
from pydantic import ValidationError

from service.bus.bisect import deliver_in_parts
from service.bus.kafka_client import ClientThread, client_settings, ensure_topics, task_failure
from service.bus.lag import LagExporter, partition_lags
from service.bus.outage_log import OutageLog
from service.bus.span_offsets import SpanOffsets
from service.config import KafkaConfig
from service.consumer import FeedbackConsumer, TraceConsumer
from service.conventions.spans import AnySpan
from service.errors import RagmonError, RetryableError
from service.lifecycle import cancel_task
from service.metrics import Metrics
from service.model import Feedback, RagTrace

__all__ = ["KafkaReceiver", "RecordSink", "SpanIntake"]

log = logging.getLogger(__name__)

_MIN_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 5.0


class RecordSink(TraceConsumer, FeedbackConsumer, Protocol):
    """What a `KafkaReceiver` hands batches to: the same sinks the memory bus feeds."""


# Where records refused for good are kept (the store sink's `dead_letter`), as for the memory bus.
DeadLetters = Callable[[Sequence[RagTrace | Feedback], Exception], Awaitable[None]]


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
        self._thread = ClientThread("kafka-consumer")
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
        return None if task is None or not task.done() else task_failure(task)

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
                log.error("the Kafka consume loop had ended: %s", task_failure(task))
            else:
                await cancel_task(task)
        if self._consumer is not None:
            with contextlib.suppress(KafkaError, OSError):
                await self._commit_spans()
            consumer, self._consumer = self._consumer, None
            await self._thread(consumer.close, False, int(self.config.request_timeout_s * 1000))
        self._lag.update({})
        self._thread.shutdown()
