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
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sampler.queue import EXPIRED
from service.config import MetricsConfig
from service.labels import FailureReason, RejectReason
from service.metric_labels import BoundedLabel, LabelBudget
from service.metric_tally import LabelledValues, StateCollector, Tally, observe_many
from service.model import Feedback, RagTrace

STAGES = ("total", "embedding", "retrieval", "rerank", "generation")
# Latency buckets span fast retrieval (ms) to slow generation (tens of seconds).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)
# Cost per trace: a cached embedding call costs ~1e-6 USD, a long agent run dollars.
COST_BUCKETS = (1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
CHUNK_COUNT_BUCKETS = (0, 1, 2, 3, 5, 8, 10, 15, 20, 30, 50, 100)
# Similarity scores are mostly in [0, 1]; larger buckets catch BM25-style scores.
SCORE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0, 2.0, 5.0, 10.0, 25.0)
TOKEN_KINDS = ("input", "output")
RATINGS = ("up", "down")
# Why a call to Phoenix failed, and why a request or annotation was given up (service/phoenix_*.py).
PHOENIX_FAILURE_REASONS = (
    "timeout",
    "connection_error",
    "rate_limited",
    "server_error",
    "rejected",
    "not_found",
)
PHOENIX_DROP_REASONS = ("buffer_full", "retries_exhausted", "rejected", "root_span_missing", "shutdown")
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
# Review queues, states and verdicts: closed sets (service/review/records.py).
REVIEW_QUEUES = ("flagged", "blind")
REVIEW_STATES = ("open", "claimed", "done")
REVIEW_VERDICTS = ("faithful", "unfaithful", "unsure")
# Calibration gauges, labelled {judge_version, sample}; judge versions are capped by config. Each
# estimate also as its 95 % interval bounds (Wilson for the ratios; kappa's asymptotic one).
_JUDGE_CALIBRATION_ESTIMATES = {
    "ragmon_judge_agreement_ratio": "share of reviewed traces where judge and reviewer agree",
    "ragmon_judge_kappa": "Cohen's kappa between judge and reviewer verdicts",
    "ragmon_judge_false_approval_ratio": "share of judge-faithful traces the reviewer called unfaithful",
    "ragmon_judge_false_rejection_ratio": "share of judge-unfaithful traces the reviewer called faithful",
}
JUDGE_CALIBRATION_GAUGES = {
    **_JUDGE_CALIBRATION_ESTIMATES,
    **{
        f"{name}_{bound}": f"{bound} bound of the 95 % interval: {doc}"
        for name, doc in _JUDGE_CALIBRATION_ESTIMATES.items()
        for bound in ("lower", "upper")
    },
    "ragmon_judge_calibration_pairs": "judge/reviewer pairs behind the calibration gauges (unsure left out)",
}

# Judge-human agreement per app over the rolling window, from the blind sample (service/review/agreement.py).
_JUDGE_HUMAN_ESTIMATES = {
    "ragmon_judge_human_agreement_ratio": "share of blind pairs in the window where judge and reviewer agree",
    "ragmon_judge_human_kappa": "Cohen's kappa between judge and reviewer on the window's blind pairs",
}
JUDGE_HUMAN_GAUGES = {
    **_JUDGE_HUMAN_ESTIMATES,
    **{
        f"{name}_{bound}": f"{bound} bound of the 95 % interval: {doc}"
        for name, doc in _JUDGE_HUMAN_ESTIMATES.items()
        for bound in ("lower", "upper")
    },
    "ragmon_judge_human_pairs": "blind judge/reviewer pairs in the window (unsure left out)",
    "ragmon_judge_human_disagreement_reference_ratio": "share of blind pairs that disagree in the reference "
    "period before the window (review.agreement_reference_s)",
    "ragmon_judge_human_reference_pairs": "blind judge/reviewer pairs in the reference period",
    "ragmon_judge_human_disagreement_p_value": "one-sided Fisher exact p-value: the window's judge-human "
    "disagreement is above the reference period's",
}


