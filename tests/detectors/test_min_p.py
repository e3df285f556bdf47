"""Combining permutation tests by min-p (`detectors.min_p`): exact under no drift, one test unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from detectors.min_p import min_p_combination


def test_one_statistic_gives_its_own_permutation_p_value() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        column = rng.integers(0, 6, 201).astype(float)  # many ties, as a link count has
        own = (1 + np.count_nonzero(column[1:] >= column[0])) / 201
        combined = min_p_combination(column[:, None])
        assert combined.p_value == pytest.approx(own)
        assert combined.p_values == (pytest.approx(own),)


def test_the_combination_keeps_alpha_where_either_p_value_below_alpha_does_not() -> None:
    # Exchangeable rows (no drift): two correlated statistics on the same 201 labellings.
    rng = np.random.default_rng(1)
    combined = either = 0
    trials = 2000
    for _ in range(trials):
        first = rng.standard_normal(201)
        second = 0.3 * first + rng.standard_normal(201)
        result = min_p_combination(np.column_stack([first, second]))
        combined += result.p_value <= 0.05
        either += min(result.p_values) <= 0.05
    # Exact size 10/201 = 0.0498: 99.5 expected in 2,000; P(X > 130) < 0.002. Either-below-alpha is about
    # twice that (~190 expected).
    assert combined <= 130
    assert either >= 160


def test_a_shift_in_one_statistic_is_caught() -> None:
    rng = np.random.default_rng(2)
    noise, signal = rng.standard_normal(201), rng.standard_normal(201)
    signal[0] = 10.0
    result = min_p_combination(np.column_stack([noise, signal]))
    assert result.p_values[1] == pytest.approx(1 / 201)
    assert result.p_value <= 2 / 201


def test_rejects_arrays_that_are_not_permutation_tables() -> None:
    with pytest.raises(ValueError):
        min_p_combination(np.zeros(5))
    with pytest.raises(ValueError):
        min_p_combination(np.zeros((1, 2)))
    with pytest.raises(ValueError):
        min_p_combination(np.array([[0.0], [np.nan]]))
