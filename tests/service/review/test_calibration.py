"""`service/review/calibration.py`: the 2x2 table, exclusions, and interval coverage over seeds."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest
from scipy.stats import binomtest

from service.review.calibration import calibrate, judge_says_faithful
from service.review.records import CalibrationRow

NOW = datetime(2025, 1, 1, tzinfo=UTC)


def row(judge: bool | None, verdict: str, queue: str = "blind", version: str = "v1") -> CalibrationRow:
    if judge is None:
        return CalibrationRow(queue, version, "failed", None, verdict, NOW)  # type: ignore[arg-type]
    return CalibrationRow(queue, version, "scored", 1.0 if judge else 0.5, verdict, NOW)  # type: ignore[arg-type]


def test_the_table_rates_and_exclusions_follow_the_definitions() -> None:
    rows = (
        [row(True, "faithful")] * 6
        + [row(True, "unfaithful")] * 2
        + [row(False, "faithful")] * 1
        + [row(False, "unfaithful")] * 3
        + [row(True, "unsure")] * 4
        + [row(None, "unfaithful")] * 2
        + [row(False, "unfaithful", queue="flagged")] * 5
    )
    blind, flagged = sorted(calibrate(rows), key=lambda c: c.sample)
    assert (blind.sample, flagged.sample) == ("blind", "flagged")
    assert (blind.faithful_faithful, blind.faithful_unfaithful) == (6, 2)
    assert (blind.unfaithful_faithful, blind.unfaithful_unfaithful) == (1, 3)
    assert (blind.unsure, blind.no_judge_verdict, blind.pairs) == (4, 2, 12)
    assert blind.agreement.value == pytest.approx(9 / 12)
    assert blind.false_approval.value == pytest.approx(2 / 8)
    assert blind.false_rejection.value == pytest.approx(1 / 4)
    p_e = (8 / 12) * (7 / 12) + (4 / 12) * (5 / 12)
    assert blind.kappa == pytest.approx((9 / 12 - p_e) / (1 - p_e))
    assert blind.kappa_lower < blind.kappa < blind.kappa_upper  # type: ignore[operator]
    wilson = binomtest(2, 8).proportion_ci(0.95, method="wilson")
    assert (blind.false_approval.lower, blind.false_approval.upper) == pytest.approx(
        (wilson.low, wilson.high)
    )
    # flagged items: the judge rejected all; kappa is undefined, false approval has no denominator
    assert flagged.pairs == 5 and flagged.kappa is None and flagged.false_approval.value is None
    assert flagged.false_rejection.value == 0.0 and flagged.false_rejection.upper > 0  # type: ignore[operator]


def test_versions_are_kept_apart_and_the_judge_verdict_is_binary() -> None:
    found = calibrate([row(True, "faithful", version="a"), row(False, "faithful", version="b")])
    assert [(c.judge_version, c.agreement.value) for c in found] == [("a", 1.0), ("b", 0.0)]
    assert judge_says_faithful("scored", 1.0) is True
    assert judge_says_faithful("scored", 0.99) is False
    assert judge_says_faithful("no_claims", None) is None
    with pytest.raises(ValueError):
        calibrate([], confidence=1.5)


def _draw(
    rng: np.random.Generator, n: int, prevalence: float, sensitivity: float, specificity: float
) -> list[CalibrationRow]:
    """A judge of known error rates against reviewers whose label is the truth."""
    truth_faithful = rng.random(n) < prevalence
    judge_faithful = np.where(truth_faithful, rng.random(n) < specificity, rng.random(n) >= sensitivity)
    return [
        row(bool(j), "faithful" if t else "unfaithful")
        for j, t in zip(judge_faithful, truth_faithful, strict=True)
    ]


def test_intervals_cover_the_true_values_at_about_their_level_over_seeds() -> None:
    prevalence, sensitivity, specificity, n = 0.7, 0.8, 0.9, 300
    # true values of the population the rows are drawn from
    p_ff = prevalence * specificity
    p_fu = (1 - prevalence) * (1 - sensitivity)
    p_uf = prevalence * (1 - specificity)
    p_uu = (1 - prevalence) * sensitivity
    true_false_approval = p_fu / (p_ff + p_fu)
    p_o = p_ff + p_uu
    judge_f, reviewer_f = p_ff + p_fu, p_ff + p_uf
    p_e = judge_f * reviewer_f + (1 - judge_f) * (1 - reviewer_f)
    true_kappa = (p_o - p_e) / (1 - p_e)
    seeds = 300
    covered_rate = covered_kappa = 0
    for seed in range(seeds):
        [c] = calibrate(_draw(np.random.default_rng(seed), n, prevalence, sensitivity, specificity))
        covered_rate += c.false_approval.lower <= true_false_approval <= c.false_approval.upper  # type: ignore[operator]
        covered_kappa += c.kappa_lower <= true_kappa <= c.kappa_upper  # type: ignore[operator]
    for covered in (covered_rate, covered_kappa):
        # the coverage itself, with a 99% interval over the seeds, must include 95%
        ci = binomtest(covered, seeds).proportion_ci(0.99, method="wilson")
        assert ci.low <= 0.95 <= ci.high, covered / seeds
