"""Every recording rule and alert ragmon ships, each defined once, as data.

`rule_groups(thresholds)` is the single definition; `prometheus_rules` turns
it into a Prometheus rule file and `grafana_alerting` into Grafana-managed
rules, so the two can never disagree. Alerts on per-app series carry the
`release` with the most traffic in the last 15 minutes (joined from
`ragmon_release_traces_total`); faithfulness is estimated per release and
carries its own. An app with no release series still alerts, without one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dashboards.thresholds import Thresholds

__all__ = [
    "BACK_PRESSURE_REASONS",
    "BACK_PRESSURE_SERIES",
    "RELEASE_JOIN",
    "Alert",
    "Recording",
    "RuleGroup",
    "alerts",
    "prometheus_rules",
    "rule_groups",
]

Severity = Literal["critical", "warning", "info"]
RELEASE_JOIN = "app_release:ragmon_release_traces:count_topk1_rate15m"
# An app in a description: "shop", or "shop (tenant acme)" with metrics.tenant_label.
_APP_NAME = "{{ $labels.app }}{{ with $labels.tenant }} (tenant {{ . }}){{ end }}"
# Appended to a description: ", release X" when the alert carries one.
_RELEASE = "{{ with $labels.release }}, release {{ . }}{{ end }}"
_QUANTILES = {"0.5": "p50", "0.95": "p95", "0.99": "p99"}
# The reasons ingest counts for a request it answers 503 + Retry-After (every `RetryableError` of
# service/errors.py, service/ingest/wal.py; a test holds the list to them).
BACK_PRESSURE_REASONS = ("queue_full", "wal_full", "wal_unavailable", "store_unavailable", "unavailable")
BACK_PRESSURE_SERIES = f'ragmon_ingest_rejected_total{{reason=~"{"|".join(BACK_PRESSURE_REASONS)}"}}'
# a sink that refused batches over the last 5 minutes (retryable or permanent)
_SINK_FAILING = "sum without (kind) (rate(ragmon_sink_failures_total[5m])) > 0"


@dataclass(frozen=True)
class Recording:
    """A recording rule: `record` is named level:metric:operations."""

    record: str
    expr: str
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Alert:
    """One alert: severity, static summary, templated description; runbook and `for` from thresholds."""

    name: str
    expr: str
    severity: Severity
    summary: str
    description: str
    for_: str | None = None  # None: the thresholds file's `for`
    query_note: str = ""
    """Appended to the description in rules.yml only: it reads other series with Prometheus' template
    `query`, which Grafana's alerting templates do not have."""


@dataclass(frozen=True)
class RuleGroup:
    """A Prometheus rule group (rules run in order, so recordings precede the alerts that read them)."""

    name: str
    rules: tuple[Recording | Alert, ...]


def _seconds(value: float) -> str:
    return f"{value * 1000:g}ms" if value < 1 else f"{value:g}s"


def _with_release(expr: str) -> str:
    """`expr` (per-app series) with the app's current release as a label, or unchanged when it has none."""
    # `tenant` joins too: with metrics.tenant_label two tenants may run apps of the same name (and
    # without it the label is absent on both sides, so the join is the same as on app alone)
    return (
        f"(\n  {expr}\n) * on (tenant, app) group_left (release) {RELEASE_JOIN}\n"
        f"or on (tenant, app)\n(\n  {expr}\n)"
    )


def _quantiles(level: str, metric: str, window: str, quantiles: Sequence[str]) -> list[Recording]:
    bucket = Recording(
        f"{level}_le:{metric}_bucket:rate{window}",
        f"sum without (instance) (rate({metric}_bucket[{window}]))",
    )
    return [bucket] + [
        Recording(
            f"{level}_quantile:{metric}:histogram_quantile_rate{window}",
            f"histogram_quantile({q}, {bucket.record})",
            {"quantile": q},
        )
        for q in quantiles
    ]


