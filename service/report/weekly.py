"""The drift and quality report over a period, built from the stores (`ragmon report`, whose command is
`service/report/cli.py`; written out as one HTML file and a Markdown summary by `render.py`).

Per app: query drift over time (the stored query-embedding runs), the
faithfulness estimate per day with its interval (Hájek over the judge queue,
computed by `service.judge.judging.FaithfulnessEstimator`) and the answers
without claims beside it, both readings over the period judge-only and
corrected by the blind review labels, with judge-human agreement and the
blind labels a week to ask for (`faithfulness.py`), the regeneration rate
per day with its Wilson interval and the regeneration detector's control band
(its exact binomial test at its own baseline rate, for each day's traces), p50 and
p95 latency per stage with distribution-free intervals, cost per query with a
t interval, and the new query groups against the app's pinned reference
(`detectors.explain`). Every number is printed with its denominator and its
95 % interval; a period (or a panel) without data says so in words.

The report is written to `--out` (default: a dated folder beside the tenant's
latest copies, `latest.py`) and copied to those, which the server answers at
`/reports/latest` and `/reports/latest.md` for that tenant's key. Weekly, from
cron: `0 6 * * 1  ragmon report --since 7d --data-dir /var/lib/ragmon`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import numpy.typing as npt
import sqlalchemy as sa
from scipy import stats

from detectors.regeneration_band import binomial_band
from service.config import JudgingConfig, RagmonConfig
from service.drift.checks import explain_queries
from service.drift.embedders import builtin_model_key, reference_text_embedder
from service.drift.store import DriftStore, RunRecord
from service.judge.judging import FaithfulnessEstimator
from service.judge.store import JudgmentStore, Reading
from service.metrics import Metrics
from service.report.faithfulness import FaithfulnessSection, faithfulness_section
from service.review.correction import HumanCorrection
from service.store.tables import feedback, traces
from service.store.trace_store import Store

__all__ = ["AppReport", "Day", "Interval", "Report", "build_report", "minute_utc"]

STAGES = ("total", "embedding", "retrieval", "rerank", "generation")
EMBEDDING_DETECTORS = ("query_embedding_mmd", "query_embedding_rff")
REGENERATION_DETECTOR = "regeneration_band"
Interval = tuple[float, float, float] | None
"""(estimate, lower, upper) at 95 %, or None when there is nothing to estimate."""


def quantile_interval(values: npt.NDArray[np.float64], q: float) -> Interval:
    """The q-quantile and a distribution-free 95 % interval from binomial order statistics."""
    n = values.size
    if n == 0:
        return None
    ordered = np.sort(values)
    low = int(stats.binom.ppf(0.025, n, q)) - 1
    high = int(stats.binom.ppf(0.975, n, q))
    return (
        float(np.quantile(ordered, q)),
        float(ordered[max(0, min(n - 1, low))]),
        float(ordered[max(0, min(n - 1, high))]),
    )


def mean_interval(values: npt.NDArray[np.float64]) -> Interval:
    """The mean and its 95 % t interval (the interval collapses to the mean for fewer than two values)."""
    if values.size == 0:
        return None
    mean = float(values.mean())
    if values.size < 2 or float(values.std()) == 0.0:
        return mean, mean, mean
    low, high = stats.t.interval(0.95, values.size - 1, loc=mean, scale=stats.sem(values))
    return mean, float(low), float(high)


def rate_interval(k: int, n: int) -> Interval:
    """k/n with Wilson's 95 % score interval."""
    if n == 0:
        return None
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return k / n, float(ci.low), float(ci.high)


def minute_utc(time: datetime) -> str:
    """A time as the report shows it: to the minute, in UTC (`2026-11-28 09:21 UTC`)."""
    return f"{time.astimezone(UTC):%Y-%m-%d %H:%M} UTC"


@dataclass
class Day:
    start: datetime
    end: datetime  # the day's end, or the period's end for its last (partial) day
    traces: int = 0
    p50_total: Interval = None
    p95_total: Interval = None
    cost: Interval = None
    regenerations: int = 0
    regeneration: Interval = None
    band: tuple[float, float] | None = None  # the regeneration detector's limits for this day's n
    faithfulness: Interval = None
    judged: int = 0
    no_claims: int = 0  # judged answers without claims: in neither reading's denominator

    @property
    def middle(self) -> datetime:
        """Where the day's point is drawn: the middle of the part of the day inside the period."""
        return self.start + (self.end - self.start) / 2


@dataclass
class AppReport:
    app: str
    traces: int
    days: list[Day]
    stages: dict[str, tuple[int, Interval, Interval]]
    cost: Interval
    priced: int
    unpriced: int
    regenerations: int
    regeneration: Interval
    faithfulness: Interval
    judged: int
    judge_failed: int
    no_claims: int
    drift_runs: list[RunRecord]
    faithful_answers: Interval = None  # the answer-level reading: answers with no unsupported claim
    faithfulness_section: FaithfulnessSection | None = None  # judge-only and corrected, agreement, plan
    groups: list[dict[str, Any]] = field(default_factory=list)
    groups_note: str = ""
    band_note: str = ""  # why a day (or the whole period) has no control band


