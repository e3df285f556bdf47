"""The overview dashboard: what users of each RAG app get (traffic, latency, tokens and cost,
regeneration and feedback, the Kafka path).
"""

from __future__ import annotations

from typing import Any

from dashboards.alerts import BACK_PRESSURE_SERIES
from dashboards.grafana_board import APPS, Board, Limit
from dashboards.thresholds import Thresholds

__all__ = ["overview"]


def _q(quantile_metric: str, q: str, extra: str = "") -> str:
    return f'max by (tenant, app{extra}) ({quantile_metric}{{quantile="{q}",{APPS}}})'


def overview(t: Thresholds) -> dict[str, Any]:
    """Traffic, per-stage latency percentiles, TTFT, tokens, cost per query, regeneration and feedback."""
    job = t.job
    slo = t.latency.stage_p95_seconds
    stage = "app_stage_quantile:ragmon_stage_duration_seconds:histogram_quantile_rate5m"
    ttft = "app_quantile:ragmon_ttft_seconds:histogram_quantile_rate5m"
    cost = "app_quantile:ragmon_trace_cost_usd:histogram_quantile_rate1h"
    b = Board(
        t, "ragmon / overview", "ragmon-overview", "What users of each RAG app get: traffic, speed, cost."
    )
    b.row("Traffic")
    b.single(
        "ragmon targets up",
        "scraped ragmon processes",
        "none",
        [(f'sum(up{{job="{job}"}})', "up")],
        runbooks=["RagmonDown"],
    )
    b.single(
        "Traces per second",
        "all selected apps, last 5m",
        "reqps",
        [(f"sum(app:ragmon_traces:rate5m{{{APPS}}})", "")],
        runbooks=["RagmonNoTraces"],
    )
    b.single(
        "Ingest refusals per second",
        "spans, traces or requests refused at ingest",
        "reqps",
        [("sum(job:ragmon_ingest_rejected:rate5m)", "")],
        runbooks=["RagmonIngestRejectionsSpiking"],
    )
    b.single(
        "Open-trace buffer",
        "use of the span assembler's bound (red from ingest.open_trace_buffer_fill_ratio)",
        "percentunit",
        [("max(ragmon_open_trace_buffer_fill_ratio)", "")],
        limit=Limit((t.ingest.open_trace_buffer_fill_ratio,)),
        runbooks=["RagmonOpenTraceBufferNearFull"],
    )
    b.series(
        "Traces per second by app",
        "",
        "reqps",
        [(f"sum by (tenant, app) (app:ragmon_traces:rate5m{{{APPS}}})", "{{app}}")],
    )
    b.series(
        "Traces per second by release",
        "the release with most traffic is the one alerts name",
        "reqps",
        [
            (
                f"sum by (tenant, app, release) (app_release:ragmon_release_traces:rate15m{{{APPS}}})",
                "{{app}} {{release}}",
            )
        ],
    )
    b.row("Latency")
    b.series(
        "p95 latency per stage",
        "5m window; dashed lines: the stage SLOs of thresholds.yaml ("
        + ", ".join(f"{s} {v:g}s" for s, v in slo.items() if s != "total")
        + ")",
        "s",
        [(_q(stage, "0.95", ", stage"), "{{app}} {{stage}}")],
        limit=Limit(tuple(v for s, v in slo.items() if s != "total")),
        runbooks=["RagmonStageLatencyHigh"],
    )
    b.series(
        "End-to-end latency p50 / p95 / p99",
        "stage=total; dashed line: the p95 SLO (latency.stage_p95_seconds.total)",
        "s",
        [
            (f'max by (tenant, app) ({stage}{{quantile="{q}",stage="total",{APPS}}})', f"{{{{app}}}} {label}")
            for q, label in (("0.5", "p50"), ("0.95", "p95"), ("0.99", "p99"))
        ],
        limit=Limit((slo["total"],)),
        runbooks=["RagmonLatencyHigh"],
    )
    b.series(
        "Time to first token p50 / p95 / p99",
        "dashed line: the p95 SLO (latency.ttft_p95_seconds)",
        "s",
        [
            (_q(ttft, q), f"{{{{app}}}} {label}")
            for q, label in (("0.5", "p50"), ("0.95", "p95"), ("0.99", "p99"))
        ],
        limit=Limit((t.latency.ttft_p95_seconds,)),
        runbooks=["RagmonTimeToFirstTokenHigh"],
    )
    b.series(
        "Chunks retrieved per trace (mean)",
        "",
        "none",
        [
            (
                f"sum by (tenant, app) (rate(ragmon_retrieved_chunks_sum{{{APPS}}}[$__rate_interval]))"
                f" / sum by (tenant, app) (rate(ragmon_retrieved_chunks_count{{{APPS}}}[$__rate_interval]))",
                "{{app}}",
            )
        ],
    )
    b.row("Tokens and cost")
    b.series(
        "Tokens per second",
        "by model and kind",
        "short",
        [
            (
                f"sum by (tenant, app, model, kind) (rate(ragmon_tokens_total{{{APPS}}}[$__rate_interval]))",
                "{{app}} {{model}} {{kind}}",
            )
        ],
    )
    b.series(
        "Cost per query p50 / p99",
        "1h window; dashed lines: the p50 and p99 budgets (cost.query_p50_usd, cost.query_p99_usd)",
        "currencyUSD",
        [(_q(cost, q), f"{{{{app}}}} {label}") for q, label in (("0.5", "p50"), ("0.99", "p99"))],
        limit=Limit((t.cost.query_p50_usd, t.cost.query_p99_usd)),
        runbooks=["RagmonCostPerQueryHigh"],
    )
    b.series(
        "Spend per hour",
        "app model calls (judge spend is on the quality dashboard)",
        "currencyUSD",
        [(f"3600 * sum by (tenant, app) (app:ragmon_cost_usd:rate1h{{{APPS}}})", "{{app}}")],
    )
    b.series(
        "Model calls with no known cost, per second",
        "unpriced: tokens but no app-sent cost and no price-table entry; unknown usage: no token counts"
        " at all (their traces are left out of the cost per trace)",
        "reqps",
        [
            (
                "sum by (tenant, app, model)"
                f" (rate(ragmon_unpriced_calls_total{{{APPS}}}[$__rate_interval]))",
                "unpriced {{app}} {{model}}",
            ),
            (
                "sum by (tenant, app, model)"
                f" (rate(ragmon_usage_unknown_calls_total{{{APPS}}}[$__rate_interval]))",
                "unknown usage {{app}} {{model}}",
            ),
        ],
    )
    b.row("Regeneration and feedback")
    b.series(
        "Regeneration rate",
        "regenerations per trace, 1h window (the control band is on the drift dashboard)",
        "percentunit",
        [(f"app:ragmon_regenerations_per_traces:ratio_rate1h{{{APPS}}}", "{{app}}")],
        runbooks=["RagmonRegenerationRateOutOfBand"],
    )
    b.series(
        "Feedback per minute",
        "",
        "short",
        [
            (
                "60 * sum by (tenant, app, rating)"
                f" (rate(ragmon_feedback_total{{{APPS}}}[$__rate_interval]))",
                "{{app}} {{rating}}",
            )
        ],
    )
    b.row("Pipeline")
    b.series(
        "Records not stored",
        "records a sink refused for good (dead letters: GET /api/v1/dead-letters) and Kafka records that did"
        " not decode (skipped); each line is data missing from every metric and report",
        "short",
        [
            (
                "sum by (kind) (increase(ragmon_dead_letters_total[$__rate_interval]))",
                "dead letters {{kind}}",
            ),
            (
                "sum by (topic) (increase(ragmon_kafka_bad_records_total[$__rate_interval]))",
                "undecodable {{topic}}",
            ),
        ],
        runbooks=["RagmonRecordsDeadLettered", "RagmonKafkaBadRecords"],
    )
    b.series(
        "Spans dropped after ingest, traces flushed early",
        "accepted spans dropped later, by reason (too_late: past assembler.late_window_s; duplicate;"
        " build_failed); traces the assembler flushed before their root span ended (idle, max_age,"
        " evicted: the open-trace buffer was full), per second",
        "reqps",
        [
            ("sum by (reason) (rate(ragmon_dropped_spans_total[$__rate_interval]))", "dropped {{reason}}"),
            (
                'sum by (reason) (rate(ragmon_assembled_traces_total{reason=~"idle|max_age|evicted"}'
                "[$__rate_interval]))",
                "flushed early {{reason}}",
            ),
        ],
        runbooks=["RagmonOpenTraceBufferNearFull"],
    )
    b.series(
        "Traces stored in parts",
        "traces first stored without their root span, those later completed by it, stored traces replaced by"
        " a fuller version, and spans that arrived after their trace's first flush, per second",
        "reqps",
        [
            (f"sum (rate(ragmon_partial_traces_total{{{APPS}}}[$__rate_interval]))", "stored partial"),
            (
                f"sum (rate(ragmon_partial_traces_completed_total{{{APPS}}}[$__rate_interval]))",
                "completed later",
            ),
            (f"sum (rate(ragmon_traces_updated_total{{{APPS}}}[$__rate_interval]))", "replaced"),
            ("sum (rate(ragmon_late_spans_total[$__rate_interval]))", "late spans"),
        ],
    )
    b.series(
        "Waiting to be stored",
        "embedded mode: acknowledged but not yet stored (the write-ahead log), traces complete but not yet"
        " built, records in the in-process bus and the bound at which ingest answers 503",
        "short",
        [
            ("sum by (instance) (ragmon_wal_unstored_records)", "acknowledged, unstored {{instance}}"),
            ("sum by (instance) (ragmon_build_backlog_traces)", "to build {{instance}}"),
            ("sum by (instance) (ragmon_bus_queue_depth)", "in the bus {{instance}}"),
            ("max by (instance) (ragmon_bus_capacity)", "503 above {{instance}}"),
        ],
        runbooks=["RagmonSinkStalled"],
    )
    b.series(
        "Requests answered 503",
        "requests refused with 503 + Retry-After, by reason (queue_full: the backlog above; wal_full,"
        " wal_unavailable: the write-ahead log; Kafka's refusals count as queue_full): the exporters retry,"
        " and one whose own queue fills drops spans before they reach ragmon",
        "reqps",
        [(f"sum by (reason) (rate({BACK_PRESSURE_SERIES}[$__rate_interval]))", "{{reason}}")],
        runbooks=["RagmonIngestBackPressure"],
    )
    b.series(
        "Sink failures per second",
        "batches a sink refused, by sink and kind (retryable: tried again; permanent: split down to the"
        " records refused for good)",
        "reqps",
        [("sum by (sink, kind) (rate(ragmon_sink_failures_total[$__rate_interval]))", "{{sink}} {{kind}}")],
        runbooks=["RagmonRecordsDeadLettered", "RagmonSinkStalled"],
    )
    b.series(
        "Ingest worker processes replaced",
        "decoder and builder processes that died and were replaced (the calls they held ran in the server"
        " process); a steady rise is a crash loop",
        "short",
        [("sum by (role) (increase(ragmon_ingest_pool_restarts_total[$__rate_interval]))", "{{role}}")],
        runbooks=["RagmonIngestWorkersCrashLooping"],
    )
    b.series(
        "Time since each sink last took a batch",
        "a sink that stopped taking batches (its store refuses, or it is stuck) grows here; no line before"
        " its first batch",
        "s",
        [("time() - max by (sink) (ragmon_sink_last_success_timestamp_seconds)", "{{sink}}")],
        runbooks=["RagmonNoTraces"],
    )
    b.row("Kafka (distributed mode)")
    b.series(
        "Ingest Kafka buffer",
        "records waiting for the broker's acknowledgement, as a share of kafka.buffer_records (503 at 1);"
        " 0 while the producer is unavailable; dashed line: ingest.kafka_buffer_fill_ratio",
        "percentunit",
        [
            ("max by (instance) (ragmon_kafka_buffer_fill_ratio)", "fill {{instance}}"),
            ("min by (instance) (ragmon_kafka_producer_available)", "available {{instance}}"),
            ("min by (instance) (ragmon_kafka_reachable)", "broker reachable {{instance}}"),
        ],
        limit=Limit((t.ingest.kafka_buffer_fill_ratio,)),
        runbooks=["RagmonKafkaBufferNearFull", "RagmonKafkaUnavailable", "RagmonKafkaUnreachable"],
    )
    b.series(
        "Kafka produce errors and refusals",
        "failed produce attempts (sent again on a new producer), requests answered 503 for Kafka, and"
        " consumer offset commits that failed (the records are read again, not lost)",
        "reqps",
        [
            (
                "sum by (topic) (rate(ragmon_kafka_produce_errors_total[$__rate_interval]))",
                "errors {{topic}}",
            ),
            (
                "sum by (reason) (rate(ragmon_kafka_publish_refused_total[$__rate_interval]))",
                "503 {{reason}}",
            ),
            ("sum (rate(ragmon_kafka_producer_rebuilds_total[$__rate_interval]))", "producer rebuilds"),
            (
                "sum by (group) (rate(ragmon_kafka_commit_failures_total[$__rate_interval]))",
                "commit failures {{group}}",
            ),
        ],
        runbooks=["RagmonKafkaProduceErrors"],
    )
    b.series(
        "Kafka consumer lag",
        "backlog: records per group and topic not yet stored (high watermark minus the committed offset,"
        " measured from the broker; no line while it is unreachable); unread: past the workers' read"
        " positions; spans records held uncommitted by open traces; dashed line:"
        " ingest.kafka_consumer_lag_records",
        "short",
        [
            (
                "sum by (group, topic) (max without (instance) (ragmon_kafka_backlog_records))",
                "backlog {{group}} {{topic}}",
            ),
            ("sum by (group, topic) (ragmon_kafka_consumer_lag)", "unread {{group}} {{topic}}"),
            ("sum (ragmon_kafka_spans_held_records)", "spans held"),
        ],
        limit=Limit((t.ingest.kafka_consumer_lag_records,)),
        runbooks=["RagmonKafkaConsumerLagHigh"],
    )
    return b.json()
