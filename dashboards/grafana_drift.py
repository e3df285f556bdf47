"""The drift dashboard: detectors against their pinned references, their runs, retrieval, the
regeneration control band and the golden probes.
"""

from __future__ import annotations

from typing import Any

from dashboards.grafana_board import APPS, Band, Board, Limit, interval_panel, single_value
from dashboards.thresholds import Thresholds

__all__ = ["drift"]


def drift(t: Thresholds) -> dict[str, Any]:
    """Drift statistics, p-values against alpha, last runs, model changes and the regeneration band."""
    b = Board(
        t, "ragmon / drift", "ragmon-drift", "Query, retrieval and embedding drift against pinned references."
    )
    b.variable(
        single_value(
            "intent",
            "Intent",
            f"label_values(ragmon_regeneration_rate_ratio{{{APPS}}}, intent)",
            "the intent whose regeneration control band the band panels show",
        )
    )
    b.variable(
        single_value(
            "golden",
            "Golden set",
            "label_values(ragmon_probe_last_run_timestamp_seconds, golden)",
            "the golden set whose probe changes the probe panels show",
        )
    )
    sel = f"{{{APPS}}}"
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
    interval_panel(
        b,
        "Regeneration rate and control band, intent $intent",
        "regenerations per answer of the latest window; the alert fires outside the shaded control band",
        "percentunit",
        "ragmon_regeneration_rate_ratio",
        f'{{{APPS},intent="$intent"}}',
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