@dataclass
class Report:
    tenant: str
    since: datetime
    until: datetime
    generated_at: datetime
    apps: list[AppReport]
    alpha: float


def _days(since: datetime, until: datetime) -> list[datetime]:
    start = since.replace(hour=0, minute=0, second=0, microsecond=0)
    days = []
    while start < until:
        days.append(start)
        start += timedelta(days=1)
    return days


def _trace_rows(store: Store, tenant: str, app: str | None, since: datetime, until: datetime) -> list[Any]:
    regenerate = (
        sa.exists()
        .where(
            feedback.c.tenant == traces.c.tenant,
            feedback.c.trace_id == traces.c.trace_id,
            feedback.c.kind == "regenerate",
        )
        .label("regenerate_feedback")
    )
    query = sa.select(
        traces.c.app,
        traces.c.start_time,
        *(traces.c[f"{stage}_s"] for stage in STAGES),
        traces.c.cost_usd,
        traces.c.unpriced,
        traces.c.usage_unknown,
        traces.c.is_regeneration,
        regenerate,
    ).where(traces.c.tenant == tenant, traces.c.start_time >= since, traces.c.start_time < until)
    if app is not None:
        query = query.where(traces.c.app == app)
    with store.engine.connect() as conn:
        return list(conn.execute(query))


def _faithfulness(
    estimator: FaithfulnessEstimator, at: datetime, app: str, reading: Reading = "claims"
) -> tuple[Interval, int, int, int]:
    found = estimator.compute(now=at, reading=reading)["app"].get((app,))
    if found is None:
        return None, 0, 0, 0
    interval = (
        None
        if found.estimate is None or found.lower is None or found.upper is None
        else (found.estimate, found.lower, found.upper)
    )
    return interval, found.n_judged, found.n_failed, found.n_no_claims


def build_report(
    config: RagmonConfig,
    store: Store,
    drift: DriftStore,
    *,
    tenant: str,
    since: datetime,
    until: datetime,
    app: str | None = None,
) -> Report:
    """Everything the report shows, computed from the store (read-only apart from creating missing tables)."""
    if until <= since:
        raise ValueError(f"the period ends ({minute_utc(until)}) before it starts ({minute_utc(since)})")
    rows = _trace_rows(store, tenant, app, since, until)
    by_app: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        by_app[row.app].append(row)
    judgments = JudgmentStore(store.engine)
    day_config = JudgingConfig(estimate_window_s=86400.0)
    per_day = FaithfulnessEstimator(day_config, judgments, Metrics(config.metrics), tenant=tenant)
    period_s = max(1.0, (until - since).total_seconds())
    period_config = JudgingConfig(estimate_window_s=period_s)
    whole = FaithfulnessEstimator(period_config, judgments, Metrics(config.metrics), tenant=tenant)
    correction = HumanCorrection(
        period_config, config.review, judgments, Metrics(config.metrics), tenant=tenant, window_s=period_s
    )
    apps = []
    for name, app_rows in sorted(by_app.items()):
        report = _app_report(config, drift, tenant, name, app_rows, since, until, per_day, whole)
        report.faithfulness_section = faithfulness_section(
            correction,
            until,
            name,
            half_width=config.review.plan_half_width,
            blind_rate=config.review.blind_rates.get(name, config.review.blind_rate),
        )
        apps.append(report)
    return Report(tenant, since, until, datetime.now(UTC), apps, config.drift.alpha)


