"""The Grafana dashboards (overview, quality, drift), built as code with the pinned grafana-foundation-sdk.

Each builder returns a provisioning-ready dashboard as plain JSON data: a
Prometheus data-source picker, a `tenant` and an `app` variable on top, rows of panels
whose ids are unique and whose grid positions are set. Queries read the
recorded series of `rules.yml` where one exists, so dashboards and alerts
compute the same numbers; such panels say so in their description, since they
stay empty unless Prometheus loads that file.

Styling that carries meaning:
* an interval or control band (`_lower`/`_upper` gauges) is a shaded area: the
  upper series fills down to the lower one (`custom.fillBelowTo`), both bound
  lines dashed and thin, the estimate solid. `fillBelowTo` names one series by
  its display name, so a band panel shows one app (it repeats per `app`) with
  fixed legends, and one value of any further label (a single-value variable);
* every number of `thresholds.yaml` that an alert compares a panel's series
  with is a dashed threshold line on that panel (stat panels: its colour step);
* every dashboard links to the others (by the `ragmon` tag), to ragmon's
  review page and latest report (`ragmon_url` variable) and to the runbooks
  (`runbook_base` variable, defaulting to the build's runbook base); panels
  an alert watches link to its runbook.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import GraphThresholdsStyleMode
from grafana_foundation_sdk.models.dashboard import (
    DashboardLinkType,
    DataSourceRef,
    DynamicConfigValue,
    Threshold,
    ThresholdsMode,
    VariableOption,
    VariableRefresh,
    VariableSort,
)

from dashboards.alerts import Recording, rule_groups
from dashboards.promql import metric_names
from dashboards.thresholds import Thresholds

__all__ = [
    "DASHBOARDS",
    "DEFAULT_RAGMON_URL",
    "RULES_NOTE",
    "TAG",
    "Band",
    "Limit",
    "drift",
    "overview",
    "quality",
]

_DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
# `tenant` is empty (and matched by the "All" value) unless metrics.tenant_label is on
_APP = 'tenant=~"$tenant",app=~"$app"'
_Query = tuple[str, str]  # (PromQL, legend)
TAG = "ragmon"
DEFAULT_RAGMON_URL = "http://127.0.0.1:4318"
RULES_NOTE = "Reads recorded series of dashboards/rules.yml: empty unless Prometheus loads that file."
_BAND_FILL_OPACITY = 20
_DASH = [6.0, 4.0]


@dataclass(frozen=True)
class Band:
    """An interval drawn as a shaded area: `upper` fills down to `lower` (legend names of its series)."""

    lower: str
    upper: str
    estimate: str | None = None


@dataclass(frozen=True)
class Limit:
    """Threshold lines from thresholds.yaml; `floor`: values under the line are the bad side."""

    values: tuple[float, ...]
    floor: bool = False


def _recorded() -> frozenset[str]:
    # the recording names do not depend on the numbers in thresholds.yaml
    from dashboards.thresholds import load_thresholds

    return frozenset(
        r.record for g in rule_groups(load_thresholds()) for r in g.rules if isinstance(r, Recording)
    )


def _band_overrides(panel: Any, band: Band) -> Any:
    bound_line = [
        DynamicConfigValue("custom.lineWidth", 1),
        DynamicConfigValue("custom.lineStyle", {"fill": "dash", "dash": _DASH}),
    ]
    panel = panel.override_by_name(
        band.upper,
        [
            DynamicConfigValue("custom.fillBelowTo", band.lower),
            DynamicConfigValue("custom.fillOpacity", _BAND_FILL_OPACITY),
            *bound_line,
        ],
    )
    panel = panel.override_by_name(band.lower, [DynamicConfigValue("custom.fillOpacity", 0), *bound_line])
    if band.estimate is not None:
        panel = panel.override_by_name(band.estimate, [DynamicConfigValue("custom.lineWidth", 2)])
    return panel


def _steps(limit: Limit) -> Any:
    good, bad = "green", "red"
    steps = [Threshold(value=None, color=bad if limit.floor else good)]
    steps += [Threshold(value=v, color=good if limit.floor else bad) for v in sorted(set(limit.values))]
    return db.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(steps)


def _link(title: str, url: str, tooltip: str) -> db.DashboardLink:
    return (
        db.DashboardLink(title)
        .type(DashboardLinkType.LINK)
        .url(url)
        .tooltip(tooltip)
        .target_blank(True)
        .include_vars(False)
        .keep_time(False)
    )


class _Board:
    """Collects panels, numbering them and sizing them half or full width."""

    def __init__(self, t: Thresholds, title: str, uid: str, description: str) -> None:
        self.next_id = 1
        self.recorded = _recorded()
        self.board = (
            db.Dashboard(title)
            .uid(uid)
            .description(description)
            .tags([TAG])
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
            .with_variable(
                db.TextBoxVariable("ragmon_url")
                .label("ragmon URL")
                .description("where ragmon serves /review and /reports/latest, as the browser reaches it")
                .default_value(DEFAULT_RAGMON_URL)
                .current(_option(DEFAULT_RAGMON_URL))
            )
            .with_variable(
                db.TextBoxVariable("runbook_base")
                .label("Runbooks")
                .description("prefix of runbooks/<AlertName>.md (runbook_base_url of the build)")
                .default_value(t.runbook_base)
                .current(_option(t.runbook_base))
            )
            .links(
                [
                    db.DashboardLink("ragmon dashboards")
                    .type(DashboardLinkType.DASHBOARDS)
                    .tags([TAG])
                    .as_dropdown(False)
                    .include_vars(True)
                    .keep_time(True)
                    .target_blank(False)
                    .tooltip("the other ragmon dashboards, same apps and time range"),
                    _link("Review queue", "${ragmon_url}/review", "answers flagged for a human, on ragmon"),
                    _link("Latest report", "${ragmon_url}/reports/latest", "ragmon's newest weekly report"),
                    _link("Runbooks", "${runbook_base}", "one runbook per alert"),
                ]
            )
        )

    def row(self, title: str) -> _Board:
        self.board.with_row(db.Row(title).id(self._id()))
        return self

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def _common(
        self,
        panel: Any,
        description: str,
        queries: list[_Query],
        *,
        instant: bool,
        runbooks: Sequence[str],
        data_links: Sequence[tuple[str, str]],
    ) -> Any:
        if any(metric_names(expr) & self.recorded for expr, _ in queries):
            description = f"{description} ({RULES_NOTE})" if description else RULES_NOTE
        panel = panel.description(description)
        for n, (expr, legend) in enumerate(queries):
            query = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + n))
            panel = panel.with_target(query.instant() if instant else query)
        if runbooks:
            panel = panel.links(
                [
                    _link(f"Runbook: {name}", f"${{runbook_base}}/{name}.md", f"what to do when {name} fires")
                    for name in runbooks
                ]
            )
        if data_links:
            panel = panel.data_links(
                [db.DashboardLink(title).url(url).target_blank(True) for title, url in data_links]
            )
        return panel

    def series(
        self,
        title: str,
        description: str,
        unit: str,
        queries: list[_Query],
        *,
        width: int = 12,
        bands: Sequence[Band] = (),
        limit: Limit | None = None,
        repeat: str | None = None,
        runbooks: Sequence[str] = (),
        data_links: Sequence[tuple[str, str]] = (),
        counts: str | None = None,
    ) -> _Board:
        """A time series panel; `counts`: a regular expression of the legends that are counts (n, no
        claims), drawn on a right axis in plain numbers beside the estimates they qualify."""
        panel = (
            timeseries.Panel().id(self._id()).title(title).datasource(_DS).unit(unit).span(width).height(8)
        )
        panel = self._common(
            panel, description, queries, instant=False, runbooks=runbooks, data_links=data_links
        )
        for band in bands:
            panel = _band_overrides(panel, band)
        if counts is not None:
            panel = panel.override_by_regexp(
                counts,
                [
                    DynamicConfigValue("custom.axisPlacement", "right"),
                    DynamicConfigValue("unit", "short"),
                    DynamicConfigValue("custom.lineStyle", {"fill": "dot", "dash": [2.0, 4.0]}),
                ],
            )
        if limit is not None:
            panel = panel.thresholds(_steps(limit)).thresholds_style(
                common_builders.GraphThresholdsStyleConfig().mode(GraphThresholdsStyleMode.DASHED)
            )
        if repeat is not None:
            panel = panel.repeat(repeat).repeat_direction("h").max_per_row(24 // width)
        self.board.with_panel(panel)
        return self

    def single(
        self,
        title: str,
        description: str,
        unit: str,
        queries: list[_Query],
        *,
        width: int = 6,
        limit: Limit | None = None,
        runbooks: Sequence[str] = (),
        data_links: Sequence[tuple[str, str]] = (),
    ) -> _Board:
        panel = stat.Panel().id(self._id()).title(title).datasource(_DS).unit(unit).span(width).height(5)
        panel = self._common(
            panel, description, queries, instant=True, runbooks=runbooks, data_links=data_links
        )
        if limit is not None:
            panel = panel.thresholds(_steps(limit))
        self.board.with_panel(panel)
        return self

    def variable(self, variable: Any) -> _Board:
        self.board.with_variable(variable)
        return self

    def json(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(json.dumps(self.board.build(), cls=JSONEncoder))
        return data


def _single_value(name: str, label: str, query: str, description: str, default: str | None = None) -> Any:
    """A one-value query variable, for the label a band panel must hold fixed."""
    variable = (
        db.QueryVariable(name)
        .label(label)
        .description(description)
        .datasource(_DS)
        .query(query)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(False)
        .include_all(False)
        .sort(VariableSort.ALPHABETICAL_ASC)
    )
    if default is not None:
        variable = variable.current(_option(default))
    return variable


def _option(value: str) -> VariableOption:
    return VariableOption(selected=True, text=value, value=value)


def _q(quantile_metric: str, q: str, extra: str = "") -> str:
    return f'max by (tenant, app{extra}) ({quantile_metric}{{quantile="{q}",{_APP}}})'


def overview(t: Thresholds) -> dict[str, Any]:
    """Traffic, per-stage latency percentiles, TTFT, tokens, cost per query, regeneration and feedback."""
    job = t.job
    slo = t.latency.stage_p95_seconds
    stage = "app_stage_quantile:ragmon_stage_duration_seconds:histogram_quantile_rate5m"
    ttft = "app_quantile:ragmon_ttft_seconds:histogram_quantile_rate5m"
    cost = "app_quantile:ragmon_trace_cost_usd:histogram_quantile_rate1h"
    b = _Board(
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
        [(f"sum(app:ragmon_traces:rate5m{{{_APP}}})", "")],
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
            (f'max by (tenant, app) ({stage}{{quantile="{q}",stage="total",{_APP}}})', f"{{{{app}}}} {label}")
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
        runbooks=["RagmonRegenerationRateOutOfBand"],
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


def _interval(
    b: _Board,
    what: str,
    description: str,
    unit: str,
    metric: str,
    selector: str,
    by: str,
    *,
    limit: Limit | None = None,
    runbooks: Sequence[str] = (),
    width: int = 12,
    lower: str | None = None,
    upper: str | None = None,
) -> None:
    """One app's estimate with its interval (`lower`/`upper`: metric names, default `<metric>_lower`/`_upper`)
    as a shaded band; the panel repeats per selected app."""
    b.series(
        f"{what}: $app",
        description + "; one panel per app (with metrics.tenant_label, select one tenant), the shaded"
        " area is the interval",
        unit,
        [
            (f"max by ({by}) ({metric}{selector})", "estimate"),
            (f"max by ({by}) ({lower or metric + '_lower'}{selector})", "lower"),
            (f"max by ({by}) ({upper or metric + '_upper'}{selector})", "upper"),
        ],
        bands=[Band("lower", "upper", "estimate")],
        limit=limit,
        repeat="app",
        runbooks=runbooks,
        width=width,
    )


def quality(t: Thresholds) -> dict[str, Any]:
    """Faithfulness with its interval, verdicts and diagnoses, judge calibration, cost and the judge queue."""
    b = _Board(
        t, "ragmon / quality", "ragmon-quality", "Judged faithfulness of the answers and the judge behind it."
    )
    floor = Limit((t.faithfulness.upper_bound_min,), floor=True)
    b.variable(
        _single_value(
            "judge_version",
            "Judge version",
            "label_values(ragmon_judge_calibration_pairs, judge_version)",
            "the judge version whose agreement with the reviewers the calibration panels show",
        )
    )
    b.variable(
        _single_value(
            "sample",
            "Calibration sample",
            "label_values(ragmon_judge_calibration_pairs, sample)",
            "blind: the random sample of judged answers (the unbiased one); other queues are flagged answers",
            default="blind",
        )
    )
    est = f'{{release="all",intent="all",{_APP}}}'
    b.row("Faithfulness: the judge's estimate and the one corrected by reviewers")
    readings = (
        (
            "Faithfulness with 95% interval",
            "Share of the answers' claims that the context supports over the rolling window",
            "ragmon_faithfulness_estimate",
            "ragmon_faithfulness_corrected_estimate",
            "claims",
        ),
        (
            "Faithful answers with 95% interval",
            "Share of answers with no unsupported claim, over the same judged answers: lower than the "
            "claim-level rate whenever some answers are partly supported",
            "ragmon_faithful_answers_ratio",
            "ragmon_faithful_answers_corrected_ratio",
            "answers",
        ),
    )
    for title, what, judge_only, corrected, reading in readings:
        is_claims = reading == "claims"
        b.series(
            f"{title}: $app",
            what + ". Judge-only: the judge's Hajek estimate, its band sampling error only. Human-corrected: "
            "plus the mean reviewer-minus-judge difference on the blind review sample, its band also "
            "carrying the judge's error (shown from review.min_labels blind labels). Right axis: the "
            "judged answers without claims (in neither) and the blind labels. One panel per app"
            + (
                "; the alert compares each release's upper bound, corrected where it exists, with the "
                "dashed line (faithfulness.upper_bound_min)"
                if is_claims
                else ""
            ),
            "percentunit",
            [
                (f"max by (tenant, app) ({judge_only}{est})", "judge-only"),
                (f"max by (tenant, app) ({judge_only}_lower{est})", "judge-only lower"),
                (f"max by (tenant, app) ({judge_only}_upper{est})", "judge-only upper"),
                (f"max by (tenant, app) ({corrected}{est})", "human-corrected"),
                (f"max by (tenant, app) ({corrected}_lower{est})", "human-corrected lower"),
                (f"max by (tenant, app) ({corrected}_upper{est})", "human-corrected upper"),
                (f"max by (tenant, app) (ragmon_faithfulness_no_claims{est})", "n no claims"),
                (
                    f'max by (tenant, app) (ragmon_faithfulness_human_labels{{release="all",intent="all",'
                    f'reading="{reading}",{_APP}}})',
                    "n blind labels",
                ),
            ],
            bands=[
                Band("judge-only lower", "judge-only upper", "judge-only"),
                Band("human-corrected lower", "human-corrected upper", "human-corrected"),
            ],
            limit=floor if is_claims else None,
            repeat="app",
            runbooks=["RagmonFaithfulnessLow"] if is_claims else (),
            counts="^n ",
        )
    for by, other in (("release", "intent"), ("intent", "release")):
        sel = f'{other}="all",{by}!="all",{_APP}'
        b.series(
            f"Faithfulness by {by}",
            (
                "the alert compares each release's upper bound (human-corrected where it exists) with the "
                "dashed line (faithfulness.upper_bound_min); "
                if by == "release"
                else ""
            )
            + "dotted, right axis: judged answers without claims",
            "percentunit",
            [
                (
                    f"max by (tenant, app, {by}) (ragmon_faithfulness_estimate{{{sel}}})",
                    f"{{{{app}}}} {{{{{by}}}}} judge-only",
                ),
                (
                    f"max by (tenant, app, {by}) (ragmon_faithfulness_corrected_estimate{{{sel}}})",
                    f"{{{{app}}}} {{{{{by}}}}} human-corrected",
                ),
                (
                    f"max by (tenant, app, {by}) (ragmon_faithfulness_no_claims{{{sel}}})",
                    f"n no claims {{{{app}}}} {{{{{by}}}}}",
                ),
            ],
            limit=floor,
            runbooks=["RagmonFaithfulnessLow"] if by == "release" else (),
            data_links=[("Review queue", "${ragmon_url}/review")] if by == "release" else (),
            counts="^n ",
        )
    b.series(
        "Judged sample size",
        "scored judgments behind both readings, answers without claims (in neither), and the blind human "
        "labels behind each corrected reading",
        "short",
        [
            (f"max by (tenant, app) (ragmon_faithfulness_sample_size{est})", "{{app}} scored"),
            (f"max by (tenant, app) (ragmon_faithfulness_no_claims{est})", "{{app}} no claims"),
            (
                f"max by (tenant, app, reading) (ragmon_faithfulness_human_labels{est})",
                "{{app}} blind labels ({{reading}})",
            ),
        ],
    )
    people = f"{{{_APP}}}"
    b.series(
        "Judge and reviewers: $app",
        "Per app over the rolling window, on the blind sample's pairs: agreement and Cohen's kappa with 95% "
        "intervals, and the reference period's disagreement as 1 - it (the alert tests the window's "
        "disagreement against it); right axis: the pairs in each period",
        "percentunit",
        [
            (f"max by (tenant, app) (ragmon_judge_human_agreement_ratio{people})", "agreement"),
            (f"max by (tenant, app) (ragmon_judge_human_agreement_ratio_lower{people})", "agreement lower"),
            (f"max by (tenant, app) (ragmon_judge_human_agreement_ratio_upper{people})", "agreement upper"),
            (f"max by (tenant, app) (ragmon_judge_human_kappa{people})", "kappa"),
            (f"max by (tenant, app) (ragmon_judge_human_kappa_lower{people})", "kappa lower"),
            (f"max by (tenant, app) (ragmon_judge_human_kappa_upper{people})", "kappa upper"),
            (
                f"1 - max by (tenant, app) (ragmon_judge_human_disagreement_reference_ratio{people})",
                "reference agreement",
            ),
            (f"max by (tenant, app) (ragmon_judge_human_pairs{people})", "n pairs"),
            (f"max by (tenant, app) (ragmon_judge_human_reference_pairs{people})", "n reference pairs"),
        ],
        bands=[
            Band("agreement lower", "agreement upper", "agreement"),
            Band("kappa lower", "kappa upper", "kappa"),
        ],
        repeat="app",
        runbooks=["RagmonJudgeHumanDisagreementRose"],
        data_links=[("Review queue", "${ragmon_url}/review")],
        counts="^n ",
    )
    cal = '{judge_version="$judge_version",sample="$sample"}'
    b.row("Judge calibration (judge vs reviewers)")
    rates = (
        ("agreement", "ragmon_judge_agreement_ratio"),
        ("false approval", "ragmon_judge_false_approval_ratio"),
        ("false rejection", "ragmon_judge_false_rejection_ratio"),
    )
    b.series(
        "Agreement and error rates with 95% intervals",
        "judge version $judge_version on the $sample sample: agreement, false approvals (judge faithful,"
        " reviewer not) and false rejections; shaded: each rate's interval",
        "percentunit",
        [
            q
            for name, metric in rates
            for q in (
                (f"max ({metric}{cal})", name),
                (f"max ({metric}_lower{cal})", f"{name} lower"),
                (f"max ({metric}_upper{cal})", f"{name} upper"),
            )
        ],
        bands=[Band(f"{name} lower", f"{name} upper", name) for name, _ in rates],
        data_links=[("Review queue", "${ragmon_url}/review")],
    )
    b.series(
        "Cohen's kappa with 95% interval",
        "judge version $judge_version on the $sample sample; the pairs behind it on the right axis",
        "none",
        [
            (f"max (ragmon_judge_kappa{cal})", "kappa"),
            (f"max (ragmon_judge_kappa_lower{cal})", "kappa lower"),
            (f"max (ragmon_judge_kappa_upper{cal})", "kappa upper"),
            (f"max (ragmon_judge_calibration_pairs{cal})", "pairs"),
        ],
        bands=[Band("kappa lower", "kappa upper", "kappa")],
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
            data_links=[("Review queue", "${ragmon_url}/review")],
        )
    b.row("Judge cost")
    b.single(
        "Judge spend, last 24h",
        "red over the daily budget (cost.judge_usd_per_day)",
        "currencyUSD",
        [("sum(job:ragmon_judge_cost_usd:increase1d)", "")],
        limit=Limit((t.cost.judge_usd_per_day,)),
        runbooks=["RagmonJudgeSpendOverBudget"],
    )
    b.single(
        "Judge calls per minute",
        "",
        "short",
        [("60 * sum(rate(ragmon_judge_requests_total[$__rate_interval]))", "")],
    )
    b.single(
        "Judge failures per call",
        "15m window; red over judge.failure_ratio",
        "percentunit",
        [("max(job:ragmon_judge_failures_per_requests:ratio_rate15m)", "")],
        limit=Limit((t.judge.failure_ratio,)),
        runbooks=["RagmonJudgeFailureRateHigh"],
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
        "waiting or leased; failed items stay visible; dashed line: judge.backlog_min_items (the backlog"
        " alert also needs growth over judge.backlog_window)",
        "short",
        [
            ("max(ragmon_judge_queue_depth)", "depth"),
            ("max(ragmon_judge_queue_failed)", "failed"),
        ],
        limit=Limit((float(t.judge.backlog_min_items),)),
        runbooks=["RagmonJudgeQueueBacklogGrowing"],
    )
    b.series(
        "Since the last judgment",
        "alert when the queue is not empty and this passes the dashed line (judge.stalled_after_seconds)",
        "s",
        [("time() - max(ragmon_judge_last_success_timestamp_seconds)", "since last judgment")],
        limit=Limit((t.judge.stalled_after_seconds,)),
        runbooks=["RagmonJudgeStalled"],
    )
    b.series(
        "Sampled, deferred and skipped per minute",
        "traces put in the queue by stratum; traces the budget had no room for when their turn came "
        "(deferred: judged as it refills, in fair shares of the tenants); traces never judged by reason "
        "(expired: deferred past budget.max_deferral_s)",
        "short",
        [
            (
                "60 * sum by (stratum) (rate(ragmon_judge_sampled_total[$__rate_interval]))",
                "sampled {{stratum}}",
            ),
            ("60 * sum(rate(ragmon_judge_deferred_total[$__rate_interval]))", "deferred"),
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


def drift(t: Thresholds) -> dict[str, Any]:
    """Drift statistics, p-values against alpha, last runs, model changes and the regeneration band."""
    b = _Board(
        t, "ragmon / drift", "ragmon-drift", "Query, retrieval and embedding drift against pinned references."
    )
    b.variable(
        _single_value(
            "intent",
            "Intent",
            f"label_values(ragmon_regeneration_rate_ratio{{{_APP}}}, intent)",
            "the intent whose regeneration control band the band panels show",
        )
    )
    b.variable(
        _single_value(
            "golden",
            "Golden set",
            "label_values(ragmon_probe_last_run_timestamp_seconds, golden)",
            "the golden set whose probe changes the probe panels show",
        )
    )
    sel = f"{{{_APP}}}"
    b.row("Detectors")
    b.series(
        "Drift detected",
        "1 when the latest run (after hysteresis) says drift",
        "none",
        [(f"max by (tenant, app, detector) (ragmon_drift_detected{sel})", "{{app}} {{detector}}")],
        runbooks=["RagmonQueryDrift", "RagmonRetrievalScoreDrift"],
        data_links=[("Latest report", "${ragmon_url}/reports/latest")],
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
        runbooks=["RagmonEmbeddingModelChanged"],
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
        "Regeneration rate by intent",
        "every selected app and intent, no band (the band panels below show one app and intent each)",
        "percentunit",
        [(f"max by (tenant, app, intent) (ragmon_regeneration_rate_ratio{sel})", "{{app}} {{intent}}")],
        runbooks=["RagmonRegenerationRateOutOfBand"],
    )
    _interval(
        b,
        "Regeneration rate and control band, intent $intent",
        "regenerations per answer of the latest window; the alert fires outside the shaded control band",
        "percentunit",
        "ragmon_regeneration_rate_ratio",
        f'{{{_APP},intent="$intent"}}',
        "tenant, app, intent",
        lower="ragmon_regeneration_band_lower_ratio",
        upper="ragmon_regeneration_band_upper_ratio",
        runbooks=["RagmonRegenerationRateOutOfBand"],
    )
    p = t.probes
    b.row("Golden probes (against the pinned baseline run)")
    for what, metric, selector, budget, alert in (
        (
            f"recall@{p.recall_k} change",
            "ragmon_probe_recall_delta_ratio",
            f'{{golden="$golden",k="{p.recall_k}"}}',
            p.recall_drop_budget,
            "RagmonProbeRecallDropped",
        ),
        (
            "MRR change",
            "ragmon_probe_mrr_delta_ratio",
            '{golden="$golden"}',
            p.mrr_drop_budget,
            "RagmonProbeMrrDropped",
        ),
    ):
        base = metric.removesuffix("_ratio")
        b.series(
            f"{what} with its paired interval, golden set $golden",
            "latest probe run minus the pinned baseline, shaded: the paired bootstrap interval; the alert"
            " fires under the dashed line (the drop budget) when the whole interval is under 0",
            "percentunit",
            [
                (f"max ({metric}{selector})", "change"),
                (f"max ({base}_lower_ratio{selector})", "lower"),
                (f"max ({base}_upper_ratio{selector})", "upper"),
            ],
            bands=[Band("lower", "upper", "change")],
            limit=Limit((-budget,), floor=True),
            runbooks=[alert],
        )
    b.series(
        "Filter false exclusions",
        "share of probe questions whose every eligible gold chunk the retrieval filter excluded;"
        " dashed line: probes.false_exclusion_ratio",
        "percentunit",
        [("max by (golden) (ragmon_probe_filter_false_exclusion_ratio)", "{{golden}}")],
        limit=Limit((p.false_exclusion_ratio,)),
        runbooks=["RagmonProbeFilterFalseExclusionHigh"],
        width=24,
    )
    return b.json()


DASHBOARDS: dict[str, Callable[[Thresholds], dict[str, Any]]] = {
    "ragmon-overview": overview,
    "ragmon-quality": quality,
    "ragmon-drift": drift,
}
