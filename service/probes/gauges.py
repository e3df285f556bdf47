"""`publish_probe_run`: sets the probe gauges (`ProbeMetrics`, service/metric_areas.py) from a scored run.

The gauges describe the latest scored run of each golden set. Publishing a
run replaces every series of its golden set: a category or k that the new
run lacks disappears instead of keeping the old run's value, and the delta
gauges disappear when no baseline is pinned (or the run is the baseline).
The gauges carry the tenant when the metrics do (`Metrics.probe_scope`): a
tenant's run never replaces another tenant's gauges of a golden set of the
same name. Golden-set names and categories are capped per tenant; a run
whose label is `other` still publishes, sharing that label with the
tenant's overflow.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from prometheus_client import Gauge

from service.config import ProbesConfig
from service.metrics import Metrics
from service.probes.scoring import compare_runs
from service.probes.store import GoldenStore, ProbeRun

__all__ = ["publish_probe_run", "restore_probe_gauges"]

_ALL = "all"


class _Writer:
    """Sets gauges for one (tenant and) golden label and forgets the series it did not set this time."""

    def __init__(self, metrics: Metrics, golden: tuple[str, ...]) -> None:
        self.metrics = metrics
        self.golden = golden
        self.written: dict[str, set[tuple[str, ...]]] = {}

    def set(self, gauge: Gauge, value: float | None, *labels: str) -> None:
        if value is None:
            return
        key = (*self.golden, *labels)
        gauge.labels(*key).set(float(value))
        self.written.setdefault(gauge._name, set()).add(key)

    def finish(self, every: list[Gauge]) -> None:
        before = self.metrics.probe_series.get(self.golden, {})
        for gauge in every:
            for key in before.get(gauge._name, set()) - self.written.get(gauge._name, set()):
                gauge.remove(*key)
        self.metrics.probe_series[self.golden] = self.written


def publish_probe_run(
    metrics: Metrics,
    tenant: str,
    golden_name: str,
    score: Mapping[str, Any],
    started_at: datetime,
    against_baseline: Mapping[str, Any] | None = None,
) -> None:
    """Set the probe gauges of the tenant's `golden_name` from a `score_run` result (and its baseline
    comparison)."""
    m = metrics
    golden, labels = m.probe_scope(tenant, golden_name)
    writer = _Writer(m, golden)
    ks = [int(k) for k in score["ks"]]
    overall: Mapping[str, float | None] = score["overall"]
    categories = [(_ALL, overall)] + [
        (labels.probe_category(c["category"]), c["mean"]) for c in score["per_category"]
    ]
    for category, means in categories:
        for k in ks:
            writer.set(m.probe_recall, means.get(f"recall@{k}"), str(k), category)
            writer.set(m.probe_ndcg, means.get(f"ndcg@{k}"), str(k), category)
        writer.set(m.probe_mrr, means.get("reciprocal_rank"), category)
    for slice_name, count in score["denominators"].items():
        writer.set(m.probe_questions, count, slice_name)
    writer.set(m.probe_false_exclusion, score["filter_false_exclusion"]["rate"])
    writer.set(m.probe_correct, score["correctness"]["rate"])
    for diagnosis, count in score["diagnoses"].items():
        writer.set(m.probe_diagnoses, count, diagnosis)
    writer.set(m.probe_last_run, started_at.timestamp())
    if against_baseline is not None:
        compared: Mapping[str, Mapping[str, Any]] = against_baseline["metrics"]
        for k in ks:
            entry = compared.get(f"recall@{k}")
            if entry is not None:
                writer.set(m.probe_recall_delta, entry["delta"], str(k))
                writer.set(m.probe_recall_delta_lower, entry["lower"], str(k))
                writer.set(m.probe_recall_delta_upper, entry["upper"], str(k))
        entry = compared.get("reciprocal_rank")
        if entry is not None:
            writer.set(m.probe_mrr_delta, entry["delta"])
            writer.set(m.probe_mrr_delta_lower, entry["lower"])
            writer.set(m.probe_mrr_delta_upper, entry["upper"])
    writer.finish(
        [
            m.probe_recall,
            m.probe_ndcg,
            m.probe_mrr,
            m.probe_questions,
            m.probe_false_exclusion,
            m.probe_correct,
            m.probe_diagnoses,
            m.probe_last_run,
            m.probe_recall_delta,
            m.probe_recall_delta_lower,
            m.probe_recall_delta_upper,
            m.probe_mrr_delta,
            m.probe_mrr_delta_lower,
            m.probe_mrr_delta_upper,
        ]
    )


def against_baseline(store: GoldenStore, tenant: str, run_id: str, golden_name: str) -> ProbeRun | None:
    """The pinned baseline run of a run's golden set, unless that is the run itself or is unscored."""
    baseline = store.baseline(tenant, golden_name)
    if baseline is None or baseline.run_id == run_id or baseline.result is None:
        return None
    return baseline


def restore_probe_gauges(store: GoldenStore, metrics: Metrics, config: ProbesConfig) -> int:
    """Publish the newest scored run of every golden set; returns how many.

    Called at start, so a restart does not drop the gauges an alert is pending on.
    """
    restored = 0
    for tenant, run in store.latest_scored_runs():
        if run.result is None:
            continue
        baseline = against_baseline(store, tenant, run.run_id, run.golden_name)
        comparison = (
            None
            if baseline is None or baseline.result is None
            else compare_runs(
                run.result,
                baseline.result,
                resamples=config.bootstrap_resamples,
                confidence=config.confidence,
                seed=config.seed,
            )
        )
        publish_probe_run(metrics, tenant, run.golden_name, run.result, run.started_at, comparison)
        restored += 1
    return restored