def _recordings() -> list[RuleGroup]:
    traffic = [
        Recording("app:ragmon_traces:rate5m", "sum without (instance) (rate(ragmon_traces_total[5m]))"),
        Recording(
            "app_release:ragmon_release_traces:rate15m",
            "sum without (instance) (rate(ragmon_release_traces_total[15m]))",
        ),
        # Exactly one series per app (value 1): the release that served most traces lately.
        Recording(
            RELEASE_JOIN,
            "count by (tenant, app, release)"
            " (topk by (tenant, app) (1, app_release:ragmon_release_traces:rate15m))",
        ),
        *_quantiles("app_stage", "ragmon_stage_duration_seconds", "5m", ["0.5", "0.95", "0.99"]),
        *_quantiles("app", "ragmon_ttft_seconds", "5m", ["0.5", "0.95", "0.99"]),
        *_quantiles("app", "ragmon_trace_cost_usd", "1h", ["0.5", "0.99"]),
        Recording(
            "app:ragmon_cost_usd:rate1h", "sum without (instance, model) (rate(ragmon_cost_usd_total[1h]))"
        ),
        Recording(
            "app:ragmon_regenerations:rate1h",
            "sum without (instance, intent, source) (rate(ragmon_regenerations_total[1h]))",
        ),
        Recording(
            "app:ragmon_intent_traces:rate1h",
            "sum without (instance, intent) (rate(ragmon_intent_traces_total[1h]))",
        ),
        Recording(
            "app:ragmon_regenerations_per_traces:ratio_rate1h",
            "app:ragmon_regenerations:rate1h / app:ragmon_intent_traces:rate1h",
        ),
    ]
    pipeline = [
        Recording(
            "job:ragmon_judge_cost_usd:increase1d",
            "sum without (instance, judge) (increase(ragmon_judge_cost_usd_total[1d]))",
        ),
        Recording(
            "job:ragmon_judge_failures:rate15m",
            "sum without (instance, reason) (rate(ragmon_judge_failures_total[15m]))",
        ),
        Recording(
            "job:ragmon_judge_requests:rate15m",
            "sum without (instance, judge) (rate(ragmon_judge_requests_total[15m]))",
        ),
        Recording(
            "job:ragmon_judge_failures_per_requests:ratio_rate15m",
            "job:ragmon_judge_failures:rate15m / job:ragmon_judge_requests:rate15m",
        ),
        Recording(
            "job:ragmon_ingest_rejected:rate5m",
            "sum without (instance, reason) (rate(ragmon_ingest_rejected_total[5m]))",
        ),
        Recording(
            "job:ragmon_spans_received:rate5m",
            "sum without (instance, receiver) (rate(ragmon_spans_received_total[5m]))",
        ),
        Recording(
            "job:ragmon_ingest_rejected_per_received:ratio_rate5m",
            "job:ragmon_ingest_rejected:rate5m\n"
            "/ (job:ragmon_spans_received:rate5m + job:ragmon_ingest_rejected:rate5m)",
        ),
    ]
    return [
        RuleGroup("ragmon.traffic.recording", tuple(traffic)),
        RuleGroup("ragmon.pipeline.recording", tuple(pipeline)),
    ]


