"""The Grafana dashboards (overview, quality, drift), built as code with the pinned grafana-foundation-sdk.

Each builder returns a provisioning-ready dashboard as plain JSON data: a
Prometheus data-source picker, a `tenant` and an `app` variable on top, rows of panels
whose ids are unique and whose grid positions are set. Queries read the
recorded series of `rules.yml` where one exists, so dashboards and alerts
compute the same numbers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh, VariableSort

from dashboards.thresholds import load_thresholds

__all__ = ["DASHBOARDS", "drift", "overview", "quality"]

_DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
# `tenant` is empty (and matched by the "All" value) unless metrics.tenant_label is on
_APP = 'tenant=~"$tenant",app=~"$app"'
_Query = tuple[str, str]  # (PromQL, legend)


class _Board:
    """Collects panels, numbering them and sizing them half or full width."""

    def __init__(self, title: str, uid: str, description: str) -> None:
        self.next_id = 1
        self.board = (
            db.Dashboard(title)
            .uid(uid)
            .description(description)
            .tags(["ragmon"])
            .refresh("30s")
            .time("now-6h", "now")
            .timezone("browser")
            .editable()
            .with_variable(db.DatasourceVariable("datasource").label("Data source").type("prometheus"))
            .with_variable(
                db.QueryVariable("tenant")
                .label("Tenant")
                .description("set when ragmon runs with metrics.tenant_label; empty otherwise")
                .datasource(_DS)
                .query("label_values(ragmon_traces_total, tenant)")
                .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
                .multi(True)
                .include_all(True)
                .all_value(".*")
                .sort(VariableSort.ALPHABETICAL_ASC)
            )
            .with_variable(
                db.QueryVariable("app")
                .label("App")
                .datasource(_DS)
                .query("label_values(ragmon_traces_total, app)")
                .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
                .multi(True)
                .include_all(True)
                .all_value(".*")
                .sort(VariableSort.ALPHABETICAL_ASC)
            )
        )

    def row(self, title: str) -> _Board:
        self.board.with_row(db.Row(title).id(self._id()))
        return self

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def _targets(self, panel: Any, queries: list[_Query], instant: bool = False) -> Any:
        for n, (expr, legend) in enumerate(queries):
            query = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + n))
            panel = panel.with_target(query.instant() if instant else query)
        return panel

    def series(
        self, title: str, description: str, unit: str, queries: list[_Query], *, width: int = 12
    ) -> _Board:
        panel = (
            timeseries.Panel()
            .id(self._id())
            .title(title)
            .description(description)
            .datasource(_DS)
            .unit(unit)
            .span(width)
            .height(8)
        )
        self.board.with_panel(self._targets(panel, queries))
        return self

    def single(
        self, title: str, description: str, unit: str, queries: list[_Query], *, width: int = 6
    ) -> _Board:
        panel = (
            stat.Panel()
            .id(self._id())
            .title(title)
            .description(description)
            .datasource(_DS)
            .unit(unit)
            .span(width)
            .height(5)
        )
        self.board.with_panel(self._targets(panel, queries, instant=True))
        return self

    def json(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(json.dumps(self.board.build(), cls=JSONEncoder))
        return data


def _q(quantile_metric: str, q: str, extra: str = "") -> str:
    return f'max by (tenant, app{extra}) ({quantile_metric}{{quantile="{q}",{_APP}}})'


def overview() -> dict[str, Any]:
    """Traffic, per-stage latency percentiles, TTFT, tokens, cost per query, regeneration and feedback."""
    job = load_thresholds().job
    stage = "app_stage_quantile:ragmon_stage_duration_seconds:histogram_quantile_rate5m"
    ttft = "app_quantile:ragmon_ttft_seconds:histogram_quantile_rate5m"
    cost = "app_quantile:ragmon_trace_cost_usd:histogram_quantile_rate1h"
    b = _Board(
        "ragmon / overview", "ragmon-overview", "What users of each RAG app get: traffic, speed, cost."
    )
    b.row("Traffic")
    b.single("ragmon targets up", "scraped ragmon processes", "none", [(f'sum(up{{job="{job}"}})', "up")])
    b.single(
        "Traces per second",
        "all selected apps, last 5m",
        "reqps",
        [(f"sum(app:ragmon_traces:rate5m{{{_APP}}})", "")],
    )
    b.single(
        "Ingest refusals per second",
        "spans, traces or requests refused at ingest",
        "reqps",
        [("sum(job:ragmon_ingest_rejected:rate5m)", "")],
    )
    b.single(
        "Open-trace buffer",
        "use of the span assembler's bound (alert at 90%)",
        "percentunit",
        [("max(ragmon_open_trace_buffer_fill_ratio)", "")],
    )
    b.series(
        "Traces per second by app",
        "",
        "reqps",
        [(f"sum by (tenant, app) (app:ragmon_traces:rate5m{{{_APP}}})", "{{app}}")],
    )
    b.series(
        "Traces per second by release",
        "the release with most traffic is the one alerts name",
        "reqps",
        [
            (
                f"sum by (tenant, app, release) (app_release:ragmon_release_traces:rate15m{{{_APP}}})",
                "{{app}} {{release}}",
            )
        ],
    )
    b.row("Latency")
    b.series(
        "p95 latency per stage",
        "5m window; SLOs in dashboards/thresholds.yaml",
        "s",
        [(_q(stage, "0.95", ", stage"), "{{app}} {{stage}}")],
    )
    b.series(
        "End-to-end latency p50 / p95 / p99",
        "stage=total",
        "s",
        [
            (f'max by (tenant, app) ({stage}{{quantile="{q}",stage="total",{_APP}}})', f"{{{{app}}}} {label}")
            for q, label in (("0.5", "p50"), ("0.95", "p95"), ("0.99", "p99"))
        ],
    )
    b.series(
        "Time to first token p50 / p95 / p99",
        "",
        "s",
        [
            (_q(ttft, q), f"{{{{app}}}} {label}")
            for q, label in (("0.5", "p50"), ("0.95", "p95"), ("0.99", "p99"))
        ],
    )
    b.series(
        "Chunks retrieved per trace (mean)",
        "",
        "none",
        [
            (
                f"sum by (tenant, app) (rate(ragmon_retrieved_chunks_sum{{{_APP}}}[$__rate_interval]))"
                f" / sum by (tenant, app) (rate(ragmon_retrieved_chunks_count{{{_APP}}}[$__rate_interval]))",
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
                f"sum by (tenant, app, model, kind) (rate(ragmon_tokens_total{{{_APP}}}[$__rate_interval]))",
                "{{app}} {{model}} {{kind}}",
            )
        ],
    )
    b.series(
        "Cost per query p50 / p99",
        "1h window; budgets in dashboards/thresholds.yaml",
        "currencyUSD",
        [(_q(cost, q), f"{{{{app}}}} {label}") for q, label in (("0.5", "p50"), ("0.99", "p99"))],
    )
    b.series(
        "Spend per hour",
        "app model calls (judge spend is on the quality dashboard)",
        "currencyUSD",
        [(f"3600 * sum by (tenant, app) (app:ragmon_cost_usd:rate1h{{{_APP}}})", "{{app}}")],
    )
    b.series(
        "Model calls with no known cost, per second",
        "unpriced: tokens but no app-sent cost and no price-table entry; unknown usage: no token counts"
        " at all (their traces are left out of the cost per trace)",
        "reqps",
        [
            (
                "sum by (tenant, app, model)"
                f" (rate(ragmon_unpriced_calls_total{{{_APP}}}[$__rate_interval]))",
                "unpriced {{app}} {{model}}",
            ),
            (
                "sum by (tenant, app, model)"
                f" (rate(ragmon_usage_unknown_calls_total{{{_APP}}}[$__rate_interval]))",
                "unknown usage {{app}} {{model}}",
            ),
        ],
    )
    b.row("Regeneration and feedback")
    b.series(
        "Regeneration rate",
        "regenerations per trace, 1h window (the control band is on the drift dashboard)",
        "percentunit",
        [(f"app:ragmon_regenerations_per_traces:ratio_rate1h{{{_APP}}}", "{{app}}")],
    )
    b.series(
        "Feedback per minute",
        "",
        "short",
        [
            (
                "60 * sum by (tenant, app, rating)"
                f" (rate(ragmon_feedback_total{{{_APP}}}[$__rate_interval]))",
                "{{app}} {{rating}}",
            )
        ],
    )
    b.row("Kafka (distributed mode)")
    b.series(
        "Ingest Kafka buffer",
        "records waiting for the broker's acknowledgement, as a share of kafka.buffer_records (503 at 1);"
        " 0 while the producer is unavailable",
        "percentunit",
        [
            ("max by (instance) (ragmon_kafka_buffer_fill_ratio)", "fill {{instance}}"),
            ("min by (instance) (ragmon_kafka_producer_available)", "available {{instance}}"),
        ],
    )
    b.series(
        "Kafka produce errors and refusals",
        "failed produce attempts (sent again on a new producer) and requests answered 503 for Kafka",
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
        ],
    )
    b.series(
        "Kafka consumer lag",
        "records behind the high watermark per group and topic; spans records held uncommitted by open"
        " traces",
        "short",
        [
            ("sum by (group, topic) (ragmon_kafka_consumer_lag)", "{{group}} {{topic}}"),
            ("sum (ragmon_kafka_spans_held_records)", "spans held"),
        ],
    )
    return b.json()


def quality() -> dict[str, Any]:
    """Faithfulness with its interval, verdicts and diagnoses, judge cost and the judge queue."""
    b = _Board(
        "ragmon / quality", "ragmon-quality", "Judged faithfulness of the answers and the judge behind it."
    )
    est = f'{{release="all",intent="all",{_APP}}}'
    b.row("Faithfulness")
    b.series(
        "Faithfulness estimate with 95% interval",
        "Share of the answers' claims that the context supports (Hajek over the rolling window); "
        "alerts fire when the upper bound is under the threshold",
        "percentunit",
        [
            (f"max by (tenant, app) (ragmon_faithfulness_estimate{est})", "{{app}} estimate"),
            (f"max by (tenant, app) (ragmon_faithfulness_estimate_lower{est})", "{{app}} lower"),
            (f"max by (tenant, app) (ragmon_faithfulness_estimate_upper{est})", "{{app}} upper"),
        ],
    )
    b.series(
        "Faithful answers with 95% interval",
        "Share of answers with no unsupported claim, over the same judged answers: lower than the "
        "claim-level rate whenever some answers are partly supported",
        "percentunit",
        [
            (f"max by (tenant, app) (ragmon_faithful_answers_ratio{est})", "{{app}} estimate"),
            (f"max by (tenant, app) (ragmon_faithful_answers_ratio_lower{est})", "{{app}} lower"),
            (f"max by (tenant, app) (ragmon_faithful_answers_ratio_upper{est})", "{{app}} upper"),
        ],
    )
    b.series(
        "Faithfulness by release",
        "",
        "percentunit",
        [
            (
                "max by (tenant, app, release)"
                f' (ragmon_faithfulness_estimate{{intent="all",release!="all",{_APP}}})',
                "{{app}} {{release}}",
            )
        ],
    )
    b.series(
        "Faithfulness by intent",
        "",
        "percentunit",
        [
            (
                "max by (tenant, app, intent)"
                f' (ragmon_faithfulness_estimate{{release="all",intent!="all",{_APP}}})',
                "{{app}} {{intent}}",
            )
        ],
    )
    b.series(
        "Judged sample size",
        "scored judgments behind both readings, and answers without claims (in neither)",
        "short",
        [
            (f"max by (tenant, app) (ragmon_faithfulness_sample_size{est})", "{{app}} scored"),
            (f"max by (tenant, app) (ragmon_faithfulness_no_claims{est})", "{{app}} no claims"),
        ],
    )
    b.row("Verdicts and diagnoses")
    for title, metric, label in (
        ("Verdicts", "ragmon_judge_verdicts_total", "verdict"),
        ("Diagnoses", "ragmon_judge_diagnoses_total", "diagnosis"),
        ("Review flags", "ragmon_review_flags_total", "reason"),
    ):
        b.series(
            f"{title} per minute",
            "",
            "short",
            [
                (
                    f"60 * sum by (tenant, app, {label}) (rate({metric}{{{_APP}}}[$__rate_interval]))",
                    f"{{{{app}}}} {{{{{label}}}}}",
                )
            ],
            width=8,
        )
    b.row("Judge cost")
    b.single(
        "Judge spend, last 24h",
        "alert over the daily budget",
        "currencyUSD",
        [("sum(job:ragmon_judge_cost_usd:increase1d)", "")],
    )
    b.single(
        "Judge calls per minute",
        "",
        "short",
        [("60 * sum(rate(ragmon_judge_requests_total[$__rate_interval]))", "")],
    )
    b.single(
        "Judge failures per call",
        "15m window",
        "percentunit",
        [("max(job:ragmon_judge_failures_per_requests:ratio_rate15m)", "")],
    )
    b.single(
        "Judge p95 duration",
        "",
        "s",
        [
            (
                "histogram_quantile(0.95,"
                " sum by (le) (rate(ragmon_judge_duration_seconds_bucket[$__rate_interval])))",
                "",
            )
        ],
    )
    b.series(
        "Judge spend per hour",
        "",
        "currencyUSD",
        [("3600 * sum by (judge) (rate(ragmon_judge_cost_usd_total[$__rate_interval]))", "{{judge}}")],
    )
    b.series(
        "Judge tokens per second",
        "",
        "short",
        [("sum by (judge, kind) (rate(ragmon_judge_tokens_total[$__rate_interval]))", "{{judge}} {{kind}}")],
    )
    b.row("Judge queue")
    b.series(
        "Queue depth and failed items",
        "waiting or leased; failed items stay visible",
        "short",
        [
            ("max(ragmon_judge_queue_depth)", "depth"),
            ("max(ragmon_judge_queue_failed)", "failed"),
        ],
    )
    b.series(
        "Since the last judgment",
        "alert when the queue is not empty and this passes the stall limit",
        "s",
        [("time() - max(ragmon_judge_last_success_timestamp_seconds)", "since last judgment")],
    )
    b.series(
        "Sampled and skipped per minute",
        "traces put in the queue by stratum; traces the budget refused by reason",
        "short",
        [
            (
                "60 * sum by (stratum) (rate(ragmon_judge_sampled_total[$__rate_interval]))",
                "sampled {{stratum}}",
            ),
            (
                "60 * sum by (reason) (rate(ragmon_judge_skipped_total[$__rate_interval]))",
                "skipped {{reason}}",
            ),
        ],
    )
    b.series(
        "Judge failures per minute",
        "by reason",
        "short",
        [("60 * sum by (reason) (rate(ragmon_judge_failures_total[$__rate_interval]))", "{{reason}}")],
    )
    return b.json()


def drift() -> dict[str, Any]:
    """Drift statistics, p-values against alpha, last runs, model changes and the regeneration band."""
    b = _Board(
        "ragmon / drift", "ragmon-drift", "Query, retrieval and embedding drift against pinned references."
    )
    sel = f"{{{_APP}}}"
    b.row("Detectors")
    b.series(
        "Drift detected",
        "1 when the latest run (after hysteresis) says drift",
        "none",
        [(f"max by (tenant, app, detector) (ragmon_drift_detected{sel})", "{{app}} {{detector}}")],
    )
    b.series(
        "Test statistic",
        "MMD², KS D, ... of the latest window",
        "none",
        [(f"max by (tenant, app, detector) (ragmon_drift_score{sel})", "{{app}} {{detector}}")],
    )
    b.series(
        "p-value and alpha",
        "drift when the p-value falls under alpha",
        "none",
        [
            (f"max by (tenant, app, detector) (ragmon_drift_p_value{sel})", "{{app}} {{detector}} p"),
            (f"max by (tenant, app, detector) (ragmon_drift_alpha{sel})", "{{app}} {{detector}} alpha"),
        ],
    )
    b.series(
        "Window size",
        "observations in the latest window",
        "short",
        [(f"max by (tenant, app, detector) (ragmon_drift_window_size{sel})", "{{app}} {{detector}}")],
    )
    b.row("Runs")
    b.series(
        "Since the last run",
        "per detector",
        "s",
        [("time() - max by (detector) (ragmon_drift_last_run_timestamp_seconds)", "{{detector}}")],
    )
    b.series(
        "Runs per hour by outcome",
        "",
        "short",
        [
            (
                f"3600 * sum by (detector, outcome) (rate(ragmon_drift_runs_total{sel}[$__rate_interval]))",
                "{{detector}} {{outcome}}",
            )
        ],
    )
    b.series(
        "Embedding model changes (1h)",
        "a new query-embedding model name or dimension",
        "short",
        [(f"sum by (tenant, app) (increase(ragmon_embedding_model_changes_total{sel}[1h]))", "{{app}}")],
    )
    b.row("Retrieval and regeneration")
    b.series(
        "Top-1 retrieval score p50",
        "",
        "none",
        [
            (
                "histogram_quantile(0.5, sum by (tenant, app, le)"
                f" (rate(ragmon_retrieval_top1_score_bucket{sel}[$__rate_interval])))",
                "{{app}}",
            )
        ],
    )
    b.series(
        "Empty retrievals per trace",
        "",
        "percentunit",
        [
            (
                f"sum by (tenant, app) (rate(ragmon_empty_retrievals_total{sel}[$__rate_interval]))"
                f" / sum by (tenant, app) (rate(ragmon_traces_total{sel}[$__rate_interval]))",
                "{{app}}",
            )
        ],
    )
    b.series(
        "Regeneration rate and control band",
        "the alert fires outside the band",
        "percentunit",
        [
            (
                f"max by (tenant, app, intent) (ragmon_regeneration_rate_ratio{sel})",
                "{{app}} {{intent}} rate",
            ),
            (
                f"max by (tenant, app, intent) (ragmon_regeneration_band_lower_ratio{sel})",
                "{{app}} {{intent}} lower",
            ),
            (
                f"max by (tenant, app, intent) (ragmon_regeneration_band_upper_ratio{sel})",
                "{{app}} {{intent}} upper",
            ),
        ],
        width=24,
    )
    return b.json()


DASHBOARDS: dict[str, Callable[[], dict[str, Any]]] = {
    "ragmon-overview": overview,
    "ragmon-quality": quality,
    "ragmon-drift": drift,
}
