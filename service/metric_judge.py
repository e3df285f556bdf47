"""`JudgeMetrics`: the judge's series: what was sampled, deferred, judged and at what cost, the
faithfulness estimates, their human-corrected readings, and judge-human agreement per app.

`Metrics` (service/metrics.py) derives from it as from the other areas' classes
(service/metric_areas.py), and declares it first. A module of its own as the largest area;
the judge/reviewer calibration gauges are read from the review store, so they stay with
`ReviewMetrics`.
"""

from __future__ import annotations

from typing import get_args

from prometheus_client import Counter, Gauge, Histogram

from sampler.queue import EXPIRED
from service.labels import FailureReason
from service.metric_base import DURATION_BUCKETS, MetricsBase

# Judge-human agreement per app over the rolling window, from the blind sample (service/review/agreement.py).
_JUDGE_HUMAN_ESTIMATES = {
    "ragmon_judge_human_agreement_ratio": "share of blind pairs in the window where judge and reviewer agree",
    "ragmon_judge_human_kappa": "Cohen's kappa between judge and reviewer on the window's blind pairs",
}
JUDGE_HUMAN_GAUGES = {
    **_JUDGE_HUMAN_ESTIMATES,
    **{
        f"{name}_{bound}": f"{bound} bound of the 95 % interval: {doc}"
        for name, doc in _JUDGE_HUMAN_ESTIMATES.items()
        for bound in ("lower", "upper")
    },
    "ragmon_judge_human_pairs": "blind judge/reviewer pairs in the window (unsure left out)",
    "ragmon_judge_human_disagreement_reference_ratio": "share of blind pairs that disagree in the reference "
    "period before the window (review.agreement_reference_s)",
    "ragmon_judge_human_reference_pairs": "blind judge/reviewer pairs in the reference period",
    "ragmon_judge_human_disagreement_p_value": "one-sided Fisher exact p-value: the window's judge-human "
    "disagreement is above the reference period's",
}


