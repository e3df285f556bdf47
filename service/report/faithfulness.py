"""The report's faithfulness section: both readings, judge-only and human-corrected, and the judge's
agreement with the reviewers, each number with its n and interval, and the blind labels to ask for.

Per app over the report's period (`service.review.correction.HumanCorrection` with the period as its
window): the human-corrected estimate where the blind sample has at least `review.min_labels` labels
(the headline), the judge's own Hájek estimate beside it and named as such, the judged answers
without claims beside both (they are in neither denominator), judge-human agreement and kappa on the
blind pairs with the disagreement test against the reference period before, and the plan: how many
blind labels a week give the corrected interval ± `review.plan_half_width`, and the blind rate that
asks for them (`review.blind_rates`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sampler import CorrectedEstimate, FaithfulnessEstimate, LabelPlan
from service.judge.store import Reading
from service.review.agreement import Agreement
from service.review.correction import READINGS, HumanCorrection
from service.review.label_plan import plan_text

__all__ = ["FaithfulnessSection", "faithfulness_lines", "faithfulness_section"]

_WHAT: dict[Reading, str] = {
    "claims": "faithfulness (share of claims supported)",
    "answers": "faithful answers (share with no unsupported claim)",
}


@dataclass
class FaithfulnessSection:
    """One app's faithfulness over the period, both readings."""

    judge: dict[Reading, FaithfulnessEstimate | None] = field(default_factory=dict)
    corrected: dict[Reading, CorrectedEstimate | None] = field(default_factory=dict)
    plans: dict[Reading, LabelPlan] = field(default_factory=dict)
    agreement: Agreement | None = None
    blind_rate: float = 0.0


def faithfulness_section(
    correction: HumanCorrection, until: datetime, app: str, *, half_width: float, blind_rate: float
) -> FaithfulnessSection:
    """The section of `app` for the window of `correction` that ends at `until`."""
    section = FaithfulnessSection(blind_rate=blind_rate)
    for reading in READINGS:
        found = correction.compute(until, reading)
        key = (app,)
        section.judge[reading] = found.judge["app"].get(key)
        section.corrected[reading] = found.corrected["app"].get(key)
        plan = correction.plans(found, half_width).get(key)
        if plan is not None:
            section.plans[reading] = plan
    section.agreement = correction.agreement(until).get((app,))
    return section


def _interval(estimate: float, lower: float, upper: float) -> str:
    return f"{estimate:.3g} (95 % CI {lower:.3g}–{upper:.3g})"


def _reading_line(section: FaithfulnessSection, reading: Reading) -> str:
    judge = section.judge.get(reading)
    fixed = section.corrected.get(reading)
    if judge is None or judge.estimate is None or judge.lower is None or judge.upper is None:
        failed = 0 if judge is None else judge.n_failed
        return f"{_WHAT[reading]}: no judgments in this period ({failed} judge failures)"
    judge_text = (
        f"judge-only {_interval(judge.estimate, judge.lower, judge.upper)}, n = {judge.n_judged} judged "
        f"(Hájek, weighted by inclusion probability; sampling error only; not in it: {judge.n_failed} judge "
        f"failures, {judge.n_no_claims} answers without claims)"
    )
    if fixed is None or fixed.estimate is None or fixed.lower is None or fixed.upper is None:
        reason = "no blind labels" if fixed is None or fixed.reason is None else fixed.reason
        return f"{_WHAT[reading]}: {judge_text}; human-corrected: none ({reason})"
    return (
        f"{_WHAT[reading]}: human-corrected {_interval(fixed.estimate, fixed.lower, fixed.upper)}, "
        f"n = {fixed.n_human} blind labels of {fixed.n_judged} judged (the judge's estimate plus the mean "
        f"reviewer-minus-judge difference {fixed.mean_difference:+.3f}; its interval carries the judge's "
        f"error as the labels measure it); {judge_text}"
    )


def faithfulness_lines(section: FaithfulnessSection) -> list[str]:
    """The headline lines: each reading, agreement, and the label plan."""
    lines = [_reading_line(section, reading) for reading in READINGS]
    found = section.agreement
    if found is None or found.agreement.value is None:
        lines.append("judge-human agreement: no blind labels in this period")
    else:
        rate = found.agreement
        kappa = (
            "kappa undefined (one label only)"
            if found.kappa is None or found.kappa_lower is None or found.kappa_upper is None
            else f"kappa {_interval(found.kappa, found.kappa_lower, found.kappa_upper)}"
        )
        reference = found.reference_disagreement
        test = (
            "no reference pairs before the period to test against"
            if reference.value is None or found.p_value is None
            else f"disagreement {1 - (rate.value or 0):.3g} vs {reference.value:.3g} over {reference.total} "
            f"pairs before, one-sided Fisher p = {found.p_value:.2g}"
        )
        agree = _interval(rate.value or 0.0, rate.lower or 0.0, rate.upper or 0.0)
        lines.append(
            f"judge-human agreement (blind sample): {agree}, {kappa}, n = {rate.total} pairs; {test}"
        )
    for reading in READINGS:
        plan = section.plans.get(reading)
        if plan is not None:
            now = f"blind rate now {section.blind_rate:g}"
            lines.append(f"blind labels for the {reading} reading ({now}): {plan_text(plan)}")
    return lines
