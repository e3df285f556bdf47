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

Back-pressure (`accept_*` raise `QueueFull` while the backlog is at capacity) and the rest of
taking work in are `PipelineIntake`'s (pipeline_intake.py), which `Pipeline` derives from.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sampler import FairAdmission, FairShares, SqlJudgeQueue, TraceSampler, create_tables
from service.assemble import SpanAssembler
from service.bus.leader import exclusive
from service.bus.memory import MemoryBus
from service.config import RagmonConfig
from service.conventions.pricing import PriceTable
from service.drift.monitor import DriftScheduler
from service.drift.store import DriftStore
from service.drift.window_sink import DriftWindowSink
from service.errors import StoreUnavailable
from service.ingest.durable import DurableAcks
from service.ingest.pool import IngestPool
from service.ingest.span_codec import OtlpSpanCodec
from service.ingest.span_redaction import SpanRedaction
from service.judge.build import build_judge
from service.judge.judging import FaithfulnessEstimator, JudgeQueueSink, JudgeWorker
from service.judge.judgment import Judgment
from service.judge.shared_budget import SharedJudgeBudget, create_budget_tables, judge_budget
from service.judge.store import JudgmentStore
from service.metrics import Metrics
from service.non_requests import RequestFilter
from service.outbox import OutboxSweep
from service.phoenix.annotations import PhoenixAnnotator
from service.phoenix.forward import PhoenixForwarder
from service.pipeline_intake import PipelineIntake
from service.probes.gauges import restore_probe_gauges
from service.probes.store import GoldenStore
from service.redaction import Redactor, redaction_key
from service.regeneration import ReaskDetector
from service.review.correction import HumanCorrection
from service.review.gauges import ReviewGauges
from service.review.intake import ReviewIntake
from service.review.records import ReviewRecord
from service.review.store import ReviewStore
from service.span_expiry import SpanExpiry
from service.stages import ArchiveKeeper, Delivered, Fanout, MetricsSink
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


class Pipeline(PipelineIntake):
    """Everything between the receivers and the sinks of one ragmon process (what takes work in:
    `PipelineIntake`, pipeline_intake.py)."""

    def __init__(
        self, config: RagmonConfig, metrics: Metrics | None = None, *, process: str = "ragmon"
    ) -> None:
        self.config = config
        self.metrics = metrics or Metrics(config.metrics, tenants=config.auth.tenants)
        self.prices = PriceTable.default().with_overrides(config.pricing.overrides)
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self.store = Store(
            config.store_url,
            connect_timeout_s=config.store.timeout_s,
            statement_timeout_s=config.store.timeout_s,
            application_name=process,  # what PostgreSQL's pg_stat_activity names its connections
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
            downstream.append(
                JudgeQueueSink(
                    self.sampler, self.judge_queue, self.store, self.metrics, on_new_work=self._wake_judges
                )
            )
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
            # distributed: decoders hand back the spans-topic records this replica publishes
            max_record_bytes=config.kafka.max_record_bytes if self.kafka is not None else None,
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
            **self._emissions(),
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
            **self._emissions(),
        )

    def _emissions(self) -> dict[str, Any]:
        """The assembler's emissions are sink batches (a sinks worker has no bus between them) or
        become them: up to `bus.batch_size` traces, lingering up to `bus.linger_s` for more. Each
        emission costs a span-archive transaction and the sinks a dozen statements whatever its size
        (bench/RESULTS.md, sessions 38 and 39)."""
        return {"emit_chunk": self.config.bus.batch_size, "linger_s": self.config.bus.linger_s}

    def _wake_judges(self) -> None:
        for worker in self.judge_workers:
            worker.wake()

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
        # one query per scrape, not one per gauge, of the unfinished items only (the gauges need no
        # count of the judged ones, which reads the queue's whole history)
        at, stats = self._stats_cache
        if stats is None or time.monotonic() - at > 1.0:
            stats = self.judge_queue.stats(finished=False)
            self._stats_cache = (time.monotonic(), stats)
        return stats

    def _queue_oldest_age(self) -> float:
        oldest = self._queue_stats().oldest_enqueued_at
        return 0.0 if oldest is None else max(0.0, (datetime.now(UTC) - oldest).total_seconds())

    async def _retention(self) -> None:
        while True:
            cutoff = datetime.now(UTC) - timedelta(days=self.config.store.retention_days)
            try:
                deleted = await asyncio.to_thread(self.store.delete_older_than, cutoff)
                # what the judge kept of those traces: their queue items (every sampling decision
                # stays there otherwise), judgments and flags
                queued = await asyncio.to_thread(self.judge_queue.delete_older_than, cutoff)
                judged = await asyncio.to_thread(self.judgments.delete_older_than, cutoff)
                if deleted or queued or judged:
                    log.info(
                        "retention: deleted %d traces, %d judge-queue items and %d judgments older than %s",
                        deleted,
                        queued,
                        judged,
                        cutoff.isoformat(),
                    )
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