class JudgeMetrics(MetricsBase):
    """The judge: what was sampled, deferred, judged and at what cost; the faithfulness estimates."""

    def _declare_judge_metrics(self) -> None:
        r = self.registry
        self.judge_sampled = Counter(
            "ragmon_judge_sampled",
            "traces the sampler put in the judge queue, by deciding stratum",
            ["stratum"],
            registry=r,
        )
        self.judge_skipped = Counter(
            "ragmon_judge_skipped",
            "traces selected for judging that were never judged, by reason (expired: the budget kept them "
            "deferred past budget.max_deferral_s); kept, visible, corrected for in the estimate",
            [*self.tenant_scope_labels, "reason"],
            registry=r,
        )
        self.judge_deferred = Counter(
            "ragmon_judge_deferred",
            "traces whose turn for the judge came when the budget had no room, each counted once: kept "
            "in the queue and judged as the budget refills, in fair shares of the tenants waiting",
            [*self.tenant_scope_labels],
            registry=r,
        )
        self.judge_requests = Counter(
            "ragmon_judge_requests", "calls made to the judge model (retries included)", ["judge"], registry=r
        )
        self.judge_completed = Counter(
            "ragmon_judge_completed",
            "judgments stored (any outcome), once per trace and judge version, and once more for each "
            "re-judgment that replaced one (ragmon_judge_rejudged)",
            ["judge"],
            registry=r,
        )
        self.judge_rejudged = Counter(
            "ragmon_judge_rejudged",
            "judged traces queued again because a later version changed what the judge reads (an answer "
            "that arrived late); the estimate keeps the latest judgment of each trace",
            registry=r,
        )
        self.judge_failures = Counter(
            "ragmon_judge_failures",
            "judge attempts or judgments that failed, by reason",
            ["reason"],
            registry=r,
        )
        self.judge_verdicts = Counter(
            "ragmon_judge_verdicts",
            "judgments by verdict: faithful, unfaithful, no_claims, failed",
            [*self.scope_labels, "verdict", "judge"],
            registry=r,
        )
        self.judge_diagnoses = Counter(
            "ragmon_judge_diagnoses",
            "judged traces by diagnosis (ok, retrieval_failure, generation_failure, ...)",
            [*self.scope_labels, "diagnosis"],
            registry=r,
        )
        self.judge_cost = Counter("ragmon_judge_cost_usd", "judge spend in USD", ["judge"], registry=r)
        self.judge_tokens = Counter(
            "ragmon_judge_tokens", "judge model tokens", ["judge", "kind"], registry=r
        )
        self.judge_calls_without_usage = Counter(
            "ragmon_judge_calls_without_usage",
            "judge replies whose provider reported no token usage",
            ["judge"],
            registry=r,
        )
        self.judge_duration = Histogram(
            "ragmon_judge_duration_seconds",
            "wall time of one judgment, retries and backoff included",
            ["judge"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.judge_last_success = Gauge(
            "ragmon_judge_last_success_timestamp_seconds", "when the judge last stored a judgment", registry=r
        )
        # Series that start at 0, so rate() and alerts see them before the first event.
        for reason in (*get_args(FailureReason), "trace_missing", "judge_unavailable"):
            self.judge_failures.labels(reason=reason)
        for tenant in self._named_tenants() if self.tenant_label is not None else [None]:
            self.judge_skipped.labels(*self.tenant_scope(tenant), EXPIRED)
            if self.tenant_label is not None:
                self.judge_deferred.labels(*self.tenant_scope(tenant))
        for judge in ("llm", "heuristic"):
            self.judge_cost.labels(judge=judge)
            self.judge_completed.labels(judge=judge)
        self.review_flags = Counter(
            "ragmon_review_flags",
            "traces flagged for review, by reason",
            [*self.scope_labels, "reason"],
            registry=r,
        )
        estimate_labels = [*self.scope_labels, "release", "intent"]
        self.faithfulness_estimate = Gauge(
            "ragmon_faithfulness_estimate",
            "Hajek (inverse-probability weighted) faithfulness over the rolling window; release/intent 'all' "
            "for the app-wide estimate",
            estimate_labels,
            registry=r,
        )
        self.faithfulness_lower = Gauge(
            "ragmon_faithfulness_estimate_lower",
            "lower bound of the 95% interval of the faithfulness estimate",
            estimate_labels,
            registry=r,
        )
        self.faithfulness_upper = Gauge(
            "ragmon_faithfulness_estimate_upper",
            "upper bound of the 95% interval of the faithfulness estimate",
            estimate_labels,
            registry=r,
        )
        self.faithful_answers = Gauge(
            "ragmon_faithful_answers_ratio",
            "Hajek estimate of the share of answers with no unsupported claim (answer-level reading; "
            "ragmon_faithfulness_estimate is the share of supported claims)",
            estimate_labels,
            registry=r,
        )
        self.faithful_answers_lower = Gauge(
            "ragmon_faithful_answers_ratio_lower",
            "lower bound of the 95% interval of the share of faithful answers",
            estimate_labels,
            registry=r,
        )
        self.faithful_answers_upper = Gauge(
            "ragmon_faithful_answers_ratio_upper",
            "upper bound of the 95% interval of the share of faithful answers",
            estimate_labels,
            registry=r,
        )
        self.faithfulness_no_claims = Gauge(
            "ragmon_faithfulness_no_claims",
            "judged answers with no claims in the window: in neither reading's denominator",
            estimate_labels,
            registry=r,
        )
        self.faithfulness_sample_size = Gauge(
            "ragmon_faithfulness_sample_size",
            "scored judgments behind the faithfulness estimate",
            estimate_labels,
            registry=r,
        )
        self._declare_corrected_metrics(estimate_labels)

    def _declare_corrected_metrics(self, estimate_labels: list[str]) -> None:
        """The human-corrected readings (service/review/correction.py) and judge-human agreement per app."""
        r = self.registry
        corrected = {
            "claims": ("ragmon_faithfulness_corrected_estimate", "share of claims supported"),
            "answers": (
                "ragmon_faithful_answers_corrected_ratio",
                "share of answers with no unsupported claim",
            ),
        }
        self.corrected: dict[str, tuple[Gauge, Gauge, Gauge]] = {}
        for reading, (name, what) in corrected.items():

            def bound(which: str, name: str = name, what: str = what) -> Gauge:
                return Gauge(
                    f"{name}_{which}",
                    f"{which} bound of the 95% interval of the human-corrected {what} (both phases' "
                    "sampling error and the judge's error as the blind labels measure it)",
                    estimate_labels,
                    registry=r,
                )

            point = Gauge(
                name,
                f"human-corrected {what}: the judge's Hajek estimate plus the weighted mean "
                "reviewer-minus-judge difference on the blind sample; absent below review.min_labels "
                "blind labels",
                estimate_labels,
                registry=r,
            )
            self.corrected[reading] = (point, bound("lower"), bound("upper"))
        self.human_labels = Gauge(
            "ragmon_faithfulness_human_labels",
            "blind human labels in the window behind the human-corrected estimate, by reading",
            [*estimate_labels, "reading"],
            registry=r,
        )
        scope = list(self.scope_labels)
        self.human_agreement = {
            name: Gauge(name, doc, scope, registry=r) for name, doc in JUDGE_HUMAN_GAUGES.items()
        }

    def count_deferred(self, tenant: str, count: int) -> None:
        """`count` of the tenant's traces deferred by the judge budget for the first time."""
        scope = self.tenant_scope(tenant)
        (self.judge_deferred.labels(*scope) if scope else self.judge_deferred).inc(count)

    def count_expired(self, tenant: str, count: int) -> None:
        """`count` of the tenant's deferred traces that ended skipped (`max_deferral_s` passed)."""
        self.judge_skipped.labels(*self.tenant_scope(tenant), EXPIRED).inc(count)
