from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from detectors.base import Reference, Window
from detectors.mmd import MmdDrift

T = datetime(2024, 1, 1, tzinfo=UTC)


def _fit(detector: MmdDrift, reference: np.ndarray) -> MmdDrift:
    return detector.fit(Reference("r", reference, T, T))


def test_ten_percent_new_cluster_is_found_most_of_the_time() -> None:
    caught = 0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        reference = rng.standard_normal((300, 32))
        window = rng.standard_normal((300, 32))
        window[:30] = rng.standard_normal((30, 32)) * 0.3 + 2.0
        caught += _fit(MmdDrift(seed=seed), reference).score(Window(window, T, T)).drifted
    assert caught >= 17


def test_bandwidth_is_pinned_by_the_reference() -> None:
    rng = np.random.default_rng(0)
    detector = _fit(MmdDrift(), rng.standard_normal((200, 8)))
    pinned = detector.bandwidth
    far = rng.standard_normal((200, 8)) * 10
    result = detector.score(Window(far, T, T))
    assert detector.bandwidth == pinned
    assert result.details["bandwidth"] == pinned
    assert result.drifted
    # With the median heuristic, the median pairwise distance of 8-d standard normals is about 4.
    assert 3.0 < pinned < 5.0  # type: ignore[operator]


def test_p_value_is_a_permutation_p_value() -> None:
    rng = np.random.default_rng(1)
    detector = _fit(MmdDrift(permutations=99), rng.standard_normal((100, 4)))
    result = detector.score(Window(rng.standard_normal((80, 4)), T, T))
    assert result.p_value is not None
    assert result.p_value * 100 == pytest.approx(round(result.p_value * 100))
    assert result.p_value >= 1 / 100


def test_large_windows_are_subsampled_and_say_so() -> None:
    rng = np.random.default_rng(2)
    detector = _fit(MmdDrift(max_per_side=150), rng.standard_normal((400, 4)))
    result = detector.score(Window(rng.standard_normal((500, 4)), T, T))
    assert result.details["subsampled"] is True
    assert result.details["n_window_used"] == 150
    assert result.n_window == 500


def test_rejects_mismatched_or_bad_input() -> None:
    rng = np.random.default_rng(3)
    detector = _fit(MmdDrift(), rng.standard_normal((50, 4)))
    with pytest.raises(ValueError, match="dimension"):
        detector.score(Window(rng.standard_normal((50, 5)), T, T))
    bad = rng.standard_normal((50, 4))
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        detector.score(Window(bad, T, T))
    with pytest.raises(RuntimeError):
        MmdDrift().score(Window(bad, T, T))
    with pytest.raises(ValueError):
        MmdDrift(alpha=0.0)
    with pytest.raises(ValueError):
        MmdDrift(permutations=5)