def _latency_cost(t: Thresholds) -> list[Alert]:
    slo = t.latency.stage_p95_seconds
    p95 = 'app_stage_quantile:ragmon_stage_duration_seconds:histogram_quantile_rate5m{quantile="0.95"'
    stages = [s for s in slo if s != "total"]
    stage_expr = "\nor\n".join(f'{p95},stage="{s}"}} > {slo[s]:g}' for s in stages)
    cost = "app_quantile:ragmon_trace_cost_usd:histogram_quantile_rate1h"
    return [
        Alert(
            "RagmonLatencyHigh",
            _with_release(f'{p95},stage="total"}} > {slo["total"]:g}'),
            "critical",
            "RAG answers are slower than the latency SLO",
            "p95 end-to-end latency of "
            + _APP_NAME
            + _RELEASE
            + " is {{ $value | humanizeDuration }} over the last 5m; the SLO is "
            + _seconds(slo["total"])
            + ".",
        ),
        Alert(
            "RagmonStageLatencyHigh",
            _with_release(f"({stage_expr})".replace("\n", "\n  ")),
            "warning",
            "A RAG stage is slower than its latency SLO",
            "p95 {{ $labels.stage }} latency of "
            + _APP_NAME
            + _RELEASE
            + " is {{ $value | humanizeDuration }} over the last 5m; SLOs: "
            + ", ".join(f"{s} {_seconds(slo[s])}" for s in stages)
            + ".",
        ),
        Alert(
            "RagmonTimeToFirstTokenHigh",
            _with_release(
                'app_quantile:ragmon_ttft_seconds:histogram_quantile_rate5m{quantile="0.95"}'
                f" > {t.latency.ttft_p95_seconds:g}"
            ),
            "warning",
            "Time to first token is over its SLO",
            "p95 time to first token of "
            + _APP_NAME
            + _RELEASE
            + " is {{ $value | humanizeDuration }} over the last 5m; the SLO is "
            + _seconds(t.latency.ttft_p95_seconds)
            + ".",
        ),
        Alert(
            "RagmonCostPerQueryHigh",
            _with_release(
                f'({cost}{{quantile="0.5"}} > {t.cost.query_p50_usd:g}'
                f'\n  or {cost}{{quantile="0.99"}} > {t.cost.query_p99_usd:g})'
            ),
            "warning",
            "Cost per query is over budget",
            "Over the last hour the {{ $labels.quantile }} quantile of cost per query of "
            + _APP_NAME
            + _RELEASE
            + ' is ${{ printf "%.4f" $value }}; budgets: p50 $'
            + f"{t.cost.query_p50_usd:g}, p99 ${t.cost.query_p99_usd:g}.",
        ),
        Alert(
            "RagmonJudgeSpendOverBudget",
            f"job:ragmon_judge_cost_usd:increase1d > {t.cost.judge_usd_per_day:g}",
            "warning",
            "Judge spend is over its daily budget",
            'The judge spent ${{ printf "%.2f" $value }} in the last 24h; the budget is $'
            + f"{t.cost.judge_usd_per_day:g} per day.",
        ),
    ]


def _quality(t: Thresholds) -> list[Alert]:
    rate = "max without (instance) (ragmon_regeneration_rate_ratio)"
    return [
        Alert(
            "RagmonRegenerationRateOutOfBand",
            _with_release(
                f"({rate} > max without (instance) (ragmon_regeneration_band_upper_ratio)"
                f"\n  or {rate} < min without (instance) (ragmon_regeneration_band_lower_ratio))"
            ),
            "warning",
            "The regeneration rate left its control band",
            "Users of "
            + _APP_NAME
            + " (intent {{ $labels.intent }})"
            + _RELEASE
            + " regenerate {{ $value | humanizePercentage }} of answers,"
            " outside the control band for this window.",
        ),
        Alert(
            "RagmonFaithfulnessLow",
            f"(\n  {_faithfulness_upper()}\n) < {t.faithfulness.upper_bound_min:g}",
            "critical",
            "Answers are unfaithful to their sources",
            "Faithfulness of " + _APP_NAME + ", release {{ $labels.release }} ({{ $labels.estimate }}"
            " estimate): even the upper bound of its 95% interval is {{ $value | humanizePercentage }},"
            + f" under {t.faithfulness.upper_bound_min:.0%}.",
        ),
        Alert(
            "RagmonJudgeHumanDisagreementRose",
            _with_release(
                "max without (instance) (ragmon_judge_human_disagreement_p_value)"
                f" < {t.judge.human_disagreement_alpha:g}"
                "\n  and (1 - max without (instance) (ragmon_judge_human_agreement_ratio))"
                "\n  - max without (instance) (ragmon_judge_human_disagreement_reference_ratio)"
                f" > {t.judge.human_disagreement_increase_min:g}"
            ),
            "warning",
            "The judge and the reviewers part ways",
            "On the blind sample of "
            + _APP_NAME
            + _RELEASE
            + ", judge and reviewers disagree more often than in the reference period before the"
            ' window (one-sided Fisher exact p = {{ $value | printf "%.2g" }}, alpha '
            + f"{t.judge.human_disagreement_alpha:g}, an increase over "
            + f"{t.judge.human_disagreement_increase_min:.0%}).",
        ),
    ]


