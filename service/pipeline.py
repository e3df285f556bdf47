"""`Pipeline`: the one place that knows the topology and wires receivers → processors → sinks.

    receivers ──spans──▶ SpanAssembler ──▶ RequestFilter ──▶ ReaskDetector ──▶ bus ──▶ StoreSink (dedup)
                           ▲ each flush merged    └─▶ non-requests: counted (stored with keep_non_requests)
                         SpanArchive (late spans complete a stored trace: a later revision replaces it)
    JSON API ──traces────────────────────────────────────────▲                  │ new, updated, feedback
    feedback ──────────────────────────────────────────────────────────▶ bus ───┴─▶ Fanout ─┬─ MetricsSink
                                                                                           └─ JudgeQueueSink
    judge queue ──▶ JudgeWorker(s) ──▶ judgments + flags;  FaithfulnessEstimator ──▶ gauges
    blind review labels + judgments ──▶ HumanCorrection ──▶ corrected gauges, judge-human agreement

`start()` starts the sinks first, then the bus, then the assembler (receivers
are started by the API once this returns); `stop()` runs the other way round
and flushes every open trace, so each stage drains into a live consumer.

Back-pressure: `accept_*` raise `QueueFull` (503 + Retry-After) while the
backlog (traces complete past their grace but not yet built, plus the bus) is at capacity;
nothing is taken that cannot be delivered.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import TypeAdapter

from sampler import FairAdmission, FairShares, SqlJudgeQueue, TraceSampler, create_tables
from service.assemble import SpanAssembler
from service.bus.leader import exclusive
from service.bus.memory import MemoryBus
from service.config import RagmonConfig
from service.consumer import TraceConsumer
from service.conventions.pricing import PriceTable
from service.conventions.spans import AnySpan, LogEvent
from service.drift.monitor import DriftScheduler
from service.drift.store import DriftStore
from service.drift.window_sink import DriftWindowSink
from service.errors import QueueFull, StoreUnavailable
from service.ingest import span_records
from service.ingest.durable import DurableAcks
from service.ingest.pool import IngestPool
from service.ingest.span_codec import OtlpSpanCodec
from service.ingest.span_redaction import SpanRedaction
from service.ingest.wal import LoggedRequest
from service.judge.build import build_judge
from service.judge.judging import FaithfulnessEstimator, JudgeQueueSink, JudgeWorker
from service.judge.judgment import Judgment
from service.judge.shared_budget import SharedJudgeBudget, create_budget_tables, judge_budget
from service.judge.store import JudgmentStore
from service.metrics import Metrics
from service.model import Feedback, RagTrace
from service.non_requests import RequestFilter
from service.outbox import OutboxSweep
from service.phoenix.annotations import PhoenixAnnotator
from service.phoenix.forward import PhoenixForwarder
from service.probes.gauges import restore_probe_gauges
from service.probes.store import GoldenStore
from service.redaction import RedactingFilter, Redactor, redaction_key
from service.regeneration import ReaskDetector
from service.review.correction import HumanCorrection
from service.review.gauges import ReviewGauges
from service.review.intake import ReviewIntake
from service.review.records import ReviewRecord
from service.review.store import ReviewStore
from service.span_expiry import SpanExpiry
from service.stages import ArchiveKeeper, Delivered, Fanout, MetricsSink, feedback_keys, trace_keys
from service.store.span_archive import SpanArchive
from service.store.store_sink import StoreSink
from service.store.trace_store import Store

if TYPE_CHECKING:
    from service.bus.backlog import BacklogWatcher
    from service.bus.kafka_bus import KafkaBus
    from service.bus.span_offsets import SpanOffsets

log = logging.getLogger(__name__)

_RETENTION_EVERY_S = 3600.0
_STORE_SETUP_MAX_DELAY_S = 30.0
_R = TypeVar("_R")


_TRACES = TypeAdapter(list[RagTrace])
_FEEDBACK = TypeAdapter(list[Feedback])


class Pipeline:
    """Everything between the receivers and the sinks of one ragmon process."""

    def __init__(self, config: RagmonConfig, metrics: Metrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or Metrics(config.metrics, tenants=config.auth.tenants)
        self.prices = PriceTable.default().with_overrides(config.pricing.overrides)
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self.store = Store(
            config.store_url,
            connect_timeout_s=config.store.timeout_s,
            statement_timeout_s=config.store.timeout_s,
        )
        self.judgments = JudgmentStore(self.store.engine)
        self.golden = GoldenStore(self.store.engine)
        self.reviews = ReviewStore(self.store.engine)
        self.review_intake = ReviewIntake(
            config.review,
            config.judging.flag_threshold,
            self.reviews,
            redact=lambda entry: self.redacted(entry),
        )
        self.review_gauges = ReviewGauges(config.review, self.reviews, self.metrics)
        self.judge_queue = SqlJudgeQueue(self.store.engine, max_attempts=config.judging.max_attempts)
        self.judge = build_judge(config.judge, cost_fn=self.prices.cost)
        self.phoenix_forward = PhoenixForwarder(config.phoenix, self.metrics)
        self.phoenix_annotations = PhoenixAnnotator(config.phoenix, self.metrics)
        # one budget for the deployment, in the database (service/judge/shared_budget.py), asked as
        # the judge workers claim work, in fair shares of the tenants waiting (sampler/fair.py)
        self.budget = judge_budget(config.budget, self.store.engine)
        self.admission = FairAdmission(
            FairShares(config.budget.tenant_weights, config.budget.default_tenant_weight),
            self.budget,
            config.judging.estimated_cost_usd,
        )
        self.sampler = TraceSampler(config.sampler, judge_version=self.judge.version)
        # the sinks that write (idempotently, by key) first and the in-memory counters after them: a
        # fan-out that failed half-way and is run again from the outbox counts nothing twice
        downstream: list[Any] = [self.review_intake]
        if config.judging.enabled:
            downstream.append(JudgeQueueSink(self.sampler, self.judge_queue, self.store, self.metrics))
        downstream.append(MetricsSink(self.metrics, self.store))
        drift = config.drift
        self.drift_store = DriftStore(
            self.store.engine, bucket_s=drift.bucket_s, bucket_capacity=drift.bucket_capacity
        )
        self.drift_sink = DriftWindowSink(drift, self.metrics) if drift.enabled else None
        if self.drift_sink is not None:
            downstream.append(self.drift_sink)
        self.drift = DriftScheduler(drift, self.drift_store, self.metrics, self.drift_sink)
        self.judge_workers = [
            JudgeWorker(
                config.judging,
                self.judge,
                self.judge_queue,
                self.store,
                self.judgments,
                self.metrics,
                worker_id=f"{socket.gethostname()}-{os.getpid()}-{n}",
                after_judgment=self._after_judgment,
                admission=self.admission,
                max_deferral_s=config.budget.max_deferral_s,
                budget_retry_s=config.budget.lease_retry_s,
            )
            for n in range(config.judging.workers if config.judging.enabled else 0)
        ]
        self.estimator = FaithfulnessEstimator(config.judging, self.judgments, self.metrics)
        self.correction = HumanCorrection(config.judging, config.review, self.judgments, self.metrics)
        fanout = Fanout(downstream)
        self.sinks = StoreSink(self.store, new_traces=fanout, new_feedback=fanout, updated_traces=fanout)
        self.outbox_sweep = OutboxSweep(
            self.store,
            fanout,
            self.metrics,
            feedback_wait_s=config.store.feedback_wait_s,
            updates=self.sinks.fan_out_updates,
        )
        self.distributed = config.bus.kind == "kafka"
        # embedded mode's durable acknowledgement; Kafka mode's is the broker's (acks=all)
        self.durable = (
            DurableAcks(
                config.wal,
                config.wal.dir or config.data_dir / "wal",
                self.metrics,
                config.bus.retry_after_s,
                store_sync=self.store.sync_to_disk,
            )
            if not self.distributed and config.wal.ack == "durable"
            else None
        )
        self.bus: MemoryBus | KafkaBus
        self.kafka: KafkaBus | None = None
        self.kafka_backlog: BacklogWatcher | None = None
        self.span_offsets: SpanOffsets | None = None
        if self.distributed:
            # kafka-python comes with the `kafka` extra
            from service.bus.backlog import BacklogWatcher
            from service.bus.kafka_bus import KafkaBus

            # ingest publishes; `ragmon worker` runs the sinks, judge workers and drift (service/worker.py)
            self.bus = self.kafka = KafkaBus(
                config.kafka, self.metrics, retry_after_s=config.bus.retry_after_s
            )
            # the sinks group's backlog, from the broker: started by ingest (start()) and by sinks
            # workers, so someone reports it while a worker is dead (service/bus/backlog.py)
            self.kafka_backlog = BacklogWatcher(config.kafka, self.metrics)
        else:
            delivered = Delivered(self.sinks, self.durable) if self.durable is not None else self.sinks
            self.bus = MemoryBus(
                config.bus,
                traces_to=delivered,
                feedback_to=delivered,
                metrics=self.metrics,
                dead_letters=delivered.dead_letter,
            )
        self.reask = ReaskDetector(config.regeneration, next=self.bus)
        keep = self.store if config.store.keep_non_requests else None
        key = redaction_key(config) if config.redaction.enabled else None
        self.redactor = Redactor(config.redaction, self.metrics, key) if key is not None else None
        # redacted first: what the request filter stores and counts of other work is kept as well
        self.requests = self._redacted(
            RequestFilter(
                self.reask,
                self.metrics,
                keep,
                on_dropped=self.durable.done if self.durable is not None else None,
            )
        )
        # decodes OTLP bodies (for the receivers) and builds traces (for the assembler); with redaction
        # on, the spans and events it decodes are redacted there, before anything keeps them
        self.ingest_pool = IngestPool(
            config.server.ingest_processes,
            self.prices,
            self.metrics,
            redaction=SpanRedaction(config.redaction, key) if key is not None else None,
        )
        # the spans of flushed traces, so that late ones complete them (service/store/span_archive.py)
        self.span_archive = SpanArchive(self.store, OtlpSpanCodec(), config.assembler.late_window_s)
        self.span_expiry = SpanExpiry(
            self.span_archive,
            self.store,
            self.metrics,
            every_s=min(60.0, config.assembler.late_window_s / 10),
        )
        self.assembler = SpanAssembler(
            config.assembler,
            next=self.requests,
            build=self.ingest_pool.build_traces,
            metrics=self.metrics,
            ledger=self.durable,
            keeper=ArchiveKeeper(self.span_archive),
        )
        if self.durable is not None:
            # a trace open for long is logged again, so the log's older segments can go
            self.durable.open_items = self.assembler.open_items  # type: ignore[assignment]
        if self.distributed:
            self._assemble_in_workers(keep)
        self._retention_task: asyncio.Task[None] | None = None
        self._store_setup_task: asyncio.Task[None] | None = None
        self.started = False
        state = self.metrics.state
        state.add(
            "ragmon_open_traces",
            "traces being assembled (spans buffered)",
            lambda: self.assembler.open_traces,
        )
        state.add(
            "ragmon_open_trace_spans", "spans in the open-trace buffer", lambda: self.assembler.open_spans
        )
        state.add(
            "ragmon_open_trace_bytes",
            "estimated bytes in the open-trace buffer",
            lambda: self.assembler.open_bytes,
        )
        state.add(
            "ragmon_open_trace_buffer_fill_ratio",
            "open-trace buffer use (0-1) of its span or byte bound",
            lambda: self.assembler.fill_ratio,
        )
        state.add(
            "ragmon_ingest_processes",
            "worker processes per role (decoder, builder) running for ingest (0: threads of the server)",
            lambda: self.ingest_pool.running,
        )
        state.add("ragmon_bus_queue_depth", "records waiting in the bus", lambda: self.bus.depth)
        state.add(
            "ragmon_build_backlog_traces",
            "traces ingest is behind on: complete and past their grace period but still buffered, "
            "or waiting to be built",
            lambda: self.assembler.backlog,
        )
        state.add(
            "ragmon_bus_capacity",
            "records waiting to be built or in the bus before ingest answers 503",
            lambda: self.bus.capacity,
        )
        state.add(
            "ragmon_judge_queue_depth",
            "judge queue items waiting for a worker or leased (deferred: ragmon_judge_queue_deferred)",
            lambda: self._queue_stats().depth,
        )
        state.add(
            "ragmon_judge_queue_oldest_age_seconds",
            "age of the oldest waiting or leased judge item",
            self._queue_oldest_age,
        )
        state.add(
            "ragmon_judge_queue_deferred",
            "judge queue items waiting for the judge budget (deferred; see ragmon_judge_deferred_total)",
            lambda: self._queue_stats().deferred,
        )
        state.add(
            "ragmon_judge_queue_failed",
            "judge queue items that ended failed (visible, never dropped)",
            lambda: self._queue_stats().failed,
        )
        self._stats_cache: tuple[float, Any] = (0.0, None)

    def _assemble_in_workers(self, keep: Store | None) -> None:
        """Distributed mode: ingest publishes spans to the spans topic, and the assembler runs in the
        sinks workers behind it (DESIGN.md, "Distributed assembly is keyed by trace id"): spans topic
        -> SpanAssembler -> SpanOffsets gate -> RequestFilter -> ReaskDetector -> StoreSink. The
        offsets of a trace's records are committed once it is stored (service/bus/span_offsets.py)."""
        from service.bus.span_offsets import SpanOffsets

        offsets = self.span_offsets = SpanOffsets(self.metrics)
        reask = ReaskDetector(self.config.regeneration, next=self.sinks)
        self.assembler = SpanAssembler(
            self.config.assembler,
            next=offsets.gate(self._redacted(RequestFilter(reask, self.metrics, keep))),
            build=self.ingest_pool.build_traces,
            metrics=self.metrics,
            ledger=offsets,
            keeper=ArchiveKeeper(self.span_archive),
            # a worker reading Kafka cannot refuse spans: a full buffer flushes its oldest traces early
            evict_when_full=True,
        )

    def decode(self, value: bytes, headers: Sequence[tuple[str, bytes]]) -> Sequence[AnySpan]:
        """A spans-topic record's spans (the `SpanIntake` of a sinks worker's `KafkaReceiver`)."""
        return span_records.decode(value, headers)

    async def consume_spans(self, batch: Sequence[AnySpan]) -> None:
        """A sinks worker's spans, read from the spans topic, into its assembler (`SpanIntake`)."""
        await self.assembler.consume_spans(batch)

    async def _publish(self, kafka: KafkaBus, spans: Sequence[AnySpan]) -> None:
        """Ingest in distributed mode: returns once the broker acknowledged `spans` (acks=all)."""
        from service.bus.kafka_bus import OutRecord

        self.check_room()
        topic = self.config.kafka.spans_topic
        records = span_records.encode(spans, self.config.kafka.max_record_bytes)
        await kafka.publish([OutRecord(topic, r.key, r.value, r.headers) for r in records])

    async def _after_judgment(self, judgment: Judgment) -> None:
        await self.review_intake.after_judgment(judgment)
        if not await self._blind_pending(judgment):
            await self.phoenix_annotations.after_judgment(judgment)

    async def _blind_pending(self, judgment: Judgment) -> bool:
        """A judgment of a blind review item not labelled yet: its Phoenix annotation waits for the label.

        A reviewer who can read the Phoenix project would otherwise see the judge's verdict first.
        """
        if not self.phoenix_annotations.enabled or judgment.outcome == "failed":
            return False
        if not self.review_intake.in_blind_sample(judgment.tenant, judgment.trace_id, judgment.app):
            return False
        item = await asyncio.to_thread(self.reviews.find, judgment.tenant, "blind", judgment.trace_id)
        return item is None or item.judge_hidden

    async def after_review(self, record: ReviewRecord) -> None:
        """A reviewer's label: counted, annotated in Phoenix, and a blind item's held judgment released."""
        if not record.replaced:  # a relabel replaces the review: counted once
            self.review_gauges.reviewed(record.queue, record.review.verdict)
        else:
            self.review_gauges.refresh()
        self.phoenix_annotations.reviewed(record)
        if record.queue == "blind" and self.phoenix_annotations.enabled:
            judged, _ = await asyncio.to_thread(self.judgments.for_trace, record.tenant, record.trace_id)
            if judged:
                self.phoenix_annotations.judged(Judgment.model_validate(judged[-1]))

    def _queue_stats(self) -> Any:
        # one query per scrape, not one per gauge
        at, stats = self._stats_cache
        if stats is None or time.monotonic() - at > 1.0:
            stats = self.judge_queue.stats()
            self._stats_cache = (time.monotonic(), stats)
        return stats

    def _queue_oldest_age(self) -> float:
        oldest = self._queue_stats().oldest_enqueued_at
        return 0.0 if oldest is None else max(0.0, (datetime.now(UTC) - oldest).total_seconds())

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

    def create_schema(self) -> None:
        """Create every table ragmon uses, if missing. Safe twice, and in several processes at once:
        replicas (ingest and workers) start together, and concurrent CREATE TABLEs of one table
        collide on PostgreSQL, so one process of the deployment creates at a time."""
        with exclusive(self.store.engine, "create-schema"):
            self.store.create_schema()
            self.judgments.create_schema()
            self.reviews.create_schema()
            create_tables(self.store.engine)
            create_budget_tables(self.store.engine)
            self.drift_store.create_schema()
            self.golden.create_schema()

    async def start(self) -> None:
        if self.kafka is not None:
            # Distributed ingest only publishes (its 200 is the brokers' acknowledgement), so it starts
            # and takes spans while PostgreSQL is down; the schema and the probe gauges it serves
            # follow when the store answers.
            self._store_setup_task = asyncio.create_task(
                self._set_up_store_when_reachable(), name="store-setup"
            )
        else:
            await self._set_up_store()
        if not self.distributed:
            if self.config.drift.enabled:
                await self.drift.start()
            for worker in self.judge_workers:
                await worker.start()
            await self.estimator.start()
            await self.correction.start()
        await self.phoenix_annotations.start()
        await self.phoenix_forward.start()
        await self.bus.start()
        if self.kafka_backlog is not None:
            await self.kafka_backlog.start()
        await self.assembler.start()
        await self.ingest_pool.start()
        if self.durable is not None:
            await self.durable.start(self._replay)
        if not self.distributed:  # in distributed mode the sinks, and so the sweeps, run in `ragmon worker`
            await self.outbox_sweep.start()
            await self.span_expiry.start()
        self._retention_task = asyncio.create_task(self._retention(), name="retention")
        self.started = True

    async def _set_up_store(self) -> None:
        await asyncio.to_thread(self.create_schema)
        await asyncio.to_thread(restore_probe_gauges, self.golden, self.metrics, self.config.probes)

    async def _set_up_store_when_reachable(self) -> None:
        delay = 1.0
        while True:
            try:
                await self._set_up_store()
                return
            except Exception as exc:  # the store's own errors vary by driver; none may end ingest
                log.warning(
                    "store not reachable (%s); ingest takes spans anyway and sets the store up in %.0f s",
                    type(exc).__name__,
                    delay,
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, _STORE_SETUP_MAX_DELAY_S)

    async def stop(self) -> None:
        """Flush open traces, drain the bus, close the store. Safe twice and before start."""
        self.started = False
        if self._store_setup_task is not None:
            self._store_setup_task.cancel()
            self._store_setup_task = None
        if self._retention_task is not None:
            self._retention_task.cancel()
            self._retention_task = None
        await self.outbox_sweep.stop()
        await self.span_expiry.stop()
        await self.ingest_pool.stop()
        await self.assembler.stop()
        if self.kafka is not None:
            # what requests are waiting on gets its acknowledgement within the grace (helm: below
            # terminationGracePeriodSeconds)
            await self.kafka.stop(self.config.kafka.shutdown_grace_s)
        if self.kafka_backlog is not None:
            await self.kafka_backlog.stop()
        await self.bus.stop()
        if self.durable is not None:
            await self.durable.stop()
        await self.drift.stop()
        await self.estimator.stop()
        await self.correction.stop()
        for worker in self.judge_workers:
            await worker.stop()
        await self.phoenix_forward.stop()
        await self.phoenix_annotations.stop()
        await self.release_budget()
        await asyncio.to_thread(self.store.close)

    async def release_budget(self) -> None:
        """Hand the unused part of this process's judge-budget lease back to the deployment; when the
        store does not answer, the lease expires and comes back without us (shutdown goes on)."""
        if isinstance(self.budget, SharedJudgeBudget):
            try:
                await asyncio.to_thread(self.budget.release)
            except StoreUnavailable as exc:
                log.warning("judge budget lease not returned (%s); it comes back when it expires", exc)

    async def ready(self) -> tuple[bool, str]:
        """Readiness (`/readyz`): whether this replica can answer requests, not whether it can take them.

        A replica that refuses work with 503 + Retry-After (the broker is down, the Kafka buffer or
        the backlog is full) still answers, and exporters retry on that answer: it stays ready, with
        what is wrong in the detail ("degraded: ..."). Taken out of the Service instead (every
        replica at once, in a broker outage), its callers would get connection errors, not 503s.
        Not ready: while starting, and in embedded mode while the store, on this pod, does not
        answer. Distributed ingest only publishes, so PostgreSQL's state does not matter to it."""
        if not self.started:
            return False, "starting"
        if self.kafka is not None:
            if not self.kafka.available:
                return True, "degraded: kafka unavailable; answering 503 + Retry-After"
            if not self.has_room():
                return True, "degraded: kafka buffer at capacity; answering 503 + Retry-After"
            return True, "ok"
        problem = await self.store_problem()
        if problem:
            return False, problem
        if not self.has_room():
            return True, "degraded: backlog at capacity; answering 503 + Retry-After"
        if self.assembler.full:
            return True, "degraded: open-trace buffer at its bound; answering 503 + Retry-After"
        return True, "ok"

    def alive(self) -> tuple[bool, str]:
        """Liveness (`/healthz`): the event loop answers (this runs on it) and, in distributed mode,
        the task that sends to Kafka runs. Without that task every request would wait for an
        acknowledgement that never comes, and nothing but a restart brings it back; a broker that
        is down, by contrast, is retried in the process and is no reason to restart it."""
        if self.started and self.kafka is not None and self.kafka.failure is not None:
            return False, f"kafka send loop ended ({self.kafka.failure})"
        return True, "ok"

    async def store_problem(self) -> str | None:
        """Why the store does not answer a trivial query, or None when it does (readiness)."""
        try:
            await asyncio.to_thread(self.store.ping)
        except Exception as exc:
            return f"store unavailable: {type(exc).__name__}"
        return None

    async def flush(self, timeout_s: float = 10.0) -> bool:
        """Emit every open trace now and wait until the bus delivered everything (tests, demo, shutdown)."""
        await self.assembler.stop()
        await self.assembler.start()
        return await self.bus.drain(timeout_s)
