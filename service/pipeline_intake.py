"""`PipelineIntake`: how work enters a `Pipeline`: the room checks and the `accept_*` methods the
receivers call (`IngestTarget`, ingest/target.py), the write-ahead log's replay, and a sinks
worker's spans read from the spans topic (`SpanIntake`).

`Pipeline` (pipeline.py) derives from it and builds what it hands work to. Kept apart from that
wiring: this is what a request's input goes through before the first stage takes it (a room
check, redaction of JSON-API records, the write-ahead log or the broker), the same whichever
stages follow.

Back-pressure: `accept_*` raise `QueueFull` (503 + Retry-After) while the
backlog (traces complete past their grace but not yet built, plus the bus) is at capacity;
nothing is taken that cannot be delivered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from pydantic import TypeAdapter

from service.assemble import SpanAssembler
from service.bus.memory import MemoryBus
from service.config import RagmonConfig
from service.consumer import TraceConsumer
from service.conventions.spans import AnySpan, LogEvent
from service.errors import QueueFull
from service.ingest import span_records
from service.ingest.decoded import DecodedBatch
from service.ingest.durable import DurableAcks
from service.ingest.pool import IngestPool
from service.ingest.wal import LoggedRequest
from service.metrics import Metrics
from service.model import Feedback, RagTrace
from service.redaction import RedactingFilter, Redactor
from service.regeneration import ReaskDetector
from service.stages import feedback_keys, trace_keys

if TYPE_CHECKING:
    from service.bus.kafka_bus import KafkaBus

__all__ = ["PipelineIntake"]

_R = TypeVar("_R")


_TRACES = TypeAdapter(list[RagTrace])
_FEEDBACK = TypeAdapter(list[Feedback])


class PipelineIntake:
    """The `accept_*` side of `Pipeline`: room checks, the write-ahead log or the broker, replay.

    `Pipeline.__init__` sets what it reads: `config`, `metrics`, the `assembler` and `bus` (and
    `kafka`, in distributed mode), `durable` (embedded mode's write-ahead log), `redactor`, `reask`
    (where JSON-API records go) and `ingest_pool` (decoding a replayed request).
    """

    config: RagmonConfig
    metrics: Metrics
    assembler: SpanAssembler
    bus: MemoryBus | KafkaBus
    kafka: KafkaBus | None
    durable: DurableAcks | None
    redactor: Redactor | None
    reask: ReaskDetector
    ingest_pool: IngestPool

    @property
    def backlog(self) -> int:
        """Records accepted and not yet delivered: waiting to be built, then in the bus."""
        return self.assembler.backlog + self.bus.depth

    def has_room(self) -> bool:
        return self.backlog < self.bus.capacity

    def check_room(self) -> None:
        """Refuse new work while the backlog is at capacity (the receiver counts the refusal)."""
        if self.kafka is not None and not self.kafka.available:
            raise QueueFull(
                "Kafka is unavailable to ingest; retry later", retry_after_s=self.config.bus.retry_after_s
            )
        if not self.has_room():
            raise QueueFull(
                f"ragmon is behind ({self.assembler.backlog} traces to build, {self.bus.depth} records "
                "queued); retry later",
                retry_after_s=self.config.bus.retry_after_s,
            )
        if self.assembler.full:
            raise QueueFull(
                f"the open-trace buffer is at its bound ({self.assembler.open_spans} spans, "
                f"{self.assembler.open_bytes} bytes of {self.assembler.open_traces} traces); retry later",
                retry_after_s=self.config.bus.retry_after_s,
            )

    async def accept_spans(
        self, spans: Sequence[AnySpan], receiver: str, logged: LoggedRequest | None = None
    ) -> None:
        """Take a request's spans; with `logged` (the request as received) they are in the write-ahead
        log before this returns (embedded), or acknowledged by the brokers (Kafka): what makes the
        receiver's 200 a promise."""
        if self.kafka is not None:
            await self._publish(self.kafka, spans)
            self.metrics.spans_received.labels(receiver=receiver).inc(len(spans))
            return
        self.check_room()
        if self.durable is not None and logged is not None and spans:
            await self.durable.log(logged, trace_keys(spans))
        await self.assembler.consume_spans(spans)
        self.metrics.spans_received.labels(receiver=receiver).inc(len(spans))

    async def accept_decoded(
        self, decoded: DecodedBatch, receiver: str, logged: LoggedRequest | None = None
    ) -> None:
        """Take a decoded request: its spans-topic records when the decoder encoded them
        (distributed mode, `IngestPool.max_record_bytes`), else its spans (`accept_spans`)."""
        if not isinstance(decoded, span_records.RecordBatch):
            await self.accept_spans(decoded.spans, receiver, logged)
            return
        assert self.kafka is not None, "records are encoded only for the broker"
        await self._publish_records(self.kafka, decoded.records)
        self.metrics.spans_received.labels(receiver=receiver).inc(decoded.record_spans)

    async def accept_log_events(
        self, events: Sequence[LogEvent], receiver: str, logged: LoggedRequest | None = None
    ) -> None:
        """GenAI events sent as log records: buffered with the spans of their trace, joined at build."""
        if self.kafka is not None:
            await self._publish(self.kafka, events)
            self.metrics.log_events_received.labels(receiver=receiver).inc(len(events))
            return
        self.check_room()
        if self.durable is not None and logged is not None and events:
            await self.durable.log(logged, trace_keys(events))
        await self.assembler.consume_spans(events)
        self.metrics.log_events_received.labels(receiver=receiver).inc(len(events))

    def _redacted(self, next: TraceConsumer) -> TraceConsumer:
        """`next`, behind the redaction step when redaction is on."""
        return RedactingFilter(self.redactor, next) if self.redactor is not None else next

    def redacted(self, record: _R) -> _R:
        """`record` as ragmon may keep it: redacted field by field (`redaction.FIELDS`) when redaction
        is on, else unchanged. For what arrives outside the trace path: reviews, notes, golden rows."""
        return record if self.redactor is None else self.redactor.record(record)

    async def accept_traces(self, traces: Sequence[RagTrace]) -> None:
        self.check_room()
        if self.redactor is not None:  # before the log too: nothing unredacted is kept
            traces = self.redactor.traces(traces)
        if self.durable is not None and traces:
            body = _TRACES.dump_json(list(traces))
            await self.durable.log(LoggedRequest("traces", "", body, receiver="json"), trace_keys(traces))
        await self.reask.consume_traces(traces)

    async def accept_feedback(self, events: Sequence[Feedback]) -> None:
        self.check_room()
        if self.redactor is not None:
            events = self.redactor.feedback(events)
        if self.durable is not None and events:
            body = _FEEDBACK.dump_json(list(events))
            await self.durable.log(
                LoggedRequest("feedback", "", body, receiver="json"), feedback_keys(events)
            )
        await self.reask.consume_feedback(events)

    async def _replay(self, record: LoggedRequest) -> None:
        """Ingest a logged record again (at start, before the receivers open): decoded as when it
        was first accepted, held at its old seq, and never logged a second time."""
        assert self.durable is not None
        # the log may hold more than the bus (or the open-trace buffer) takes at once
        while not self.has_room() or self.assembler.full:
            await asyncio.sleep(0.05)
        limit = self.config.server.max_body_bytes
        is_json = record.media_type == "application/json"
        items: Sequence[AnySpan]
        if record.kind in ("otlp_traces", "otlp_logs"):
            decode = self.ingest_pool.decode if record.kind == "otlp_traces" else self.ingest_pool.decode_logs
            decoded = await decode(
                record.body, json_body=is_json, encoding=record.encoding, tenant=record.tenant, limit=limit
            )
            items = decoded.spans
            self.durable.hold(trace_keys(items), record.seq)
            await self.assembler.consume_spans(items)
        elif record.kind == "traces":
            traces = _TRACES.validate_json(record.body)
            self.durable.hold(trace_keys(traces), record.seq)
            await self.reask.consume_traces(traces)
        else:
            events = _FEEDBACK.validate_json(record.body)
            self.durable.hold(feedback_keys(events), record.seq)
            await self.reask.consume_feedback(events)

    def decode(self, value: bytes, headers: Sequence[tuple[str, bytes]]) -> Sequence[AnySpan]:
        """A spans-topic record's spans (the `SpanIntake` of a sinks worker's `KafkaReceiver`)."""
        return span_records.decode(value, headers)

    async def consume_spans(self, batch: Sequence[AnySpan]) -> None:
        """A sinks worker's spans, read from the spans topic, into its assembler (`SpanIntake`)."""
        await self.assembler.consume_spans(batch)

    async def _publish(self, kafka: KafkaBus, spans: Sequence[AnySpan]) -> None:
        """Ingest in distributed mode: returns once the broker acknowledged `spans` (acks=all)."""
        await self._publish_records(kafka, span_records.encode(spans, self.config.kafka.max_record_bytes))

    async def _publish_records(self, kafka: KafkaBus, records: Sequence[span_records.SpanRecord]) -> None:
        """Returns once the broker acknowledged `records` of the spans topic (acks=all)."""
        from service.bus.kafka_bus import OutRecord

        self.check_room()
        topic = self.config.kafka.spans_topic
        await kafka.publish([OutRecord(topic, r.key, r.value, r.headers) for r in records])