def _faithfulness_upper() -> str:
    """Each release's faithfulness upper bound: the human-corrected one where it exists, else the
    judge's own, with an `estimate` label that says which."""
    selector = '{intent="all",release!="all"}'

    def named(metric: str, which: str) -> str:
        return f'label_replace(max without (instance) ({metric}{selector}), "estimate", "{which}", "", "")'

    return (
        f"{named('ragmon_faithfulness_corrected_estimate_upper', 'human-corrected')}"
        f"\n  or ignoring (estimate)\n  {named('ragmon_faithfulness_estimate_upper', 'judge-only')}"
    )


# An alert's templates see only its own series' labels, so the group that grew is read from its info
# series (service/drift/monitor.py: one per app and detector, replaced on each run) by a template query.
_TOP_GROUP = (
    # tenant="" matches the series without the label (metrics.tenant_label off)
    '{{ with printf "ragmon_drift_top_group_info{tenant=%q,app=%q,detector=%q}"'
    " $labels.tenant $labels.app $labels.detector | query }}"
    "{{ with first . }} Top group: {{ .Labels.terms }} ({{ .Labels.share }} of queries).{{ end }}{{ end }}"
)


def _drift(t: Thresholds) -> list[Alert]:
    def detected(names: Sequence[str]) -> str:
        return f'max without (instance) (ragmon_drift_detected{{detector=~"{"|".join(names)}"}}) == 1'

    d = t.drift
    return [
        Alert(
            "RagmonQueryDrift",
            _with_release(detected(d.query_detectors)),
            "warning",
            "User queries drifted from the reference",
            "Detector {{ $labels.detector }} finds the queries of "
            + _APP_NAME
            + _RELEASE
            + " drifted from the pinned reference window.",
            query_note=_TOP_GROUP,
        ),
        Alert(
            "RagmonRetrievalScoreDrift",
            _with_release(detected(d.retrieval_detectors)),
            "warning",
            "Retrieval results drifted from the reference",
            "Detector {{ $labels.detector }} finds the retrieval results of "
            + _APP_NAME
            + _RELEASE
            + " drifted from the pinned reference window.",
        ),
        Alert(
            "RagmonEmbeddingModelChanged",
            _with_release(
                f"({detected(d.model_change_detectors)}\n  or on (tenant, app) sum without (instance) "
                f"(increase(ragmon_embedding_model_changes_total[{d.model_change_window}])) > 0)"
            ),
            "info",
            "A new query-embedding model appeared",
            _APP_NAME + _RELEASE + " sends query embeddings from a new model or dimension; "
            "embedding drift tests against the old reference mean little until it is re-pinned.",
        ),
    ]


