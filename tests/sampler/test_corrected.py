"""Tests for sampler/corrected.py: the human-corrected (two-phase difference) estimate, its interval's
coverage of the truth over seeded simulations with a biased judge, the label plan, and bad input."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from scipy.stats import norm

from sampler.corrected import (
    ASSUMED_RESIDUAL_VARIANCE,
    CorrectedEstimate,
    LabelledSample,
    corrected,
    corrected_by,
    plan_labels,
)
from sampler.estimate import FaithfulnessEstimate, JudgedSample, cells_of, hajek

BASE_PI = 0.1
BLIND_RATE = 0.05


@dataclass(frozen=True)
class Simulated:
    truth: float
    judge: FaithfulnessEstimate
    corrected: CorrectedEstimate


def simulate(seed: int, reading: str, n: int = 20_000, true_share: float | None = None) -> Simulated:
    """One app's traffic with a known true faithfulness, judged by a judge biased by a known amount.

    Every thumbs-down is judged (π = 1; unfaithful answers get one 7x as often), the rest at 10 %; the
    budget refuses a random 10 % of the base stratum's picks. The blind draw takes 5 % of the judged
    answers, and reviewers label every one truthfully. Answers (`answers`): the judge passes an
    unfaithful answer half the time (a bias of +0.5 x the unfaithful share). Claims (`claims`): of an
    answer's 4 claims the judge calls each unsupported one supported with probability 0.5.
    """
    rng = np.random.default_rng(seed)
    share = true_share if true_share is not None else rng.uniform(0.3, 0.6)
    if reading == "answers":
        y = (rng.random(n) < share).astype(float)
        f = np.where(y == 1.0, rng.random(n) < 0.95, rng.random(n) < 0.5).astype(float)
        bad = y < 1.0
    else:
        q = rng.beta(8 * share, 8 * (1 - share), n)
        supported = rng.binomial(4, q)
        y = supported / 4.0
        f = (supported + rng.binomial(4 - supported, 0.5)) / 4.0
        bad = y < 0.75
    thumbs_down = rng.random(n) < np.where(bad, 0.14, 0.02)
    pi = np.where(thumbs_down, 1.0, BASE_PI)
    picked = rng.random(n) < pi
    skipped = picked & ~thumbs_down & (rng.random(n) < 0.10)
    judged_idx = np.flatnonzero(picked & ~skipped)
    judged = [
        JudgedSample(
            inclusion_probability=float(pi[i]),
            outcome="scored",
            score=float(f[i]),
            stratum="thumbs_down" if thumbs_down[i] else "base",
        )
        for i in judged_idx
    ]
    judged += [
        JudgedSample(inclusion_probability=BASE_PI, outcome="skipped", stratum="base")
        for _ in range(int(skipped.sum()))
    ]
    blind = judged_idx[rng.random(judged_idx.size) < BLIND_RATE]
    labels = [
        LabelledSample(
            inclusion_probability=float(pi[i]),
            judge_score=float(f[i]),
            human_score=float(y[i]),
            stratum="thumbs_down" if thumbs_down[i] else "base",
        )
        for i in blind
    ]
    return Simulated(float(y.mean()), hajek(judged), corrected(judged, labels))


def covers(low: float | None, high: float | None, truth: float) -> bool:
    assert low is not None and high is not None
    return low <= truth <= high


@pytest.mark.parametrize("reading", ["answers", "claims"])
def test_the_corrected_interval_covers_the_truth_where_the_judge_only_one_does_not(reading: str) -> None:
    runs = [simulate(seed, reading) for seed in range(100)]
    corrected_hits = sum(covers(r.corrected.lower, r.corrected.upper, r.truth) for r in runs)
    judge_hits = sum(covers(r.judge.lower, r.judge.upper, r.truth) for r in runs)
    assert corrected_hits >= 93, corrected_hits
    assert judge_hits <= 5, judge_hits
    for r in runs:
        c = r.corrected
        assert c.method == "two_phase" and c.n_human >= 100
        assert c.estimate is not None and c.judge_estimate == r.judge.estimate
        # the judge is biased upwards; the correction goes down by about that much
        assert c.mean_difference is not None and c.mean_difference < 0
        assert c.estimate == pytest.approx(c.judge_estimate + c.mean_difference)


def test_the_interval_is_as_wide_as_the_spread_of_its_estimates() -> None:
    """Its half-width matches 1.96 x the standard deviation of the estimate over seeds (a 20 % band):
    the two-phase variance is neither the independent-samples sum nor the phase-2 part alone."""
    runs = [simulate(seed, "answers", true_share=0.45) for seed in range(100, 300)]
    estimates = np.array([r.corrected.estimate for r in runs], dtype=float)
    mean_half = float(np.mean([(r.corrected.upper or 0) - (r.corrected.lower or 0) for r in runs])) / 2
    assert mean_half == pytest.approx(1.96 * float(estimates.std(ddof=1)), rel=0.2)


def test_with_every_judged_item_labelled_it_is_the_hajek_estimate_of_the_labels() -> None:
    rng = np.random.default_rng(3)
    pis = rng.choice([0.1, 0.5, 1.0], size=200)
    f = rng.random(200)
    y = np.clip(f + rng.normal(0, 0.2, 200), 0, 1)
    judged = [JudgedSample(float(p), "scored", float(s)) for p, s in zip(pis, f, strict=True)]
    labels = [LabelledSample(float(p), float(a), float(b)) for p, a, b in zip(pis, f, y, strict=True)]
    got = corrected(judged, labels)
    truth = hajek(JudgedSample(float(p), "scored", float(s)) for p, s in zip(pis, y, strict=True))
    assert got.labelled_share == 1.0 and got.variance_labelled == 0.0
    assert got.estimate == pytest.approx(truth.estimate)
    assert truth.method == "linearization" and truth.lower is not None and truth.upper is not None
    # the same variance as the Hájek linearization's (the interval then uses t, not z)
    z = float(norm.ppf(0.975))
    assert got.variance_judged == pytest.approx(((truth.upper - truth.lower) / (2 * z)) ** 2)


def test_too_few_labels_give_no_estimate_and_say_why() -> None:
    judged = [JudgedSample(0.5, "scored", 1.0)] * 100
    labels = [LabelledSample(0.5, 1.0, 0.0)] * 29
    got = corrected(judged, labels)
    assert (got.estimate, got.lower, got.upper, got.method) == (None, None, None, "none")
    assert got.n_human == 29 and got.reason == "29 blind labels, fewer than the 30 needed"
    assert corrected(judged, labels, min_labels=29).estimate == 0.0
    none_scored = corrected([JudgedSample(0.5, "no_claims")], [])
    assert none_scored.reason == "no scored judgments in the window" and none_scored.n_judged == 0


def test_labels_that_agree_with_the_judge_everywhere_fall_back_to_wilson() -> None:
    judged = [JudgedSample(0.5, "scored", 1.0)] * 60
    labels = [LabelledSample(0.5, 1.0, 1.0)] * 30
    got = corrected(judged, labels)
    assert got.method == "wilson_kish" and got.estimate == 1.0
    assert got.lower is not None and 0.85 < got.lower < 1.0 and got.upper == 1.0


def test_the_estimate_stays_in_the_unit_interval() -> None:
    judged = [JudgedSample(1.0, "scored", 0.05)] * 40 + [JudgedSample(1.0, "scored", 0.0)] * 60
    labels = [LabelledSample(1.0, 0.0, 0.0)] * 30  # labels of the 0.0 items only: ē = 0, θ = 0.02
    assert corrected(judged, labels).estimate == pytest.approx(0.02)
    low_judged = [JudgedSample(1.0, "scored", 0.0)] * 100
    negative = [LabelledSample(1.0, 0.0, 0.0)] * 30
    got = corrected(low_judged, negative)
    assert got.estimate == 0.0 and got.lower == 0.0


def test_budget_skips_adjust_the_labels_weights_as_they_adjust_the_judged() -> None:
    # stratum a: half refused by the budget, so its admitted items stand for twice as many
    judged = [JudgedSample(0.5, "scored", 1.0, stratum="a")] * 40 + [
        JudgedSample(0.5, "skipped", stratum="a")
    ] * 40
    judged += [JudgedSample(0.5, "scored", 1.0, stratum="b")] * 80
    labels = [LabelledSample(0.5, 1.0, 0.0, stratum="a")] * 20 + [
        LabelledSample(0.5, 1.0, 1.0, stratum="b")
    ] * 20
    got = corrected(judged, labels, min_labels=2)
    # a's labels weigh 1/(0.5 x 0.5) = 4, b's 2: the human share is (20 x 0 x 4 + 20 x 2) / 120 = 1/3
    assert got.estimate == pytest.approx(1 / 3)


def test_per_group_estimates_and_groups_without_labels() -> None:
    judged = [JudgedSample(1.0, "scored", 1.0, app="shop", release="1")] * 50
    judged += [JudgedSample(1.0, "scored", 0.5, app="docs", release="2")] * 50
    labels = [LabelledSample(1.0, 1.0, 0.0, app="shop", release="1")] * 30
    by_app = corrected_by(cells_of(judged), labels, "app")
    assert set(by_app) == {("shop",), ("docs",)}
    assert by_app[("shop",)].estimate is not None and by_app[("docs",)].estimate is None
    assert by_app[("docs",)].n_human == 0
    by_release = corrected_by(cells_of(judged), labels, "app_release")
    assert by_release[("shop", "1")].n_human == 30
    assert corrected_by(cells_of(judged), labels, "app_intent") == {}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"human_score": math.nan},
        {"human_score": 1.5},
        {"judge_score": -0.1},
        {"judge_score": math.inf},
        {"inclusion_probability": 0.0},
        {"inclusion_probability": math.nan},
    ],
)
def test_nan_and_out_of_range_labels_are_refused(kwargs: dict[str, float]) -> None:
    fields = {"inclusion_probability": 0.5, "judge_score": 0.5, "human_score": 0.5} | kwargs
    with pytest.raises(ValueError, match="must be"):
        LabelledSample(**fields)


def test_labels_outside_the_judged_sample_are_refused() -> None:
    judged = [JudgedSample(0.5, "scored", 1.0, app="shop")] * 5
    with pytest.raises(ValueError, match="subsample"):
        corrected(judged, [LabelledSample(0.5, 1.0, 1.0)] * 6)
    with pytest.raises(ValueError, match="design cells"):
        corrected(judged, [LabelledSample(0.2, 1.0, 1.0)])
    with pytest.raises(ValueError, match="groups with no judged item"):
        corrected_by(cells_of(judged), [LabelledSample(0.5, 1.0, 1.0, app="docs")], "app")


def test_a_plan_reaches_the_width_it_promises() -> None:
    """Plan from one simulated window, then simulate with the planned blind rate: the half-width is
    near the target."""
    first = simulate(11, "answers", true_share=0.45)
    plan = plan_labels(first.corrected, first.judge, half_width=0.05, window_s=86400.0)
    assert plan.reason is None and plan.labels_per_window is not None and plan.blind_rate is not None
    assert not plan.assumed and plan.from_labels == first.corrected.n_human
    assert plan.labels_per_week == pytest.approx(7 * plan.labels_per_window)
    assert plan.current_half_width is not None and plan.current_half_width > 0.05
    global BLIND_RATE
    saved = BLIND_RATE
    try:
        BLIND_RATE = plan.blind_rate
        halves = [
            ((r.corrected.upper or 0) - (r.corrected.lower or 0)) / 2
            for r in (simulate(seed, "answers", true_share=0.45) for seed in range(20, 40))
        ]
    finally:
        BLIND_RATE = saved
    assert float(np.mean(halves)) == pytest.approx(0.05, rel=0.15)


def test_a_plan_without_labels_assumes_a_residual_variance_and_says_so() -> None:
    judged = [JudgedSample(0.1, "scored", float(i % 2)) for i in range(2000)]
    est = corrected(judged, [])
    plan = plan_labels(est, hajek(judged), half_width=0.05, window_s=7 * 86400.0)
    assert plan.assumed and plan.residual_variance == ASSUMED_RESIDUAL_VARIANCE
    assert plan.labels_per_window is not None and 350 < plan.labels_per_window < 420
    assert plan.labels_per_week == plan.labels_per_window
    tiny = plan_labels(est, hajek(judged[:40]), half_width=0.01, window_s=86400.0)
    assert tiny.labels_per_window is None and tiny.reason is not None
    with pytest.raises(ValueError):
        plan_labels(est, hajek(judged), half_width=0.0, window_s=86400.0)
