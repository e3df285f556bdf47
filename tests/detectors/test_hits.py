from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest
from scipy import stats

from detectors.base import Reference, Window
from detectors.hits import HitDistributionDrift

T = datetime(2024, 1, 1, tzinfo=UTC)


def _docs(rng: np.random.Generator, n: int, categories: int, p: np.ndarray | None = None) -> np.ndarray:
    return np.array([f"d{k}" for k in rng.choice(categories, size=n, p=p)])


def _score(detector: HitDistributionDrift, reference: np.ndarray, window: np.ndarray):  # type: ignore[no-untyped-def]
    return detector.fit(Reference("r", reference, T, T)).score(Window(window, T, T))


def test_long_tail_small_counts_keep_the_false_alarm_rate() -> None:
    # 80 documents, 60 traces a side: most expected counts are far below 5.
    seeds, alarms = 200, 0
    weights = 1.0 / np.arange(1, 81)
    weights /= weights.sum()
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        result = _score(
            HitDistributionDrift(seed=seed, permutations=199),
            _docs(rng, 60, 80, weights),
            _docs(rng, 60, 80, weights),
        )
        alarms += result.drifted
    assert alarms <= stats.binom.ppf(0.999, seeds, 0.05)


def test_rare_categories_are_pooled_and_large_counts_use_chi_square() -> None:
    rng = np.random.default_rng(0)
    p = np.array([0.3, 0.3, 0.3] + [0.1 / 50] * 50)
    result = _score(HitDistributionDrift(), _docs(rng, 1000, 53, p), _docs(rng, 1000, 53, p))
    assert result.details["method"] == "chi2"
    assert result.details["pooled_categories"] >= 45
    assert result.details["columns_after_pooling"] <= 14


def test_too_few_counts_fall_back_to_permutation() -> None:
    rng = np.random.default_rng(1)
    result = _score(HitDistributionDrift(), _docs(rng, 15, 20), _docs(rng, 15, 20))
    assert result.details["method"] == "permutation"
    assert 0.0 < result.p_value <= 1.0  # type: ignore[operator]


def test_permutation_agrees_with_chi_square_when_counts_are_large() -> None:
    rng = np.random.default_rng(2)
    p_ref = np.array([0.4, 0.3, 0.2, 0.1])
    p_now = np.array([0.36, 0.3, 0.22, 0.12])
    reference, window = _docs(rng, 1500, 4, p_ref), _docs(rng, 1500, 4, p_now)
    asymptotic = _score(HitDistributionDrift(method="chi2"), reference, window)
    permuted = _score(HitDistributionDrift(method="permutation", permutations=1999), reference, window)
    assert asymptotic.statistic == pytest.approx(permuted.statistic)
    assert abs(asymptotic.p_value - permuted.p_value) < 0.03  # type: ignore[operator]


def test_new_document_taking_traffic_is_caught_and_named() -> None:
    rng = np.random.default_rng(3)
    reference = _docs(rng, 500, 10)
    window = np.concatenate([_docs(rng, 400, 10), np.array(["new-doc"] * 100)])
    result = _score(HitDistributionDrift(), reference, window)
    assert result.drifted
    assert result.details["new_categories"] == 1
    assert result.details["largest_changes"][0]["category"] == "new-doc"  # type: ignore[index]


def test_rejects_non_categories() -> None:
    with pytest.raises(ValueError):
        HitDistributionDrift().fit(Reference("r", np.arange(10.0), T, T))
    with pytest.raises(ValueError):
        HitDistributionDrift(method="exact")  # type: ignore[arg-type]