def _probes(t: Thresholds) -> list[Alert]:
    p = t.probes

    def dropped(gauge: str, selector: str, budget: float) -> str:
        # the drop is beyond the budget AND the whole interval is below 0 (not noise)
        return (
            f"max without (instance) ({gauge}{selector}) < -{budget:g}\n"
            f"and max without (instance) ({gauge.replace('_delta_', '_delta_upper_')}{selector}) < 0"
        )

    return [
        Alert(
            "RagmonProbeRecallDropped",
            dropped("ragmon_probe_recall_delta_ratio", f'{{k="{p.recall_k}"}}', p.recall_drop_budget),
            "warning",
            "Golden-probe recall fell below the baseline run",
            "recall@{{ $labels.k }} of the golden set {{ $labels.golden }} changed by"
            " {{ $value | humanizePercentage }} against the pinned baseline run (budget "
            + f"{p.recall_drop_budget:.0%}), and the paired interval of the change excludes 0.",
        ),
        Alert(
            "RagmonProbeMrrDropped",
            dropped("ragmon_probe_mrr_delta_ratio", "", p.mrr_drop_budget),
            "warning",
            "Golden-probe MRR fell below the baseline run",
            "MRR of the golden set {{ $labels.golden }} moved by {{ $value | humanizePercentage }}"
            " against the pinned baseline run (budget "
            + f"{p.mrr_drop_budget:.0%}), and the paired interval of the change excludes 0.",
        ),
        Alert(
            "RagmonProbeFilterFalseExclusionHigh",
            "max without (instance) (ragmon_probe_filter_false_exclusion_ratio)"
            f" > {p.false_exclusion_ratio:g}",
            "warning",
            "The retrieval filter excludes the right documents",
            "In the latest probe run of the golden set {{ $labels.golden }}, the filter excluded every"
            " eligible gold chunk of {{ $value | humanizePercentage }} of the questions (threshold "
            + f"{p.false_exclusion_ratio:.0%}).",
        ),
    ]