class Metrics:
    """The registry and every metric of one ragmon process."""

    def __init__(self, config: MetricsConfig | None = None, *, tenants: Iterable[str] = ()) -> None:
        """`tenants`: the tenants the API keys name (`AuthConfig.tenants`); with the tenant label on,
        each is its own label value and any other tenant counts as `other` (without them, the first
        `max_tenants` seen are their own)."""
        config = config or MetricsConfig()
        self._label_config = config
        self.registry = CollectorRegistry(auto_describe=True)
        named = frozenset(tenants)
        self.tenant_label = BoundedLabel(config.max_tenants, named) if config.tenant_label else None
        self.scope_labels: tuple[str, ...] = ("tenant", "app") if config.tenant_label else ("app",)
        # `tenant` alone, on the per-tenant series that have no app (judge deferrals, probe gauges)
        self.tenant_scope_labels: tuple[str, ...] = ("tenant",) if config.tenant_label else ()
        # per tenant label value (one for all without the label): bounded by the tenant label's cap
        self._budgets: dict[str, LabelBudget] = {}
        self._budgets_lock = threading.Lock()
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
        self.state = StateCollector()
        r.register(self.state)
        for stage in STAGES:
            self.stage_duration.labels(**self.scope_kw(None, None), stage=stage)
        for reason in REQUEST_REJECT_REASONS + tuple(RejectReason):
            self.ingest_rejected.labels(reason=reason)

    def _declare_judge_metrics(self) -> None:
        r = self.registry
        self.judge_sampled = Counter(
            "ragmon_judge_sampled",
            "traces the sampler put in the judge queue, by deciding stratum",
            ["stratum"],
            registry=r,
        )
        self.judge_skipped = Counter(
            "ragmon_judge_skipped",
            "traces selected for judging that were never judged, by reason (expired: the budget kept them "
            "deferred past budget.max_deferral_s); kept, visible, corrected for in the estimate",
            [*self.tenant_scope_labels, "reason"],
            registry=r,
        )
        self.judge_deferred = Counter(
            "ragmon_judge_deferred",
            "traces whose turn for the judge came when the budget had no room, each counted once: kept "
            "in the queue and judged as the budget refills, in fair shares of the tenants waiting",
            [*self.tenant_scope_labels],
            registry=r,
        )
        self.judge_requests = Counter(
            "ragmon_judge_requests", "calls made to the judge model (retries included)", ["judge"], registry=r
        )
        self.judge_completed = Counter(
            "ragmon_judge_completed",
            "judgments stored (any outcome), once per trace and judge version, and once more for each "
            "re-judgment that replaced one (ragmon_judge_rejudged)",
            ["judge"],
            registry=r,
        )
        self.judge_rejudged = Counter(
            "ragmon_judge_rejudged",
            "judged traces queued again because a later version changed what the judge reads (an answer "
            "that arrived late); the estimate keeps the latest judgment of each trace",
            registry=r,
        )
        self.judge_failures = Counter(
            "ragmon_judge_failures",
            "judge attempts or judgments that failed, by reason",
            ["reason"],
            registry=r,
        )
        self.judge_verdicts = Counter(
            "ragmon_judge_verdicts",
            "judgments by verdict: faithful, unfaithful, no_claims, failed",
            [*self.scope_labels, "verdict", "judge"],
            registry=r,
        )
        self.judge_diagnoses = Counter(
            "ragmon_judge_diagnoses",
            "judged traces by diagnosis (ok, retrieval_failure, generation_failure, ...)",
            [*self.scope_labels, "diagnosis"],
            registry=r,
        )
        self.judge_cost = Counter("ragmon_judge_cost_usd", "judge spend in USD", ["judge"], registry=r)
        self.judge_tokens = Counter(
            "ragmon_judge_tokens", "judge model tokens", ["judge", "kind"], registry=r
        )
        self.judge_calls_without_usage = Counter(
            "ragmon_judge_calls_without_usage",
            "judge replies whose provider reported no token usage",
            ["judge"],
            registry=r,
        )
        self.judge_duration = Histogram(
            "ragmon_judge_duration_seconds",
            "wall time of one judgment, retries and backoff included",
            ["judge"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.judge_last_success = Gauge(
            "ragmon_judge_last_success_timestamp_seconds", "when the judge last stored a judgment", registry=r
        )
        # Series that start at 0, so rate() and alerts see them before the first event.
        for reason in (*get_args(FailureReason), "trace_missing", "judge_unavailable"):
            self.judge_failures.labels(reason=reason)
        for tenant in self._named_tenants() if self.tenant_label is not None else [None]:
            self.judge_skipped.labels(*self.tenant_scope(tenant), EXPIRED)
            if self.tenant_label is not None:
                self.judge_deferred.labels(*self.tenant_scope(tenant))
        for judge in ("llm", "heuristic"):
            self.judge_cost.labels(judge=judge)
            self.judge_completed.labels(judge=judge)
        self.review_flags = Counter(
            "ragmon_review_flags",
            "traces flagged for review, by reason",
            [*self.scope_labels, "reason"],
            registry=r,
        )
        estimate_labels = [*self.scope_labels, "release", "intent"]
        self.faithfulness_estimate = Gauge(
            "ragmon_faithfulness_estimate",
            "Hajek (inverse-probability weighted) faithfulness over the rolling window; release/intent 'all' "
            "for the app-wide estimate",
            estimate_labels,
            registry=r,
        )
        self.faithfulness_lower = Gauge(
            "ragmon_faithfulness_estimate_lower",
            "lower bound of the 95% interval of the faithfulness estimate",
            estimate_labels,
            registry=r,
        )
        self.faithfulness_upper = Gauge(
            "ragmon_faithfulness_estimate_upper",
            "upper bound of the 95% interval of the faithfulness estimate",
            estimate_labels,
            registry=r,
        )
        self.faithful_answers = Gauge(
            "ragmon_faithful_answers_ratio",
            "Hajek estimate of the share of answers with no unsupported claim (answer-level reading; "
            "ragmon_faithfulness_estimate is the share of supported claims)",
            estimate_labels,
            registry=r,
        )
        self.faithful_answers_lower = Gauge(
            "ragmon_faithful_answers_ratio_lower",
            "lower bound of the 95% interval of the share of faithful answers",
            estimate_labels,
            registry=r,
        )
        self.faithful_answers_upper = Gauge(
            "ragmon_faithful_answers_ratio_upper",
            "upper bound of the 95% interval of the share of faithful answers",
            estimate_labels,
            registry=r,
        )
        self.faithfulness_no_claims = Gauge(
            "ragmon_faithfulness_no_claims",
            "judged answers with no claims in the window: in neither reading's denominator",
            estimate_labels,
            registry=r,
        )
        self.faithfulness_sample_size = Gauge(
            "ragmon_faithfulness_sample_size",
            "scored judgments behind the faithfulness estimate",
            estimate_labels,
            registry=r,
        )
        self._declare_corrected_metrics(estimate_labels)

    def _declare_corrected_metrics(self, estimate_labels: list[str]) -> None:
        """The human-corrected readings (service/review/correction.py) and judge-human agreement per app."""
        r = self.registry
        corrected = {
            "claims": ("ragmon_faithfulness_corrected_estimate", "share of claims supported"),
            "answers": (
                "ragmon_faithful_answers_corrected_ratio",
                "share of answers with no unsupported claim",
            ),
        }
        self.corrected: dict[str, tuple[Gauge, Gauge, Gauge]] = {}
        for reading, (name, what) in corrected.items():

            def bound(which: str, name: str = name, what: str = what) -> Gauge:
                return Gauge(
                    f"{name}_{which}",
                    f"{which} bound of the 95% interval of the human-corrected {what} (both phases' "
                    "sampling error and the judge's error as the blind labels measure it)",
                    estimate_labels,
                    registry=r,
                )

            point = Gauge(
                name,
                f"human-corrected {what}: the judge's Hajek estimate plus the weighted mean "
                "reviewer-minus-judge difference on the blind sample; absent below review.min_labels "
                "blind labels",
                estimate_labels,
                registry=r,
            )
            self.corrected[reading] = (point, bound("lower"), bound("upper"))
        self.human_labels = Gauge(
            "ragmon_faithfulness_human_labels",
            "blind human labels in the window behind the human-corrected estimate, by reading",
            [*estimate_labels, "reading"],
            registry=r,
        )
        scope = list(self.scope_labels)
        self.human_agreement = {
            name: Gauge(name, doc, scope, registry=r) for name, doc in JUDGE_HUMAN_GAUGES.items()
        }

    def _declare_review_metrics(self) -> None:
        self.reviews = Counter(
            "ragmon_reviews",
            "human reviews recorded, by queue and verdict",
            ["queue", "verdict"],
            registry=self.registry,
        )
        for queue in REVIEW_QUEUES:
            for verdict in REVIEW_VERDICTS:
                self.reviews.labels(queue=queue, verdict=verdict)

    def watch_review(
        self,
        items: Callable[[], LabelledValues],
        oldest_open_age: Callable[[], LabelledValues],
        reviewer_items: Callable[[], LabelledValues],
        calibration: Callable[[str], LabelledValues],
    ) -> None:
        """Scrape-time review gauges, read from the review store through the given readers."""
        s = self.state
        s.add_family(
            "ragmon_review_items",
            "review items by queue and state (an expired lease counts as open)",
            ("queue", "state"),
            items,
        )
        s.add_family(
            "ragmon_review_oldest_open_age_seconds",
            "age of the oldest open review item",
            ("queue",),
            oldest_open_age,
        )
        s.add_family(
            "ragmon_review_reviewer_items",
            "review items claimed now and done, by reviewer (names from config)",
            ("reviewer", "state"),
            reviewer_items,
        )
        for name, documentation in JUDGE_CALIBRATION_GAUGES.items():
            s.add_family(name, documentation, ("judge_version", "sample"), partial(calibration, name))

    def _declare_drift_metrics(self) -> None:
        """Drift results (one series per app and detector; detector names are a closed set in code)."""
        r = self.registry
        labels = [*self.scope_labels, "detector"]
        self.drift_score = Gauge(
            "ragmon_drift_score",
            "the detector's test statistic on the latest window (e.g. MMD^2, KS D)",
            labels,
            registry=r,
        )
        self.drift_p_value = Gauge(
            "ragmon_drift_p_value",
            "p-value of the latest drift test (NaN for threshold-only detectors)",
            labels,
            registry=r,
        )
        self.drift_threshold = Gauge(
            "ragmon_drift_alpha", "false-alarm rate (alpha) the detector was run at", labels, registry=r
        )
        self.drift_detected = Gauge(
            "ragmon_drift_detected",
            "1 when the latest run (after hysteresis) says drift, else 0",
            labels,
            registry=r,
        )
        self.drift_window_size = Gauge(
            "ragmon_drift_window_size",
            "observations in the current window of the latest run",
            labels,
            registry=r,
        )
        self.drift_top_group = Gauge(
            "ragmon_drift_top_group_info",
            "always 1: the query group that grew most in the latest drifted run, as labels (its words, "
            "its share of queries then -> now); one series per app and detector, replaced on each run",
            [*self.scope_labels, "detector", "terms", "share"],
            registry=r,
        )
        self.drift_runs = Counter(
            "ragmon_drift_runs",
            "drift detector runs, by outcome (ok, drift, insufficient_data, error)",
            [*self.scope_labels, "detector", "outcome"],
            registry=r,
        )
        self.drift_last_run = Gauge(
            "ragmon_drift_last_run_timestamp_seconds",
            "when a drift detector last ran",
            ["detector"],
            registry=r,
        )
        self.drift_dropped = Counter(
            "ragmon_drift_dropped_observations",
            "traces the drift windows did not keep because a bound was reached (app, model or bucket cap)",
            ["reason"],
            registry=r,
        )
        for reason in ("app_cap", "model_cap", "bucket_cap"):
            self.drift_dropped.labels(reason=reason)
        self.embedding_model_changes = Counter(
            "ragmon_embedding_model_changes",
            "a new query-embedding model name or vector dimension appeared in traces",
            [*self.scope_labels],
            registry=r,
        )
        self.regeneration_rate = Gauge(
            "ragmon_regeneration_rate_ratio",
            "regeneration rate of the latest window",
            [*self.scope_labels, "intent"],
            registry=r,
        )
        self.regeneration_band_lower = Gauge(
            "ragmon_regeneration_band_lower_ratio",
            "lower control limit of the regeneration rate for this window",
            [*self.scope_labels, "intent"],
            registry=r,
        )
        self.regeneration_band_upper = Gauge(
            "ragmon_regeneration_band_upper_ratio",
            "upper control limit of the regeneration rate for this window",
            [*self.scope_labels, "intent"],
            registry=r,
        )

    def _declare_kafka_metrics(self) -> None:
        """Distributed mode: what ingest published, what workers consumed, and how far behind they are."""
        r = self.registry
        self.kafka_produced = Counter(
            "ragmon_kafka_produced",
            "records the broker acknowledged (acks=all), by topic",
            ["topic"],
            registry=r,
        )
        self.kafka_produce_errors = Counter(
            "ragmon_kafka_produce_errors",
            "produce attempts that failed (records stay buffered and are retried), by topic",
            ["topic"],
            registry=r,
        )
        self.kafka_consumed = Counter(
            "ragmon_kafka_consumed",
            "records a worker handed to its sinks and committed, by group and topic",
            ["group", "topic"],
            registry=r,
        )
        self.kafka_bad_records = Counter(
            "ragmon_kafka_bad_records",
            "records that did not decode as a trace or feedback event (skipped), by topic",
            ["topic"],
            registry=r,
        )
        self.kafka_commit_failures = Counter(
            "ragmon_kafka_commit_failures",
            "offset commits that failed (the batch is redelivered; processing is idempotent)",
            ["group"],
            registry=r,
        )
        self.kafka_consumer_lag = Gauge(
            "ragmon_kafka_consumer_lag",
            "records past this worker's read position, per group and partition it owns; records read but "
            "not yet stored are not in it (ragmon_kafka_backlog_records counts those)",
            ["group", "topic", "partition"],
            registry=r,
        )
        self.kafka_publish_refused = Counter(
            "ragmon_kafka_publish_refused",
            "ingest requests answered 503 because Kafka could not take them, by reason "
            "(buffer_full, unavailable, timeout: no acknowledgement within kafka.publish_timeout_s)",
            ["reason"],
            registry=r,
        )
        for reason in ("buffer_full", "unavailable", "timeout"):
            self.kafka_publish_refused.labels(reason=reason)
        self.kafka_producer_rebuilds = Counter(
            "ragmon_kafka_producer_rebuilds",
            "Kafka producers closed after a failed send or probe and built anew (lost producer id or broker)",
            registry=r,
        )

    def _declare_phoenix_metrics(self) -> None:
        """The tee to Arize Phoenix and the annotations written there (`service/phoenix_*.py`)."""
        r = self.registry
        self.phoenix_forwarded = Counter(
            "ragmon_phoenix_forward_requests", "OTLP requests Phoenix accepted from the tee", registry=r
        )
        self.phoenix_forwarded_bytes = Counter(
            "ragmon_phoenix_forward_bytes", "request bytes (as received) Phoenix accepted", registry=r
        )
        self.phoenix_forward_failures = Counter(
            "ragmon_phoenix_forward_failures",
            "tee attempts that failed (retried for up to forward_retry_s), by reason",
            ["reason"],
            registry=r,
        )
        self.phoenix_forward_dropped = Counter(
            "ragmon_phoenix_forward_dropped",
            "OTLP requests never delivered to Phoenix (ragmon itself kept them), by reason",
            ["reason"],
            registry=r,
        )
        self.phoenix_forward_last_success = Gauge(
            "ragmon_phoenix_forward_last_success_timestamp_seconds",
            "when Phoenix last accepted a forwarded request",
            registry=r,
        )
        self.phoenix_annotations = Counter(
            "ragmon_phoenix_annotations",
            "annotations written to Phoenix root spans, by annotator kind",
            ["kind"],
            registry=r,
        )
        self.phoenix_annotation_failures = Counter(
            "ragmon_phoenix_annotation_failures",
            "calls to Phoenix for annotations that failed (retried until max_attempts), by reason;"
            " a root span not inserted yet is no failure",
            ["reason"],
            registry=r,
        )
        self.phoenix_annotations_dropped = Counter(
            "ragmon_phoenix_annotations_dropped",
            "annotations never written to Phoenix, by reason",
            ["reason"],
            registry=r,
        )
        for reason in PHOENIX_FAILURE_REASONS:
            self.phoenix_forward_failures.labels(reason=reason)
            self.phoenix_annotation_failures.labels(reason=reason)
        for reason in PHOENIX_DROP_REASONS:
            self.phoenix_forward_dropped.labels(reason=reason)
            self.phoenix_annotations_dropped.labels(reason=reason)
        for kind in ("llm", "human"):
            self.phoenix_annotations.labels(kind=kind)

    def _declare_probe_metrics(self, config: MetricsConfig) -> None:
        """Golden-set probe runs: the latest scored run of each golden set, and its delta vs the baseline.

        Set by `service/probes/gauges.py`; led by `tenant` when the metrics carry it (two tenants'
        golden sets of one name are two series), `golden` and `category` are capped per tenant
        (`other`), `category` "all" is the whole run, `k` comes from the probes config, `slice` is a
        closed set.
        """
        r = self.registry
        g = [*self.tenant_scope_labels, "golden"]
        self.probe_recall = Gauge(
            "ragmon_probe_recall_ratio",
            "mean recall@k over the scored questions of the latest probe run",
            [*g, "k", "category"],
            registry=r,
        )
        self.probe_mrr = Gauge(
            "ragmon_probe_mrr_ratio",
            "mean reciprocal rank over the scored questions of the latest probe run",
            [*g, "category"],
            registry=r,
        )
        self.probe_ndcg = Gauge(
            "ragmon_probe_ndcg_ratio",
            "mean graded nDCG@k over the scored questions of the latest probe run",
            [*g, "k", "category"],
            registry=r,
        )
        self.probe_questions = Gauge(
            "ragmon_probe_questions",
            "questions of the latest probe run by slice (only `scored` enters the means)",
            [*g, "slice"],
            registry=r,
        )
        self.probe_false_exclusion = Gauge(
            "ragmon_probe_filter_false_exclusion_ratio",
            "share of scored questions with a logged filter whose every eligible gold chunk it excluded",
            g,
            registry=r,
        )
        self.probe_correct = Gauge(
            "ragmon_probe_answer_correct_ratio",
            "share of judged probe answers stating every expected fact (latest run)",
            g,
            registry=r,
        )
        self.probe_diagnoses = Gauge(
            "ragmon_probe_diagnoses",
            "probe answers of the latest run by diagnosis (success, retrieval_failure, ...)",
            [*g, "diagnosis"],
            registry=r,
        )
        self.probe_last_run = Gauge(
            "ragmon_probe_last_run_timestamp_seconds",
            "when the latest scored probe run started",
            g,
            registry=r,
        )
        delta = "paired delta (latest run - pinned baseline) of mean"
        self.probe_recall_delta = Gauge(
            "ragmon_probe_recall_delta_ratio", f"{delta} recall@k", [*g, "k"], registry=r
        )
        self.probe_recall_delta_lower = Gauge(
            "ragmon_probe_recall_delta_lower_ratio",
            "lower bound of the bootstrap interval of the recall@k delta vs the baseline",
            [*g, "k"],
            registry=r,
        )
        self.probe_recall_delta_upper = Gauge(
            "ragmon_probe_recall_delta_upper_ratio",
            "upper bound of the bootstrap interval of the recall@k delta vs the baseline",
            [*g, "k"],
            registry=r,
        )
        self.probe_mrr_delta = Gauge(
            "ragmon_probe_mrr_delta_ratio", f"{delta} reciprocal rank", g, registry=r
        )
        self.probe_mrr_delta_lower = Gauge(
            "ragmon_probe_mrr_delta_lower_ratio",
            "lower bound of the bootstrap interval of the MRR delta vs the baseline",
            g,
            registry=r,
        )
        self.probe_mrr_delta_upper = Gauge(
            "ragmon_probe_mrr_delta_upper_ratio",
            "upper bound of the bootstrap interval of the MRR delta vs the baseline",
            g,
            registry=r,
        )
        # label tuples each gauge holds per (tenant and) golden label, so a new run can drop the series
        # it no longer has
        self.probe_series: dict[tuple[str, ...], dict[str, set[tuple[str, ...]]]] = {}

    def _scoped(self, tenant: str | None, app: str | None) -> tuple[tuple[str, ...], LabelBudget]:
        """`scope(tenant, app)` and the label budget of the tenant's label value."""
        tenant_value = "" if self.tenant_label is None else self.tenant_label(tenant)
        budget = self._budgets.get(tenant_value)
        if budget is None:
            with self._budgets_lock:
                budget = self._budgets.setdefault(tenant_value, LabelBudget(self._label_config))
        app_value = budget.app(app)
        return ((app_value,) if self.tenant_label is None else (tenant_value, app_value)), budget

    def _named_tenants(self) -> list[str]:
        return sorted(self.tenant_label.allowed) if self.tenant_label is not None else []

    def tenant_scope(self, tenant: str | None) -> tuple[str, ...]:
        """The values of `tenant_scope_labels` for one tenant: its label value, or nothing."""
        return () if self.tenant_label is None else (self.tenant_label(tenant),)

    def count_deferred(self, tenant: str, count: int) -> None:
        """`count` of the tenant's traces deferred by the judge budget for the first time."""
        scope = self.tenant_scope(tenant)
        (self.judge_deferred.labels(*scope) if scope else self.judge_deferred).inc(count)

    def count_expired(self, tenant: str, count: int) -> None:
        """`count` of the tenant's deferred traces that ended skipped (`max_deferral_s` passed)."""
        self.judge_skipped.labels(*self.tenant_scope(tenant), EXPIRED).inc(count)

    def probe_scope(self, tenant: str | None, golden: str) -> tuple[tuple[str, ...], LabelBudget]:
        """The values of `tenant_scope_labels` and `golden` for one tenant's golden set, and the
        tenant's label budget (for the set's categories)."""
        (*tenant_value, _), budget = self._scoped(tenant, None)
        return (*tenant_value, budget.golden(golden)), budget

    def label_budget(self, tenant: str | None) -> LabelBudget:
        """The tenant's own caps of app, model, intent and release values (one set for every tenant
        when the metrics carry no tenant label)."""
        return self._scoped(tenant, None)[1]

    def scope(self, tenant: str | None, app: str | None) -> tuple[str, ...]:
        """The bounded values of `scope_labels` for one tenant's app, in declaration order: the
        tenant's own label value and an app value from the tenant's own cap."""
        return self._scoped(tenant, app)[0]

    def scope_kw(self, tenant: str | None, app: str | None) -> dict[str, str]:
        """`scope` as keyword label values, for `metric.labels(**...)`."""
        return dict(zip(self.scope_labels, self.scope(tenant, app), strict=True))

    def model_label(self, tenant: str | None, model: str | None) -> str:
        return self.label_budget(tenant).model(model)

    def intent_label(self, tenant: str | None, intent: str | None) -> str:
        return self.label_budget(tenant).intent(intent)

    def release_label(self, tenant: str | None, release: str | None) -> str:
        return self.label_budget(tenant).release(release)

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
