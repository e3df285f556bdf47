"""The metrics of the capabilities around the trace counters, one class per area.

`Metrics` (service/metrics.py) derives from every class here; each declares its area's
series in `_declare_<area>_metrics`, which `Metrics.__init__` calls in a fixed order (the
order of the registry, hence of a scrape). Review: reviews and the scrape-time review
and calibration gauges; drift; Kafka (distributed mode); Phoenix (the tee and annotations);
probes (golden-set runs). The judge's area (`JudgeMetrics`: sampling, judging, the
faithfulness estimates and their human-corrected readings) is in service/metric_judge.py,
re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from prometheus_client import Counter, Gauge

from service.config import MetricsConfig
from service.metric_base import MetricsBase
from service.metric_judge import JUDGE_HUMAN_GAUGES as JUDGE_HUMAN_GAUGES
from service.metric_judge import JudgeMetrics as JudgeMetrics
from service.metric_tally import LabelledValues

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


class ReviewMetrics(MetricsBase):
    """Human review: reviews recorded, and the review and calibration gauges read at scrape time."""

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


class DriftMetrics(MetricsBase):
    """Drift detectors' results and the regeneration-rate control band."""

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


class KafkaMetrics(MetricsBase):
    """Distributed mode: what ingest published, what workers consumed, and how far behind they are."""

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
        self.kafka_producer_compression = Gauge(
            "ragmon_kafka_producer_compression_info",
            "1 for the codec ingest's producer compresses with now (kafka.compression, or gzip where zstd "
            "could not be used: no zstandard package, or a broker that does not take it); 0 for the others",
            ["codec"],
            registry=r,
        )


class PhoenixMetrics(MetricsBase):
    """The tee to Arize Phoenix and the annotations written there."""

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


class ProbeMetrics(MetricsBase):
    """Golden-set probe runs: the latest scored run of each golden set, and its delta vs the baseline."""

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