def _column(rows: Sequence[Any], name: str) -> npt.NDArray[np.float64]:
    values = [getattr(r, name) for r in rows]
    return np.array([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)


def _regenerated(row: Any) -> bool:
    return bool(row.is_regeneration or row.regenerate_feedback)


def _detector_baseline(band_runs: Sequence[RunRecord], end: datetime) -> tuple[float, float] | None:
    """The regeneration detector's baseline rate and alpha as of `end`, from its last judged run per
    intent before then (intents pooled, weighted by their baseline traces); None if it had none.

    The band is the detector's own test (exact binomial at its baseline, which leaves out windows that
    were out of band) applied to a day's traces, so a day is out of band on the same terms as an alert.
    """
    latest: dict[str | None, RunRecord] = {}
    for run in band_runs:
        if run.ran_at < end:
            latest[run.intent] = run
    weights = [
        (float(str(r.result.details["baseline_rate"])), r.result.n_reference, r) for r in latest.values()
    ]
    traces_in_baseline = sum(n for _, n, _ in weights)
    if not weights or traces_in_baseline <= 0:
        return None
    rate = sum(p * n for p, n, _ in weights) / traces_in_baseline
    alpha = min(r.result.alpha or 0.0 for _, _, r in weights) or 0.01
    return rate, alpha


def _band_note(config: RagmonConfig, band_runs: Sequence[RunRecord], all_runs: Sequence[RunRecord]) -> str:
    if not any(r.result.detector == REGENERATION_DETECTOR for r in all_runs):
        return (
            "No control band: the regeneration detector did not run in this period "
            "(it runs with the drift detectors, every drift.interval_s)."
        )
    if not band_runs:
        return (
            "No control band: the regeneration detector was still warming up in this period "
            f"(its baseline needs {config.drift.regeneration_min_baseline} traces in closed windows, "
            "drift.regeneration_min_baseline, before its band applies)."
        )
    return ""


def _app_report(
    config: RagmonConfig,
    drift: DriftStore,
    tenant: str,
    app: str,
    rows: list[Any],
    since: datetime,
    until: datetime,
    per_day: FaithfulnessEstimator,
    whole: FaithfulnessEstimator,
) -> AppReport:
    regenerations = sum(_regenerated(r) for r in rows)
    drift_runs = drift.runs(tenant, app=app, since=since, until=until, limit=10_000)
    band_runs = sorted(
        (
            r
            for r in drift_runs
            if r.result.detector == REGENERATION_DETECTOR
            and r.outcome != "insufficient_data"
            and "baseline_rate" in r.result.details
        ),
        key=lambda r: r.ran_at,
    )
    days = []
    for start in _days(since, until):
        end = min(start + timedelta(days=1), until)
        day_rows = [r for r in rows if start <= r.start_time < end]
        k = sum(_regenerated(r) for r in day_rows)
        baseline = _detector_baseline(band_runs, end)
        band = None
        if day_rows and baseline is not None:
            lower, upper = binomial_band(len(day_rows), baseline[0], baseline[1])
            band = (lower / len(day_rows), upper / len(day_rows))
        faith, judged, _, day_no_claims = _faithfulness(per_day, end, app)
        days.append(
            Day(
                start=max(start, since),
                end=end,
                traces=len(day_rows),
                p50_total=quantile_interval(_column(day_rows, "total_s"), 0.5),
                p95_total=quantile_interval(_column(day_rows, "total_s"), 0.95),
                cost=mean_interval(_column(day_rows, "cost_usd")),
                regenerations=k,
                regeneration=rate_interval(k, len(day_rows)),
                band=band,
                faithfulness=faith,
                judged=judged,
                no_claims=day_no_claims,
            )
        )
    stages = {}
    for stage in STAGES:
        values = _column(rows, f"{stage}_s")
        stages[stage] = (values.size, quantile_interval(values, 0.5), quantile_interval(values, 0.95))
    costs = _column(rows, "cost_usd")
    faith, judged, failed, no_claims = _faithfulness(whole, until, app)
    answers, _, _, _ = _faithfulness(whole, until, app, reading="answers")
    report = AppReport(
        app=app,
        traces=len(rows),
        days=days,
        stages=stages,
        cost=mean_interval(costs),
        priced=costs.size,
        unpriced=sum(1 for r in rows if r.unpriced or r.usage_unknown),
        regenerations=regenerations,
        regeneration=rate_interval(regenerations, len(rows)),
        faithfulness=faith,
        judged=judged,
        judge_failed=failed,
        no_claims=no_claims,
        drift_runs=drift_runs,
        faithful_answers=answers,
        band_note=_band_note(config, band_runs, drift_runs),
    )
    _new_groups(config, drift, tenant, report, since, until)
    return report


def _new_groups(
    config: RagmonConfig, drift: DriftStore, tenant: str, report: AppReport, since: datetime, until: datetime
) -> None:
    references = drift.latest_references(tenant, app=report.app)
    if not references:
        report.groups_note = (
            "No reference is pinned for this app, so there is nothing to call new "
            "(pin one: ragmon drift pin --from T --to T --app " + report.app + ")."
        )
        return
    notes = []
    for reference in references:
        reference_sample = drift.reference_sample(reference.id)
        ref_vectors, _ = reference_sample.vectors()
        window, _, _ = drift.draw(
            tenant,
            report.app,
            reference.model_key,
            since=since,
            until=until,
            capacity=config.drift.window_capacity,
            seed=config.drift.seed,
        )
        win_vectors, _ = window.vectors()
        if ref_vectors.shape[0] < 2 or win_vectors.shape[0] < 2:
            notes.append(f"{reference.label}: too few query vectors in the period ({win_vectors.shape[0]}).")
            continue
        embedder = None
        if reference.model_key == builtin_model_key(config.drift.embedder_dim):
            # ragmon embedded these queries: group them where `drift run`'s query-text test compared them
            stored = drift.reference_embedder(reference.id)
            embedder = reference_text_embedder(
                reference_sample.texts(), None if stored is None else stored[1], seed=config.drift.seed
            )
        groups = (
            explain_queries(
                reference_sample,
                window,
                embedder,
                alpha=config.drift.alpha,
                seed=config.drift.seed,
            )
            or []
        )
        significant = [g.to_json() | {"reference": reference.label} for g in groups if g.significant]
        report.groups.extend(significant[:10])
        if not significant:
            notes.append(
                f"{reference.label}: no group of queries is over-represented against the reference "
                f"({win_vectors.shape[0]} queries in the period, {ref_vectors.shape[0]} in the reference)."
            )
    report.groups_note = " ".join(notes)
