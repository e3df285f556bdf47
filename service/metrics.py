"""Every Prometheus metric ragmon exports, declared once, and the sink that counts traces.

Naming follows Prometheus practice: `ragmon_` prefix, base units as suffixes
(`_seconds`, `_usd`, `_ratio`), `_total` on counters. Labels are closed sets:
`stage`, `reason`, `kind`, `rating`, `source` are enums in code; `app`, `model`
and `intent` are capped by configuration and overflow into `other`. No label
ever carries a user, session, trace or query.

Per-app metrics are labelled by `scope_labels`: `app`, or `tenant` and `app`
when the tenant label is on (`metrics.tenant_label`; on by default as soon as
the API keys name two tenants), so two tenants' equal app names stay two
series and a tenant's traces only ever count under its own tenant label: the
tenant comes from the API key, never from the trace. Each tenant has its own
caps of app, model, intent and release values with its own `other`
(`LabelBudget`), so one tenant's 25 apps cannot push another's new app into
`other`. Call sites pass `scope(tenant, app)` (and `model_label(tenant, ...)`,
...) and never name the scope labels themselves.

Each `Metrics` owns its own `CollectorRegistry`, so several apps can live in
one process (tests) without `Duplicated timeseries` errors. Values that are
state rather than events (queue depth, open traces) are read at scrape time
by a custom collector from callables the pipeline registers.

Counting happens once per trace id: the pipeline hands `MetricsSink` only the
traces the store reported as new, so a redelivered batch changes no counter.

Where each part lives: this module declares the trace, ingest, assembly, WAL and sink series
and counts traces (`count_traces`, the hot path); `Metrics` derives from one class per other
area, in `service/metric_judge.py` (judge) and `service/metric_areas.py` (review, drift,
Kafka, Phoenix, probes), whose series it declares in a fixed order. `service/metric_base.py`
holds the registry, the label scopes (`scope`, `tenant_scope`, ...) and the shared buckets;
`service/metric_labels.py` the capped labels (`BoundedLabel`, `LabelBudget`);
`service/metric_tally.py` the batch tally (`Tally`, `observe_many`) and the scrape-time
collector (`StateCollector`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from service.config import MetricsConfig
from service.labels import RejectReason
from service.metric_areas import (
    DriftMetrics,
    KafkaMetrics,
    PhoenixMetrics,
    ProbeMetrics,
    ReviewMetrics,
)
from service.metric_base import CHUNK_COUNT_BUCKETS, COST_BUCKETS, DURATION_BUCKETS, SCORE_BUCKETS
from service.metric_judge import JudgeMetrics
from service.metric_tally import Tally, observe_many
from service.model import Feedback, RagTrace

STAGES = ("total", "embedding", "retrieval", "rerank", "generation")
TOKEN_KINDS = ("input", "output")
RATINGS = ("up", "down")
REGENERATION_SOURCES = ("attribute", "feedback", "reask")
# Why the span assembler flushed a trace (service/assemble.py), and why it dropped spans.
FLUSH_REASONS = ("complete", "idle", "max_age", "evicted", "shutdown")
DROPPED_SPAN_REASONS = ("too_late", "duplicate", "build_failed")
# Whole-request refusals; per-span reasons come from `labels.RejectReason`.
REQUEST_REJECT_REASONS = (
    "decode_error",
    "invalid_input",
    "too_large",
    "unsupported_media_type",
    "unauthenticated",
    "forbidden",
    "bad_api_key",
    "queue_full",
    "body_timeout",
    "header_timeout",
    "wal_full",
    "wal_unavailable",
)


class Metrics(JudgeMetrics, DriftMetrics, ReviewMetrics, KafkaMetrics, ProbeMetrics, PhoenixMetrics):
    """The registry and every metric of one ragmon process: the trace counters here, each other
    area's series from its class in service/metric_areas.py (the judge's: service/metric_judge.py),
    label scopes from `MetricsBase`."""

    def __init__(self, config: MetricsConfig | None = None, *, tenants: Iterable[str] = ()) -> None:
        """`tenants`: the tenants the API keys name (see `MetricsBase`)."""
        config = config or MetricsConfig()
        super().__init__(config, tenants=tenants)
        # (metric, label values) -> child, for the per-trace counters; see `_child`
        self._children: dict[tuple[Counter | Histogram, tuple[str, ...]], Any] = {}
        r = self.registry

        self.traces = Counter(
            "ragmon_traces", "RAG traces received and stored, by app", [*self.scope_labels], registry=r
        )
        self.partial_traces = Counter(
            "ragmon_partial_traces",
            "traces first stored without their root span (idle, max age or buffer full); see "
            "ragmon_assembled_traces and ragmon_partial_traces_completed",
            [*self.scope_labels],
            registry=r,
        )
        self.traces_updated = Counter(
            "ragmon_traces_updated",
            "stored traces replaced by a fuller version when their late spans arrived (each counted "
            "once in ragmon_traces, under the app it was first counted under)",
            [*self.scope_labels],
            registry=r,
        )
        self.partial_completed = Counter(
            "ragmon_partial_traces_completed",
            "partial traces whose root span arrived later: partial now = partial_traces - this",
            [*self.scope_labels],
            registry=r,
        )
        self.trace_corrections = Counter(
            "ragmon_trace_corrections",
            "histogram observations of a stored trace that a later version changed; the histogram keeps "
            "the first value (quantity: stage_seconds, ttft, trace_cost, retrieved_chunks, top1_score)",
            [*self.scope_labels, "quantity"],
            registry=r,
        )
        self.stage_duration = Histogram(
            "ragmon_stage_duration_seconds",
            "duration of each RAG stage per trace (sum over the stage's spans)",
            [*self.scope_labels, "stage"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "ragmon_ttft_seconds",
            "time to first token of the answer",
            [*self.scope_labels],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "ragmon_tokens",
            "LLM tokens, by model and kind",
            [*self.scope_labels, "model", "kind"],
            registry=r,
        )
        self.cost = Counter(
            "ragmon_cost_usd", "spend in USD, by model", [*self.scope_labels, "model"], registry=r
        )
        self.trace_cost = Histogram(
            "ragmon_trace_cost_usd",
            "cost of one trace in USD (priced calls only)",
            [*self.scope_labels],
            buckets=COST_BUCKETS,
            registry=r,
        )
        self.unpriced_calls = Counter(
            "ragmon_unpriced_calls",
            "model usages with no app-sent cost and no price-table entry (never guessed)",
            [*self.scope_labels, "model"],
            registry=r,
        )
        self.usage_unknown_calls = Counter(
            "ragmon_usage_unknown_calls",
            "model usages reported without token counts or a cost: unknown, never priced at 0;"
            " their traces stay out of ragmon_trace_cost_usd",
            [*self.scope_labels, "model"],
            registry=r,
        )
        self.retrieved_chunks = Histogram(
            "ragmon_retrieved_chunks",
            "chunks returned by retrieval per trace",
            [*self.scope_labels],
            buckets=CHUNK_COUNT_BUCKETS,
            registry=r,
        )
        self.top1_score = Histogram(
            "ragmon_retrieval_top1_score",
            "score of the top-ranked retrieved chunk",
            [*self.scope_labels],
            buckets=SCORE_BUCKETS,
            registry=r,
        )
        self.empty_retrievals = Counter(
            "ragmon_empty_retrievals",
            "traces with a retrieval step that returned no chunk",
            [*self.scope_labels],
            registry=r,
        )
        self.regenerations = Counter(
            "ragmon_regenerations",
            "answers the user asked to regenerate (attribute, regenerate feedback, or a detected re-ask)",
            [*self.scope_labels, "intent", "source"],
            registry=r,
        )
        self.requests_by_intent = Counter(
            "ragmon_intent_traces",
            "traces by app and intent (denominator of the regeneration rate)",
            [*self.scope_labels, "intent"],
            registry=r,
        )
        self.release_traces = Counter(
            "ragmon_release_traces",
            "traces by app and release (service.version); alerts join it to name the release they fire under",
            [*self.scope_labels, "release"],
            registry=r,
        )
        self.feedback = Counter(
            "ragmon_feedback", "user ratings received", [*self.scope_labels, "rating"], registry=r
        )
        self.ingest_rejected = Counter(
            "ragmon_ingest_rejected",
            "spans, traces, feedback or requests refused at ingest, by reason",
            ["reason"],
            registry=r,
        )
        self.ingest_truncated = Counter(
            "ragmon_ingest_truncated_values",
            "attribute values (text) ingest cut so that their span fits the span size limit; the span "
            "keeps them, marked (ragmon.truncated)",
            registry=r,
        )
        self.spans_received = Counter(
            "ragmon_spans_received", "spans accepted by a receiver", ["receiver"], registry=r
        )
        self.non_request_traces = Counter(
            "ragmon_non_request_traces",
            "traces that are not user requests, by kind (embedding: index building or batch embedding; "
            "other: no RAG stage); left out of every request metric, drift and sampling",
            [*self.scope_labels, "kind"],
            registry=r,
        )
        self.non_request_cost = Counter(
            "ragmon_non_request_cost_usd",
            "USD spent by traces that are not user requests (priced calls only), by kind",
            [*self.scope_labels, "kind"],
            registry=r,
        )
        self.wal_replayed = Counter(
            "ragmon_wal_replayed_records",
            "write-ahead log records ingested again at start: acknowledged before a crash, not yet stored",
            ["kind"],
            registry=r,
        )
        self.wal_fsyncs = Counter(
            "ragmon_wal_group_commits",
            "write-ahead log writes, each one fsync for every request in it",
            registry=r,
        )
        self.wal_relogged = Counter(
            "ragmon_wal_relogged_traces",
            "open traces whose buffered spans were logged again as one record (open longer than "
            "wal.relog_after_s), so the write-ahead log's older segments could go",
            registry=r,
        )
        self.feedback_orphaned = Counter(
            "ragmon_feedback_orphaned",
            "feedback events whose trace never arrived within store.feedback_wait_s (kept, never counted "
            "in ragmon_feedback_total nor reviewed)",
            ["kind"],
            registry=r,
        )
        self.redactions = Counter(
            "ragmon_redactions",
            "texts replaced by [REDACTED:<kind>] before they were kept (redaction.*): in spans as ingest "
            "decoded them, in traces, feedback, reviews and golden sets",
            ["kind"],
            registry=r,
        )
        self.log_events_received = Counter(
            "ragmon_log_events_received",
            "GenAI events (OTLP log records) accepted by a receiver, to be joined to their spans",
            ["receiver"],
            registry=r,
        )
        self.ignored_log_records = Counter(
            "ragmon_ignored_log_records",
            "OTLP log records answered as accepted but not stored: they are not GenAI events",
            ["receiver"],
            registry=r,
        )
        self.ignored_metrics_requests = Counter(
            "ragmon_ignored_metrics_requests",
            "OTLP metrics export requests answered as accepted and not stored (ragmon reads no app metrics)",
            ["receiver"],
            registry=r,
        )
        self.ingest_pool_restarts = Counter(
            "ragmon_ingest_pool_restarts",
            "times an ingest worker process died and was replaced (the calls it held ran in the "
            "server process), by role (decoder, builder)",
            ["role"],
            registry=r,
        )
        self.late_spans = Counter(
            "ragmon_late_spans",
            "spans (and span events) that arrived after their trace was first flushed and completed it",
            registry=r,
        )
        self.dropped_spans = Counter(
            "ragmon_dropped_spans",
            "accepted spans (and span events) dropped after ingest, by reason (too_late: past "
            "assembler.late_window_s of their trace's first flush; duplicate: a span already kept for "
            "its trace; build_failed: their trace could not be built)",
            ["reason"],
            registry=r,
        )
        for reason in DROPPED_SPAN_REASONS:
            self.dropped_spans.labels(reason=reason)
        self.assembled = Counter(
            "ragmon_assembled_traces",
            "traces (or later parts of a trace) the span assembler flushed, by why: complete (root + "
            "grace), idle (assembler.idle_s without a span), max_age, evicted (buffer over "
            "assembler.evict_above), shutdown",
            ["reason"],
            registry=r,
        )
        for reason in FLUSH_REASONS:
            self.assembled.labels(reason=reason)
        self.assembly_failures = Counter(
            "ragmon_assembly_failures", "span groups that could not be turned into a trace", registry=r
        )
        self.sink_failures = Counter(
            "ragmon_sink_failures",
            "batches a sink refused, by sink and kind of error",
            ["sink", "kind"],
            registry=r,
        )
        self.sink_last_success = Gauge(
            "ragmon_sink_last_success_timestamp_seconds",
            "when a sink last accepted a batch",
            ["sink"],
            registry=r,
        )
        # dead letters (service/bus/memory.py): records a sink refused for good, set aside one by one
        self.dead_letters = Counter(
            "ragmon_dead_letters",
            "records a sink refused for good, handed to the dead-letter handler (GET /api/v1/dead-letters)",
            ["kind"],
            registry=r,
        )
        for dead_letter_kind in ("trace", "feedback"):
            self.dead_letters.labels(kind=dead_letter_kind)
        self._declare_judge_metrics()
        self._declare_drift_metrics()
        self._declare_review_metrics()
        self._declare_kafka_metrics()
        self._declare_probe_metrics(config)
        self._declare_phoenix_metrics()
        r.register(self.state)
        for stage in STAGES:
            self.stage_duration.labels(**self.scope_kw(None, None), stage=stage)
        for reason in REQUEST_REJECT_REASONS + tuple(RejectReason):
            self.ingest_rejected.labels(reason=reason)

    def _child(self, metric: Counter | Histogram, *values: str) -> Any:
        """`metric.labels(*values)` (values in declaration order), remembered.

        prometheus-client's `labels()` validates and locks on every call (~5 us);
        `count_traces` makes about 15 such calls a trace. The memo holds one entry
        per labelled series, so it is bounded by the same label caps as the series.
        """
        key = (metric, values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def count_traces(self, batch: Sequence[RagTrace]) -> None:
        """Count a batch of NEW traces (the caller guarantees each trace id is counted once); what a
        later, fuller version of one corrects is counted by `service.corrections.count_updates`.

        The batch is tallied per series first and each labelled series is touched
        once (`Tally`): a trace feeds ~15 series, and prometheus-client takes a
        lock and, for a histogram, walks the buckets on every call
        (bench/RESULTS.md, session 23)."""
        tally = Tally()
        inc, observe = tally.inc, tally.observe
        for trace in batch:
            app, labels = self._scoped(trace.tenant, trace.app)
            inc((self.traces, app))
            intent = labels.intent(trace.intent)
            inc((self.requests_by_intent, (*app, intent)))
            inc((self.release_traces, (*app, labels.release(trace.release))))
            if trace.partial:
                inc((self.partial_traces, app))
            t = trace.timings
            # a partial trace's total and cost are not the request's: they are observed when its root
            # arrives, or when its late window closes (service/corrections.py)
            whole = not trace.partial
            for stage, value in (
                ("total", t.total_s if whole else None),
                ("embedding", t.embedding_s),
                ("retrieval", t.retrieval_s),
                ("rerank", t.rerank_s),
                ("generation", t.generation_s),
            ):
                if value is not None:
                    observe((self.stage_duration, (*app, stage)), value)
            if t.ttft_s is not None:
                observe((self.ttft, app), t.ttft_s)
            for usage in trace.usage:
                model = labels.model(usage.model)
                if usage.input_tokens:
                    inc((self.tokens, (*app, model, "input")), usage.input_tokens)
                if usage.output_tokens:
                    inc((self.tokens, (*app, model, "output")), usage.output_tokens)
                if usage.cost_usd is not None:
                    inc((self.cost, (*app, model)), usage.cost_usd)
                elif usage.cost_source == "unknown_usage":
                    inc((self.usage_unknown_calls, (*app, model)))
                else:
                    inc((self.unpriced_calls, (*app, model)))
            cost = trace.cost_usd
            if cost is not None and whole:
                observe((self.trace_cost, app), cost)
            retrieval = trace.retrieval
            if retrieval.retriever is not None or retrieval.chunks:
                observe((self.retrieved_chunks, app), len(retrieval.chunks))
                if not retrieval.chunks:
                    inc((self.empty_retrievals, app))
            top1 = retrieval.top1_score
            if top1 is not None:
                observe((self.top1_score, app), top1)
            if trace.is_regeneration:
                inc((self.regenerations, (*app, intent, trace.regeneration_source or "attribute")))
        for (counter, values), amount in tally.increments.items():
            self._child(counter, *values).inc(amount)
        for (histogram, values), observed in tally.observations.items():
            observe_many(self._child(histogram, *values), observed)

    def count_non_requests(self, batch: Sequence[RagTrace]) -> None:
        """Count traces that are not user requests (each once, as `count_traces` counts requests)."""
        for trace in batch:
            app = self.scope(trace.tenant, trace.app)
            self._child(self.non_request_traces, *app, trace.kind).inc()
            cost = trace.cost_usd
            if cost is not None:
                self._child(self.non_request_cost, *app, trace.kind).inc(cost)

    def count_feedback(
        self, batch: Sequence[Feedback], traces: Mapping[str, tuple[str | None, str | None]]
    ) -> None:
        """Count NEW feedback events; `traces` maps trace id -> (app, intent) of traces already known."""
        for event in batch:
            known_app, known_intent = traces.get(event.trace_id, (None, None))
            app = self.scope_kw(event.tenant, event.app or known_app)
            if event.kind == "regenerate":
                intent = self.intent_label(event.tenant, known_intent)
                self.regenerations.labels(**app, intent=intent, source="feedback").inc()
            else:
                self.feedback.labels(**app, rating=event.kind).inc()

    def reject(self, reason: str, count: int = 1) -> None:
        if count > 0:
            self.ingest_rejected.labels(reason=reason).inc(count)
