"""`ReviewGauges`: the review queue's progress and the judge's calibration as Prometheus series.

Read at scrape time from the review store (all tenants), each reading cached
for `max_age_s` so one scrape costs one progress query and one calibration
query however many gauges it reads. Recording a review counts it and drops
the cache, so the next scrape shows it. Calibration series exist for the
`max_judge_versions` judge versions reviewed most recently; older versions
leave the gauges (their figures stay on the page). Reviewer names come from
config, so the reviewer label is a closed set.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from service.config import ReviewConfig
from service.metric_areas import REVIEW_QUEUES, REVIEW_STATES
from service.metric_tally import LabelledValues
from service.metrics import Metrics
from service.review.calibration import Calibration, calibrate
from service.review.records import Progress
from service.review.store import ReviewStore

__all__ = ["ReviewGauges"]

T = TypeVar("T")


class ReviewGauges:
    """Registers the review gauges on `metrics` and answers them from `store`."""

    def __init__(
        self, config: ReviewConfig, store: ReviewStore, metrics: Metrics, max_age_s: float = 1.0
    ) -> None:
        self.config = config
        self.store = store
        self.metrics = metrics
        self.max_age_s = max_age_s
        self._cache: dict[str, tuple[float, Any]] = {}
        self._lock = threading.Lock()
        metrics.watch_review(self._items, self._oldest_open_age, self._reviewer_items, self._calibration)

    def reviewed(self, queue: str, verdict: str) -> None:
        """Count a recorded review and let the next scrape read fresh figures."""
        self.metrics.reviews.labels(queue=queue, verdict=verdict).inc()
        self.refresh()

    def refresh(self) -> None:
        """Let the next scrape read fresh figures (a label changed without a new review)."""
        with self._lock:
            self._cache.clear()

    def _cached(self, key: str, read: Callable[[], T]) -> T:
        with self._lock:
            at, value = self._cache.get(key, (0.0, None))
            if value is not None and time.monotonic() - at <= self.max_age_s:
                return value  # type: ignore[no-any-return]
        value = read()
        with self._lock:
            self._cache[key] = (time.monotonic(), value)
        return value

    def _progress(self) -> Progress:
        return self._cached("progress", self.store.progress)

    def _items(self) -> LabelledValues:
        progress = self._progress()
        return [((q, s), float(progress.items.get((q, s), 0))) for q in REVIEW_QUEUES for s in REVIEW_STATES]

    def _oldest_open_age(self) -> LabelledValues:
        progress = self._progress()
        now = datetime.now(UTC)
        return [
            (
                (q,),
                max(0.0, (now - progress.oldest_open[q]).total_seconds())
                if q in progress.oldest_open
                else 0.0,
            )
            for q in REVIEW_QUEUES
        ]

    def _reviewer_items(self) -> LabelledValues:
        progress = self._progress()
        return [
            ((name, state), float(progress.reviewers.get((name, state), 0)))
            for name in sorted(self.config.reviewers)
            for state in ("claimed", "done")
        ]

    def _calibrations(self) -> Sequence[Calibration]:
        def read() -> list[Calibration]:
            rows = self.store.calibration_rows()
            latest: dict[str, datetime] = {}
            for row in rows:
                latest[row.judge_version] = max(
                    latest.get(row.judge_version, row.reviewed_at), row.reviewed_at
                )
            kept = set(
                sorted(latest, key=lambda v: latest[v], reverse=True)[: self.config.max_judge_versions]
            )
            return calibrate(r for r in rows if r.judge_version in kept)

        return self._cached("calibration", read)

    def _calibration(self, gauge: str) -> LabelledValues:
        values: list[tuple[Sequence[str], float]] = []
        for c in self._calibrations():
            rates = {
                "ragmon_judge_agreement_ratio": c.agreement,
                "ragmon_judge_false_approval_ratio": c.false_approval,
                "ragmon_judge_false_rejection_ratio": c.false_rejection,
            }
            by_gauge: dict[str, float | None] = {
                "ragmon_judge_kappa": c.kappa,
                "ragmon_judge_kappa_lower": c.kappa_lower,
                "ragmon_judge_kappa_upper": c.kappa_upper,
                "ragmon_judge_calibration_pairs": float(c.pairs),
            }
            for name, rate in rates.items():
                by_gauge |= {name: rate.value, f"{name}_lower": rate.lower, f"{name}_upper": rate.upper}
            value = by_gauge[gauge]
            if value is not None:
                values.append(((c.judge_version, c.sample), value))
        return values