def _pipeline(t: Thresholds) -> list[Alert]:
    depth = "max without (instance) (ragmon_judge_queue_depth)"
    j, i = t.judge, t.ingest
    return [
        Alert(
            "RagmonJudgeQueueBacklogGrowing",
            f"{depth} > {j.backlog_min_items}\nand max without (instance) "
            f"(delta(ragmon_judge_queue_depth[{j.backlog_window}])) > 0",
            "warning",
            "The judge queue is growing",
            "The judge queue holds {{ $value }} items and grew over the last "
            + j.backlog_window
            + "; judging falls behind the sampled traffic.",
        ),
        Alert(
            "RagmonJudgeStalled",
            "time() - max without (instance) (ragmon_judge_last_success_timestamp_seconds)"
            f" > {j.stalled_after_seconds:g}\nand {depth} > 0",
            "warning",
            "The judge stores no judgments while work is queued",
            "No judgment was stored for {{ $value | humanizeDuration }} while the judge queue is not empty.",
        ),
        Alert(
            "RagmonJudgeFailureRateHigh",
            f"job:ragmon_judge_failures_per_requests:ratio_rate15m > {j.failure_ratio:g}",
            "warning",
            "Judge calls are failing",
            "{{ $value | humanizePercentage }} failures per judge call over the last 15m"
            + f" (threshold {j.failure_ratio:.0%}); see ragmon_judge_failures_total by reason.",
        ),
        Alert(
            "RagmonReviewQueueStale",
            "max without (instance) (ragmon_review_oldest_open_age_seconds)"
            f" > {j.review_oldest_open_seconds:g}",
            "warning",
            "Review items wait too long for a reviewer",
            "The oldest open item of the {{ $labels.queue }} review queue has waited"
            " {{ $value | humanizeDuration }}: the reviewer-corrected faithfulness estimate and the judge's"
            " calibration lag the traffic.",
        ),
        Alert(
            "RagmonIngestRejectionsSpiking",
            f"job:ragmon_ingest_rejected_per_received:ratio_rate5m > {i.rejected_ratio:g}"
            f"\nand job:ragmon_ingest_rejected:rate5m > {i.rejected_min_per_second:g}",
            "warning",
            "Ingest refuses many spans or requests",
            "{{ $value | humanizePercentage }} of what reached ingest was refused over the last 5m"
            + f" (threshold {i.rejected_ratio:.0%}); see ragmon_ingest_rejected_total by reason.",
        ),
        Alert(
            "RagmonIngestBackPressure",
            f"sum without (instance, reason) (rate({BACK_PRESSURE_SERIES}[5m]))"
            f" > {i.backpressure_min_per_second:g}",
            "warning",
            "Ingest answers 503: it takes traffic slower than it arrives",
            'Ingest answered {{ printf "%.2f" $value }} requests/s with 503 + Retry-After over the last 5m'
            " (ragmon_ingest_rejected_total by reason: queue_full, wal_full, wal_unavailable, ...). Nothing"
            " refused was acknowledged and the exporters retry, but an exporter whose own queue fills"
            " meanwhile drops spans before they reach ragmon.",
        ),
        Alert(
            "RagmonSinkStalled",
            # failing and no batch taken for the window, or failing and no batch taken since the process
            # started (the gauge appears with a sink's first batch)
            f"(time() - ragmon_sink_last_success_timestamp_seconds > {i.sink_stalled_seconds:g})\n"
            f"and on (instance, sink) ({_SINK_FAILING})\n"
            f"or ({_SINK_FAILING}\n"
            "unless on (instance, sink) ragmon_sink_last_success_timestamp_seconds)",
            "critical",
            "A sink keeps failing and stores nothing",
            "The {{ $labels.sink }} sink of {{ $labels.instance }} keeps failing and has taken no batch for"
            f" over {i.sink_stalled_seconds / 60:g} minutes (or none since the process started): what was"
            " acknowledged waits (write-ahead log, bus or Kafka) and is stored once the sink recovers; at"
            " bus.capacity ingest answers 503.",
        ),
        Alert(
            "RagmonIngestWorkersCrashLooping",
            f"increase(ragmon_ingest_pool_restarts_total[15m]) > {i.worker_restarts_15m:g}",
            "warning",
            "Ingest worker processes keep dying",
            "{{ $value | humanize }} {{ $labels.role }} processes of {{ $labels.instance }} died and were"
            " replaced in the last 15m: the calls each held ran again in the server process (nothing lost),"
            " but a crash loop costs every request that time; out of memory (the pod's limit) or a bug.",
        ),
        Alert(
            "RagmonOpenTraceBufferNearFull",
            f"ragmon_open_trace_buffer_fill_ratio > {i.open_trace_buffer_fill_ratio:g}",
            "warning",
            "The open-trace buffer is nearly full",
            "The open-trace buffer of {{ $labels.instance }} is {{ $value | humanizePercentage }} full;"
            " when full, traces are flushed early without their late spans.",
        ),
        Alert(
            "RagmonKafkaUnavailable",
            "ragmon_kafka_producer_available == 0",
            "critical",
            "Ingest cannot publish to Kafka",
            "Ingest {{ $labels.instance }} cannot publish to Kafka: it answers 503 + Retry-After (the"
            " exporters retry) and stays ready, so callers get that answer; nothing is acknowledged that"
            " the broker does not hold.",
        ),
        Alert(
            "RagmonKafkaUnreachable",
            "time() - max without (instance) (ragmon_kafka_last_contact_timestamp_seconds)"
            f" > {i.kafka_unreachable_seconds:g}",
            "critical",
            "No ragmon process reaches Kafka",
            "No ingest replica or sinks worker has reached the Kafka broker for"
            " {{ $value | humanizeDuration }}: ingest answers 503, nothing is stored, and the backlog cannot"
            " be measured (its series are absent, not 0).",
        ),
        Alert(
            "RagmonKafkaBufferNearFull",
            f"ragmon_kafka_buffer_fill_ratio > {i.kafka_buffer_fill_ratio:g}",
            "warning",
            "Ingest's Kafka buffer is nearly full",
            "The Kafka buffer of {{ $labels.instance }} is {{ $value | humanizePercentage }} full: the broker"
            " acknowledges slower than traffic arrives; when full, ingest answers 503.",
        ),
        Alert(
            "RagmonKafkaProduceErrors",
            "sum without (instance, topic) (rate(ragmon_kafka_produce_errors_total[5m])) > 0",
            "warning",
            "Kafka produce attempts fail",
            "Produce attempts fail at {{ $value | humanize }}/s: records wait and are sent again on a new"
            " producer; callers past kafka.publish_timeout_s were answered 503.",
        ),
        Alert(
            "RagmonKafkaBadRecords",
            "sum without (instance, topic) (increase(ragmon_kafka_bad_records_total[15m])) > 0",
            "warning",
            "Kafka records could not be decoded",
            "{{ $value | humanize }} Kafka records did not decode over the last 15m and were skipped, not"
            " stored (ragmon_kafka_bad_records_total by topic): a producer other than ragmon's ingest, or an"
            " ingest newer than its workers.",
        ),
        Alert(
            "RagmonRecordsDeadLettered",
            "sum without (instance, kind) (increase(ragmon_dead_letters_total[15m])) > 0",
            "warning",
            "Records were refused for good",
            "{{ $value | humanize }} records were refused for good over the last 15m and set aside as dead"
            " letters instead of stored; GET /api/v1/dead-letters says which and why.",
        ),
        Alert(
            "RagmonKafkaConsumerLagHigh",
            # every ingest replica and sinks worker measures the same backlog: max over them, then the
            # partitions summed
            "sum without (partition) (max without (instance) (ragmon_kafka_backlog_records))"
            f" > {i.kafka_consumer_lag_records:g}",
            "warning",
            "Kafka consumers fall behind",
            "Consumer group {{ $labels.group }} has {{ $value | humanize }} records on"
            " {{ $labels.topic }} not yet stored (read or not): traces reach the store, metrics and judge"
            " later.",
        ),
        Alert(
            "RagmonDown",
            f'up{{job="{t.job}"}} == 0\nor absent(up{{job="{t.job}"}})',
            "critical",
            "ragmon is down or not scraped",
            "Prometheus cannot scrape ragmon{{ with $labels.instance }} at {{ . }}{{ end }}, or no "
            + f'target with job="{t.job}" exists: traces are not monitored.',
            for_="15m",
        ),
        Alert(
            "RagmonNoTraces",
            "sum without (instance, app) (rate(ragmon_traces_total[15m])) == 0\n"
            f'or (sum without (instance) (up{{job="{t.job}"}}) > 0 '
            "unless on (job) count without (instance, app) (ragmon_traces_total))",
            "warning",
            "ragmon receives no traces",
            "ragmon ({{ $labels.job }}) stored no trace in the last 15m: the apps stopped sending, or their"
            " exporters cannot reach ragmon.",
            for_="15m",
        ),
    ]


