from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from scipy import stats

from detectors.reservoir import Reservoir


def test_holds_at_most_capacity_whatever_the_traffic() -> None:
    reservoir: Reservoir[int] = Reservoir(capacity=100, seed=1)
    for i in range(200_000):
        reservoir.offer(i)
    assert len(reservoir) == 100
    assert reservoir.seen == 200_000
    assert sys.getsizeof(reservoir.items) < 2_000
    assert len(set(reservoir.items)) == 100


def test_short_stream_is_kept_whole() -> None:
    reservoir: Reservoir[str] = Reservoir(capacity=10)
    for word in ("a", "b", "c"):
        assert reservoir.offer(word)
    assert sorted(reservoir.items) == ["a", "b", "c"]


def test_every_item_is_equally_likely_to_be_kept() -> None:
    stream, capacity, seeds = 40, 8, 1500
    kept = np.zeros(stream)
    for seed in range(seeds):
        reservoir: Reservoir[int] = Reservoir(capacity, seed=seed)
        for i in range(stream):
            reservoir.offer(i)
        kept[reservoir.items] += 1
    # Inclusion counts should look like equal shares of capacity × seeds draws.
    chi2 = stats.chisquare(kept)
    assert chi2.pvalue > 0.001
    assert kept[:capacity].mean() == pytest.approx(kept[capacity:].mean(), rel=0.05)


def test_state_resumes_the_same_random_sequence() -> None:
    whole: Reservoir[int] = Reservoir(capacity=20, seed=5)
    split: Reservoir[int] = Reservoir(capacity=20, seed=5)
    for i in range(5_000):
        whole.offer(i)
        split.offer(i)
    resumed = Reservoir[int].from_state(split.to_state())
    for i in range(5_000, 20_000):
        whole.offer(i)
        resumed.offer(i)
    assert whole.items == resumed.items
    assert whole.seen == resumed.seen


def test_tracks_time_range_and_validates_capacity() -> None:
    reservoir: Reservoir[int] = Reservoir(capacity=2)
    start = datetime(2024, 1, 1, tzinfo=UTC)
    for minute in (3, 1, 7):
        reservoir.offer(minute, at=start + timedelta(minutes=minute))
    assert reservoir.start == start + timedelta(minutes=1)
    assert reservoir.end == start + timedelta(minutes=7)
    reservoir.clear()
    assert len(reservoir) == 0 and reservoir.start is None
    with pytest.raises(ValueError):
        Reservoir(capacity=0)
