"""`HumanCorrection`: the faithfulness readings corrected by the blind review labels, and agreement.

For each reading (`claims`, `answers`) and grouping (app, app and release,
app and intent) of the rolling window: the judge's Hájek estimate over the
judged sample (`JudgmentStore.window_cells`) and the human-corrected one
(`sampler.corrected`: the judge's estimate plus the weighted mean
human-minus-judge difference over the blind sample's labels,
`blind_labels.py`, with an interval that carries both phases' sampling
error and the judge's error as the labels measure it). Below
`review.min_labels` labels a group has no corrected estimate, and says why.

Per app it also keeps judge-human agreement and kappa over the window and
the disagreement test against the reference period before it
(`agreement.py`).

`export` sets the gauges (`ragmon_faithfulness_corrected_estimate`,
`ragmon_faithful_answers_corrected_ratio`, each with `_lower`/`_upper`,
`ragmon_faithfulness_human_labels`, `ragmon_judge_human_*`) every
`judging.estimate_every_s`, one set per tenant when the metrics carry a
tenant label, and removes a corrected series whose group fell under the
minimum, so an alert never reads a number that no longer holds. Reads are
blocking (SQL); `start` runs them in a thread.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from prometheus_client import Gauge

from sampler import GROUPINGS, FaithfulnessEstimate, Grouping, estimate_cells_by
from sampler.corrected import CorrectedEstimate, LabelledSample, LabelPlan, corrected_by, group_plans
from sampler.estimate import SampleCell
from service.config import JudgingConfig, ReviewConfig
from service.judge.judging import refresh_estimates
from service.judge.store import READINGS, JudgmentStore, Reading
from service.lifecycle import cancel_task
from service.metrics import Metrics
from service.review.agreement import Agreement, agreement
from service.review.blind_labels import BlindLabel, blind_labels

__all__ = ["READINGS", "HumanCorrection", "WindowEstimates"]

Key = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class WindowEstimates:
    """One reading over one window: the judge-only estimate and the corrected one, per grouping and group."""

    reading: Reading
    start: datetime
    end: datetime
    judge: dict[Grouping, dict[Key, FaithfulnessEstimate]]
    corrected: dict[Grouping, dict[Key, CorrectedEstimate]]


def _labelled(labels: Iterable[BlindLabel], reading: Reading) -> list[LabelledSample]:
    return [s for s in (label.for_reading(reading) for label in labels) if s is not None]


class HumanCorrection:
    """Computes the corrected readings and agreement over a window; exports them as gauges when scheduled.

    Over every tenant, one tenant at a time when the metrics carry a tenant label, or one tenant's only
    when `tenant` is given. `window_s` overrides `judging.estimate_window_s` (the report's period)."""

    def __init__(
        self,
        judging: JudgingConfig,
        review: ReviewConfig,
        judgments: JudgmentStore,
        metrics: Metrics,
        *,
        tenant: str | None = None,
        window_s: float | None = None,
    ) -> None:
        self.judging = judging
        self.review = review
        self.judgments = judgments
        self.metrics = metrics
        self.tenant = tenant
        self.window_s = window_s if window_s is not None else judging.estimate_window_s
        if not self.window_s > 0:
            raise ValueError(f"window_s must be positive, got {self.window_s!r}")
        self._task: asyncio.Task[None] | None = None
        self._exported: dict[Gauge, set[tuple[str, ...]]] = {}

    def _window(self, now: datetime | None) -> tuple[datetime, datetime]:
        end = now or datetime.now(UTC)
        return end - timedelta(seconds=self.window_s), end

    def compute(
        self, now: datetime | None = None, reading: Reading = "claims", *, tenant: str | None = None
    ) -> WindowEstimates:
        """Both estimates of `reading` for every group of the window that ends at `now`."""
        start, end = self._window(now)
        tenant = tenant or self.tenant
        cells = self.judgments.window_cells(start, end, tenant=tenant, reading=reading)
        return self._estimates(start, end, reading, cells, tenant)

    def _estimates(
        self, start: datetime, end: datetime, reading: Reading, cells: list[SampleCell], tenant: str | None
    ) -> WindowEstimates:
        labels = _labelled(blind_labels(self.judgments.engine, start, end, tenant=tenant), reading)
        return WindowEstimates(
            reading=reading,
            start=start,
            end=end,
            judge={g: estimate_cells_by(cells, g) for g in GROUPINGS},
            corrected={
                g: corrected_by(cells, labels, g, min_labels=self.review.min_labels) for g in GROUPINGS
            },
        )

    def plans(
        self, estimates: WindowEstimates, half_width: float, grouping: Grouping = "app"
    ) -> dict[Key, LabelPlan]:
        """How many blind labels a week each group needs for a corrected interval of ± `half_width`."""
        return group_plans(
            estimates.corrected[grouping],
            estimates.judge[grouping],
            half_width=half_width,
            window_s=self.window_s,
        )

    def agreement(self, now: datetime | None = None, *, tenant: str | None = None) -> dict[Key, Agreement]:
        """Judge-human agreement per app over the window, tested against the reference period before it."""
        start, end = self._window(now)
        tenant = tenant or self.tenant
        reference_start = start - timedelta(seconds=self.review.agreement_reference_s)
        engine = self.judgments.engine
        window = _labelled(blind_labels(engine, start, end, tenant=tenant), "answers")
        reference = _labelled(blind_labels(engine, reference_start, start, tenant=tenant), "answers")
        by_app: dict[Key, tuple[list[LabelledSample], list[LabelledSample]]] = defaultdict(lambda: ([], []))
        for pair in window:
            by_app[(pair.app,)][0].append(pair)
        for pair in reference:
            by_app[(pair.app,)][1].append(pair)
        return {key: agreement(w, r) for key, (w, r) in sorted(by_app.items())}

    # -- gauges -----------------------------------------------------------------------------------

    def export(self) -> None:
        """Set every corrected and agreement gauge, per tenant when the metrics carry a tenant label;
        series of groups that no longer have a value are removed."""
        now = datetime.now(UTC)
        start, end = self._window(now)
        exported: dict[Gauge, set[tuple[str, ...]]] = defaultdict(set)
        if self.metrics.tenant_label is None or self.tenant is not None:
            cells = self.judgments.window_cells_of(start, end, READINGS, tenant=self.tenant)
            self._export(now, self.tenant, cells, exported)
        else:
            # every tenant's cells from one pass over the window; the tenants with blind labels in
            # the agreement's reference period too (few rows, where listing every judge-queue
            # record's tenant over that period read a week of them)
            per_tenant = self.judgments.window_cells_per_tenant(start, end, READINGS)
            reference_start = start - timedelta(seconds=self.review.agreement_reference_s)
            labelled = {label.tenant for label in blind_labels(self.judgments.engine, reference_start, end)}
            for tenant in sorted(set(per_tenant) | labelled):
                none: dict[Reading, list[SampleCell]] = {reading: [] for reading in READINGS}
                self._export(now, tenant, per_tenant.get(tenant, none), exported)
        for gauge, previous in self._exported.items():
            for values in previous - exported.get(gauge, set()):
                gauge.remove(*values)
        self._exported = dict(exported)

    def _export(
        self,
        now: datetime,
        tenant: str | None,
        cells: dict[Reading, list[SampleCell]],
        exported: dict[Gauge, set[tuple[str, ...]]],
    ) -> None:
        m = self.metrics
        start, end = self._window(now)

        def put(gauge: Gauge, labels: dict[str, str], value: float | None) -> None:
            if value is None:
                return
            gauge.labels(**labels).set(value)
            exported[gauge].add(tuple(labels.values()))

        for reading in READINGS:
            found = self._estimates(start, end, reading, cells[reading], tenant)
            point, lower, upper = m.corrected[reading]
            for grouping, estimates in found.corrected.items():
                for key, est in estimates.items():
                    release = m.release_label(tenant, key[1]) if grouping == "app_release" else "all"
                    intent = m.intent_label(tenant, key[1]) if grouping == "app_intent" else "all"
                    labels = {**m.scope_kw(tenant, key[0]), "release": release, "intent": intent}
                    put(m.human_labels, {**labels, "reading": reading}, float(est.n_human))
                    put(point, labels, est.estimate)
                    put(lower, labels, est.lower)
                    put(upper, labels, est.upper)
        gauges = m.human_agreement
        for (app,), found_agreement in self.agreement(now, tenant=tenant).items():
            labels = m.scope_kw(tenant, app)
            rate, reference = found_agreement.agreement, found_agreement.reference_disagreement
            put(gauges["ragmon_judge_human_agreement_ratio"], labels, rate.value)
            put(gauges["ragmon_judge_human_agreement_ratio_lower"], labels, rate.lower)
            put(gauges["ragmon_judge_human_agreement_ratio_upper"], labels, rate.upper)
            put(gauges["ragmon_judge_human_kappa"], labels, found_agreement.kappa)
            put(gauges["ragmon_judge_human_kappa_lower"], labels, found_agreement.kappa_lower)
            put(gauges["ragmon_judge_human_kappa_upper"], labels, found_agreement.kappa_upper)
            put(gauges["ragmon_judge_human_pairs"], labels, float(rate.total))
            put(gauges["ragmon_judge_human_disagreement_reference_ratio"], labels, reference.value)
            put(gauges["ragmon_judge_human_reference_pairs"], labels, float(reference.total))
            put(gauges["ragmon_judge_human_disagreement_p_value"], labels, found_agreement.p_value)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(
                refresh_estimates(self.export, self.judging.estimate_every_s, "human-corrected estimate"),
                name="human-correction",
            )

    async def stop(self) -> None:
        """Stop recomputing. Safe twice and before start."""
        await cancel_task(self._task)
        self._task = None