def rule_groups(t: Thresholds) -> list[RuleGroup]:
    """Every rule, in evaluation order: recordings first, then the alert groups."""
    return [
        *_recordings(),
        RuleGroup("ragmon.latency-cost.alerts", tuple(_latency_cost(t))),
        RuleGroup("ragmon.quality.alerts", tuple(_quality(t))),
        RuleGroup("ragmon.drift.alerts", tuple(_drift(t))),
        RuleGroup("ragmon.probes.alerts", tuple(_probes(t))),
        RuleGroup("ragmon.pipeline.alerts", tuple(_pipeline(t))),
    ]


def alerts(t: Thresholds) -> list[Alert]:
    """Every alert, in file order."""
    return [r for g in rule_groups(t) for r in g.rules if isinstance(r, Alert)]


def prometheus_rules(
    t: Thresholds, *, for_override: str | None = None, interval: str | None = None
) -> dict[str, Any]:
    """The Prometheus rule file as data. `for_override`/`interval` make the fast variant tests run."""
    groups: list[dict[str, Any]] = []
    for group in rule_groups(t):
        rules: list[dict[str, Any]] = []
        for rule in group.rules:
            if isinstance(rule, Recording):
                entry: dict[str, Any] = {"record": rule.record, "expr": rule.expr}
                if rule.labels:
                    entry["labels"] = dict(rule.labels)
            else:
                entry = {
                    "alert": rule.name,
                    "expr": rule.expr,
                    "for": for_override or rule.for_ or t.for_,
                    "labels": {"severity": rule.severity},
                    "annotations": {
                        "summary": rule.summary,
                        "description": rule.description + rule.query_note,
                        "runbook_url": t.runbook(rule.name),
                    },
                }
            rules.append(entry)
        data: dict[str, Any] = {"name": group.name}
        if interval:
            data["interval"] = interval
        data["rules"] = rules
        groups.append(data)
    return {"groups": groups}
