from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from detectors.base import Reference, Window
from detectors.mmd import MmdDrift
from detectors.rff import RffMmdDrift

T = datetime(2024, 1, 1, tzinfo=UTC)


def test_features_approximate_the_exact_kernel() -> None:
    rng = np.random.default_rng(0)
    points = rng.standard_normal((40, 6))
    detector = RffMmdDrift(features=20_000).fit(Reference("r", points, T, T))
    features = detector._featurize(points)
    approximate = features @ features.T
    bandwidth = detector.bandwidth
    assert bandwidth == MmdDrift().fit(Reference("r", points, T, T)).bandwidth
    squared = ((points[:, None, :] - points[None, :, :]) ** 2).sum(-1)
    exact = np.exp(-squared / (2 * bandwidth**2))  # type: ignore[operator]
    assert np.abs(approximate - exact).max() < 0.05


def test_five_percent_cluster_is_found_in_large_windows() -> None:
    caught = 0
    for seed in range(10):
        rng = np.random.default_rng(seed)
        reference = rng.standard_normal((3000, 16))
        window = rng.standard_normal((3000, 16))
        window[:150] = rng.standard_normal((150, 16)) * 0.3 + 1.5
        detector = RffMmdDrift(seed=seed).fit(Reference("r", reference, T, T))
        caught += detector.score(Window(window, T, T)).drifted
    assert caught >= 9


def test_random_features_are_fixed_at_fit_and_saved() -> None:
    rng = np.random.default_rng(1)
    reference = rng.standard_normal((100, 4))
    detector = RffMmdDrift(seed=3).fit(Reference("r", reference, T, T))
    state = detector.to_state()
    assert state["fitted"]["frequencies"].shape == (4, detector.features)
    window = Window(rng.standard_normal((90, 4)), T, T)
    assert RffMmdDrift.from_state(state).score(window) == detector.score(window)
    assert RffMmdDrift(seed=4).fit(Reference("r", reference, T, T)).score(window) != detector.score(window)


def test_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError):
        RffMmdDrift(features=0)
    with pytest.raises(ValueError):
        RffMmdDrift(alpha=1.0)
