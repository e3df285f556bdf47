"""The faithfulness rate corrected by people: the judge's estimate plus the human-minus-judge difference.

A judge is a measuring instrument with its own error, and the Hájek estimate
(`estimate.py`) is unbiased for the *judge's* population value, not for the
truth. The blind review sample corrects it. The design has two phases:

* phase 1, the judged sample S1: the sampler's Poisson draw, trace i with
  inclusion probability π_i (after the budget's weighting-class adjustment,
  `admitted_shares`); the judge scores f_i;
* phase 2, the labelled sample S2 ⊂ S1: judged traces drawn into the blind
  review queue by trace id with rate r, independently of the labels and of
  the judge's verdict, and labelled by a reviewer (y_i). r is taken as the
  labelled share n2/n1 of the group's scored items, which is the blind rate
  when every blind item gets labelled (the draw ignores the stratum, so one
  r per group).

The estimator is the two-phase difference estimator (Särndal, Swensson &
Wretman, *Model Assisted Survey Sampling*, 1992, ch. 9), which is also the
prediction-powered estimate of Angelopoulos et al. (*Science* 382, 2023)
under a sampling design:

    θ̂ = Σ_S1 a·f / Σ_S1 a  +  Σ_S2 a·e / Σ_S2 a,      a = 1/π,  e = y − f

(the phase-2 weight 1/(π·r) reduces to 1/π inside the second ratio since r
is constant within a group). Because S2 is nested in S1 the two terms are
correlated and PPI's independent-samples variance (the sum of the two
variances) is not the right one. Writing θ̂ = ȳ_S1 + (ē_S2 − ē_S1), the
second part has mean zero given S1, so the variance is exactly

    V = V1 + V2,   V1 = Var(Hájek of y over S1),   V2 = E[Var(ē_S2 | S1)]

and with both phases Poisson (independent units) its linearization is
(1/N²) Σ_U [(1 − π)/π·(y − θ)² + (1 − r)/(π·r)·(e − ē)²]. From S2 alone,
with Σ_S2 a / r estimating N:

    V̂1 = r · Σ_S2 (1 − π)·a²·(y − θ̂)² / (Σ_S2 a)²
    V̂2 = (1 − r) · Σ_S2 a²·(e − ē)² / (Σ_S2 a)²

The interval is θ̂ ± z·√(V̂1 + V̂2) (method `two_phase`). Where V̂ is nil
(every label equals its judge score and every label is equal) it is Wilson's
interval on Kish's effective size of the labelled sample (`wilson_kish`),
as the judge-only estimate does. The estimate and bounds are clipped to
[0, 1]: a difference estimator can step outside them in a small sample.

What the interval carries: the sampling error of both phases, and the
judge's error as the blind labels measure it (its bias through ē, its noise
through V̂2). What it does not: the reviewers' own error (a label is taken as
the truth), labels missing not at random (a blind item skipped because it was
hard; work the blind queue to its end, or lower the rate), the judge's
no-claims calls (an answer the judge says makes no claim is outside both
phases, as in `estimate.py`), and failed or budget-refused items beyond the
adjustment `estimate.py` makes for them.

Below `min_labels` labels in a group there is no corrected estimate: the
normal approximation needs them, and so does an honest residual variance.
`LabelPlan` (`plan_labels`) turns the observed residual variance into the
number of blind labels a window needs for a chosen half-width.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from sampler.estimate import (
    FaithfulnessEstimate,
    Grouping,
    JudgedSample,
    SampleCell,
    admitted_shares,
    cells_of,
    check_grouping,
    check_inclusion_probability,
    group_key,
    hajek_cells,
)
from sampler.interval import NEGLIGIBLE_VARIANCE, normal_quantile, wilson

__all__ = [
    "ASSUMED_RESIDUAL_VARIANCE",
    "CorrectedEstimate",
    "LabelPlan",
    "LabelledSample",
    "corrected",
    "corrected_by",
    "corrected_cells",
    "group_plans",
    "plan_labels",
]

# The residual variance a plan assumes before there are labels to measure it: the variance of a fair
# coin, as large as the residuals of a judge that is right three times in four.
ASSUMED_RESIDUAL_VARIANCE = 0.25
# A plan measures the residual variance from at least this many labels, else it assumes the above.
_PLAN_MIN_LABELS = 10
_WEEK_S = 7 * 86400.0


@dataclass(frozen=True, slots=True)
class LabelledSample:
    """One judged trace of the blind sample with its reviewer's label.

    `judge_score` is the judge's score of the reading (claims: share of claims
    supported; answers: 1 faithful, 0 not), `human_score` the reviewer's on
    the same scale. `stratum` and `inclusion_probability` are the trace's
    judge-queue record's, so the budget adjustment finds its design cell.
    Raises ValueError on a probability outside (0, 1] or a score that is NaN
    or outside [0, 1].
    """

    inclusion_probability: float
    judge_score: float
    human_score: float
    stratum: str = "base"
    app: str = "unknown"
    release: str | None = None
    intent: str | None = None

    def __post_init__(self) -> None:
        check_inclusion_probability(self.inclusion_probability)
        for name in ("judge_score", "human_score"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and 0.0 <= value <= 1.0):
                raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")


@dataclass(frozen=True, slots=True)
class CorrectedEstimate:
    """The human-corrected rate with its interval, or why there is none (`reason`).

    `estimate`, `lower`, `upper` are None below `min_labels` labels (or with no
    judged item). `n_human` labels of `n_judged` scored items; `judge_estimate`
    is the judge-only Hájek estimate it corrects, `mean_difference` the
    weighted mean human-minus-judge difference added to it, `labelled_share`
    the phase-2 rate r = n_human / n_judged. `variance_judged` (V̂1) and
    `variance_labelled` (V̂2) are the two phases' parts of the variance and
    `residual_variance` the per-label variance of the difference that a plan
    for more labels scales (V̂2 = residual_variance·(1/n_human − 1/n_judged)).
    """

    estimate: float | None
    lower: float | None
    upper: float | None
    n_human: int
    n_judged: int
    judge_estimate: float | None
    mean_difference: float | None
    labelled_share: float
    variance_judged: float | None
    variance_labelled: float | None
    residual_variance: float | None
    method: Literal["two_phase", "wilson_kish", "none"]
    reason: str | None
    confidence: float


def corrected(
    judged: Iterable[JudgedSample],
    labelled: Iterable[LabelledSample],
    *,
    confidence: float = 0.95,
    min_labels: int = 30,
) -> CorrectedEstimate:
    """The corrected estimate of one group from its judged sample and the labelled part of it."""
    return corrected_cells(cells_of(judged), labelled, confidence=confidence, min_labels=min_labels)


def corrected_cells(
    cells: Iterable[SampleCell],
    labelled: Iterable[LabelledSample],
    *,
    confidence: float = 0.95,
    min_labels: int = 30,
) -> CorrectedEstimate:
    """`corrected` over a judged sample already summed into cells (their group fields are not read).

    Raises ValueError when a label's (stratum, inclusion probability) has no admitted judged item in
    the cells, or when there are more labels than scored items: a label outside the judged sample
    cannot be part of its random subsample."""
    z = normal_quantile(confidence)
    if min_labels < 2:
        raise ValueError(f"min_labels must be >= 2, got {min_labels}")
    cells = list(cells)
    labels = list(labelled)
    judge = hajek_cells(cells, confidence=confidence)
    n1 = judge.n_judged
    n2 = len(labels)
    if n2 > n1:
        raise ValueError(f"{n2} labels but only {n1} scored judged items: labels must be a subsample")
    shares = admitted_shares(cells)
    missing = {(s.stratum, s.inclusion_probability) for s in labels} - set(shares)
    if missing:
        raise ValueError(f"labels from design cells with no judged item: {sorted(missing)}")
    share = n2 / n1 if n1 else 0.0

    def none(reason: str) -> CorrectedEstimate:
        return CorrectedEstimate(
            estimate=None,
            lower=None,
            upper=None,
            n_human=n2,
            n_judged=n1,
            judge_estimate=judge.estimate,
            mean_difference=None,
            labelled_share=share,
            variance_judged=None,
            variance_labelled=None,
            residual_variance=None,
            method="none",
            reason=reason,
            confidence=confidence,
        )

    if judge.estimate is None:
        return none("no scored judgments in the window")
    if n2 < min_labels:
        return none(f"{n2} blind labels, fewer than the {min_labels} needed")
    pi = np.array([s.inclusion_probability * shares[(s.stratum, s.inclusion_probability)] for s in labels])
    f = np.array([s.judge_score for s in labels])
    y = np.array([s.human_score for s in labels])
    a = 1.0 / pi
    total = float(a.sum())
    e = y - f
    e_bar = float(np.dot(a, e) / total)
    theta = judge.estimate + e_bar
    r = share
    v1 = r * float(np.sum((1.0 - pi) * a * a * (y - theta) ** 2)) / total**2
    residual = float(np.sum(a * a * (e - e_bar) ** 2)) / total**2
    v2 = (1.0 - r) * residual
    variance = v1 + v2
    estimate = min(1.0, max(0.0, theta))
    method: Literal["two_phase", "wilson_kish"] = "two_phase"
    if variance <= NEGLIGIBLE_VARIANCE:
        n_eff = total**2 / float(np.dot(a, a))
        lower, upper = wilson(estimate, n_eff, z)
        method = "wilson_kish"
    else:
        # Student's t on Kish's effective size of the labelled sample, not the normal quantile: the
        # labels are few and unequally weighted (every thumbs-down is judged, 2 % of the rest), and
        # with ~50 effective labels the normal interval covered 93.7 % where 95 % was asked
        from scipy.stats import t as student_t

        n_eff = total**2 / float(np.dot(a, a))
        half = float(student_t.ppf(0.5 + confidence / 2.0, max(n_eff - 1.0, 1.0))) * math.sqrt(variance)
        lower, upper = max(0.0, theta - half), min(1.0, theta + half)
    return CorrectedEstimate(
        estimate=estimate,
        lower=min(lower, estimate),
        upper=max(upper, estimate),
        n_human=n2,
        n_judged=n1,
        judge_estimate=judge.estimate,
        mean_difference=e_bar,
        labelled_share=share,
        variance_judged=v1,
        variance_labelled=v2,
        residual_variance=residual * n2,
        method=method,
        reason=None,
        confidence=confidence,
    )


def corrected_by(
    cells: Iterable[SampleCell],
    labelled: Iterable[LabelledSample],
    grouping: Grouping,
    *,
    confidence: float = 0.95,
    min_labels: int = 30,
) -> dict[tuple[str, ...], CorrectedEstimate]:
    """`corrected_cells` per group (as `estimate_cells_by` groups), over a window's cells and labels.

    Every group with a judged cell gets an entry (with a `reason` where it has too few labels)."""
    check_grouping(grouping)
    cell_groups: dict[tuple[str, ...], list[SampleCell]] = defaultdict(list)
    label_groups: dict[tuple[str, ...], list[LabelledSample]] = defaultdict(list)
    for c in cells:
        key = group_key(c, grouping)
        if key is not None:
            cell_groups[key].append(c)
    for s in labelled:
        key = group_key(s, grouping)
        if key is not None:
            label_groups[key].append(s)
    orphans = set(label_groups) - set(cell_groups)
    if orphans:
        raise ValueError(f"labels of groups with no judged item: {sorted(orphans)}")
    return {
        key: corrected_cells(group, label_groups.get(key, ()), confidence=confidence, min_labels=min_labels)
        for key, group in sorted(cell_groups.items())
    }


@dataclass(frozen=True, slots=True)
class LabelPlan:
    """How many blind labels a window needs for the corrected estimate's interval to be ± `half_width`.

    `labels_per_window` labels among the window's `n_judged` scored items
    (None when labels alone cannot get there: the judged sample's own variance
    already exceeds the target, `reason` says so), the same as
    `labels_per_week`, and `blind_rate`, the share of judged traces to send to
    the blind queue for it (every blind item labelled). `residual_variance`
    is measured from `from_labels` labels, or `ASSUMED_RESIDUAL_VARIANCE`
    (`assumed`) below 10. `current_half_width` is today's, when there is a
    corrected estimate.
    """

    half_width: float
    confidence: float
    n_judged: int
    from_labels: int
    residual_variance: float
    assumed: bool
    labels_per_window: int | None
    labels_per_week: float | None
    blind_rate: float | None
    current_half_width: float | None
    reason: str | None


def plan_labels(
    estimate: CorrectedEstimate,
    judge: FaithfulnessEstimate,
    *,
    half_width: float,
    window_s: float,
) -> LabelPlan:
    """The blind labels per window (and per week) that give the corrected rate a 95 % (the estimate's
    confidence) interval of ± `half_width`, from the residual variance the labels show so far.

    Solves z²·(V̂1 + s²·(1/n2 − 1/n1)) ≤ h² for n2, with s² the per-label residual variance. Before
    labels, the judge's own phase-1 variance stands in for V̂1 (read from its interval) and s² is
    assumed (`ASSUMED_RESIDUAL_VARIANCE`)."""
    if not 0.0 < half_width < 0.5:
        raise ValueError(f"half_width must be in (0, 0.5), got {half_width!r}")
    if not window_s > 0:
        raise ValueError(f"window_s must be positive, got {window_s!r}")
    z = normal_quantile(estimate.confidence)
    n1 = estimate.n_judged
    measured = (
        estimate.residual_variance is not None
        and estimate.variance_judged is not None
        and estimate.n_human >= _PLAN_MIN_LABELS
    )
    if measured and estimate.residual_variance is not None and estimate.variance_judged is not None:
        residual, v1 = estimate.residual_variance, estimate.variance_judged
    else:
        residual = ASSUMED_RESIDUAL_VARIANCE
        v1 = _judge_variance(judge, z)
    current = None
    if estimate.lower is not None and estimate.upper is not None:
        current = (estimate.upper - estimate.lower) / 2.0

    def plan(n2: int | None, reason: str | None) -> LabelPlan:
        return LabelPlan(
            half_width=half_width,
            confidence=estimate.confidence,
            n_judged=n1,
            from_labels=estimate.n_human if measured else 0,
            residual_variance=residual,
            assumed=not measured,
            labels_per_window=n2,
            labels_per_week=None if n2 is None else n2 * _WEEK_S / window_s,
            blind_rate=None if n2 is None or n1 == 0 else min(1.0, n2 / n1),
            current_half_width=current,
            reason=reason,
        )

    if n1 == 0:
        return plan(None, "no scored judgments in the window to plan from")
    room = (half_width / z) ** 2 - v1
    if room <= 0:
        return plan(None, "the judged sample alone is wider than that: judge more traces or widen the window")
    needed = residual / (room + residual / n1) if residual > 0 else 2.0
    n2 = max(2, math.ceil(needed - 1e-9))
    if n2 > n1:
        return plan(None, f"needs {n2} labels but the window has only {n1} judged answers to label")
    return plan(n2, None)


def _judge_variance(judge: FaithfulnessEstimate, z: float) -> float:
    """The judge-only estimate's variance, read back from its interval (0 without one)."""
    if judge.lower is None or judge.upper is None:
        return 0.0
    return ((judge.upper - judge.lower) / (2.0 * z)) ** 2


def group_plans(
    estimates: Mapping[tuple[str, ...], CorrectedEstimate],
    judges: Mapping[tuple[str, ...], FaithfulnessEstimate],
    *,
    half_width: float,
    window_s: float,
) -> dict[tuple[str, ...], LabelPlan]:
    """`plan_labels` for every group present in both mappings."""
    return {
        key: plan_labels(est, judges[key], half_width=half_width, window_s=window_s)
        for key, est in estimates.items()
        if key in judges
    }
