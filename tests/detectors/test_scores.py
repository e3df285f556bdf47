from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from detectors.base import Reference, Window
from detectors.scores import EmptyRetrievalDrift, ScoreDistributionDrift, TopScoreDrift

T = datetime(2024, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("test", ["ks", "cvm"])
def test_sagging_scores_are_caught(test: str) -> None:
    caught = 0
    for seed in range(30):
        rng = np.random.default_rng(seed)
        detector = ScoreDistributionDrift(test=test).fit(Reference("r", rng.beta(8, 3, 400), T, T))  # type: ignore[arg-type]
        caught += detector.score(Window(rng.beta(8, 3, 400) - 0.05, T, T)).drifted
    assert caught >= 25


def test_details_describe_the_shift() -> None:
    rng = np.random.default_rng(0)
    detector = TopScoreDrift().fit(Reference("r", rng.normal(0.8, 0.05, 300), T, T))
    result = detector.score(Window(rng.normal(0.7, 0.05, 300), T, T))
    assert result.detector == "retrieval_top1_score"
    assert result.details["mean_shift"] == pytest.approx(-0.1, abs=0.02)


def test_empty_share_uses_exact_test_at_small_counts() -> None:
    reference = np.zeros(200, dtype=bool)
    reference[:2] = True
    window = np.zeros(50, dtype=bool)
    window[:6] = True
    result = (
        EmptyRetrievalDrift(alternative="greater")
        .fit(Reference("r", reference, T, T))
        .score(Window(window, T, T))
    )
    assert result.drifted
    assert result.details["share_window"] == pytest.approx(0.12)
    calm = EmptyRetrievalDrift().fit(Reference("r", reference, T, T)).score(Window(window[6:], T, T))
    assert not calm.drifted


def test_rejects_bad_scores() -> None:
    with pytest.raises(ValueError, match="NaN"):
        ScoreDistributionDrift().fit(Reference("r", np.array([0.1] * 30 + [np.nan]), T, T))
    with pytest.raises(ValueError):
        ScoreDistributionDrift().fit(Reference("r", np.ones(5), T, T))
    with pytest.raises(ValueError):
        EmptyRetrievalDrift().fit(Reference("r", np.ones(5), T, T))
    with pytest.raises(ValueError):
        ScoreDistributionDrift(test="t")  # type: ignore[arg-type]
