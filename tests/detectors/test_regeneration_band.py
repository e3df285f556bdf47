from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from scipy import stats

from detectors.regeneration_band import RegenerationBand, binomial_band, binomial_p_value


def _feed(band: RegenerationBand, regenerations: int, traces: int) -> None:
    for i in range(traces):
        band.update(i < regenerations)


def _warm(band: RegenerationBand, windows: int = 10, n: int = 500, rate: float = 0.05) -> None:
    for _ in range(windows):
        _feed(band, round(rate * n), n)
        band.close_window()


def test_smaller_window_gives_wider_band() -> None:
    band = RegenerationBand(alpha=0.01)
    _warm(band)
    widths = [band.band(n)[1] - band.band(n)[0] for n in (20, 50, 200, 1000, 5000)]
    assert all(wide > narrow for wide, narrow in itertools.pairwise(widths))
    lower, upper = band.band(1000)
    assert lower < band.baseline_rate < upper


def test_band_is_exactly_the_counts_that_do_not_alarm() -> None:
    for n, rate in ((30, 0.02), (200, 0.1), (1000, 0.3)):
        lower, upper = binomial_band(n, rate, 0.05)
        for count in range(n + 1):
            assert (lower <= count <= upper) == (binomial_p_value(count, n, rate) > 0.05)


def test_p_value_matches_scipy_binomial_tails() -> None:
    for count, n, rate in ((0, 50, 0.1), (9, 50, 0.1), (30, 200, 0.2)):
        expected = min(1.0, 2 * min(stats.binom.cdf(count, n, rate), stats.binom.sf(count - 1, n, rate)))
        assert binomial_p_value(count, n, rate) == pytest.approx(expected, rel=1e-9)


def test_out_of_band_window_alarms_and_freezes_the_baseline() -> None:
    band = RegenerationBand(alpha=0.01)
    _warm(band)
    before = band.baseline_rate
    _feed(band, 150, 500)
    closing = band.close_window()
    assert closing.drifted
    assert closing.details["upper"] < 0.3
    assert band.baseline_rate == before
    assert band.result().details["baseline_frozen"] is True
    _feed(band, 25, 500)
    assert not band.close_window().drifted
    assert band.baseline_rate != before or band.result().details["baseline_frozen"] is False


def test_warming_up_never_alarms_and_learns() -> None:
    band = RegenerationBand(min_baseline=1000)
    _feed(band, 90, 100)
    result = band.close_window()
    assert result.details["warming_up"] is True
    assert not result.drifted
    assert band.baseline_rate > 0.5


def test_baseline_evicts_oldest_windows() -> None:
    band = RegenerationBand(baseline_windows=3, min_baseline=1)
    for rate in (0.5, 0.5, 0.5):
        _feed(band, round(rate * 100), 100)
        band.close_window()
    for _ in range(3):
        _feed(band, band.band(100)[1] - 1, 100)
        band.close_window()
    state = band.to_state()
    assert len(state["windows"]) == 3


def test_time_range_and_rejects_non_bool() -> None:
    band = RegenerationBand()
    start = datetime(2024, 1, 1, tzinfo=UTC)
    band.update(False, at=start + timedelta(minutes=5))
    band.update(True, at=start)
    result = band.result()
    assert (result.window_start, result.window_end) == (start, start + timedelta(minutes=5))
    with pytest.raises(TypeError):
        band.update(1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RegenerationBand(alpha=1.5)


def test_alarm_rate_for_small_windows_stays_within_alpha() -> None:
    # Small windows (n = 30) at a low rate: where a normal-approximation p-chart misbehaves.
    alarms = 0
    seeds = 200
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        band = RegenerationBand(alpha=0.05, baseline_windows=100, min_baseline=1000)
        for _ in range(20):
            for value in rng.random(100) < 0.04:
                band.update(bool(value))
            band.close_window()
        for value in rng.random(30) < 0.04:
            band.update(bool(value))
        alarms += band.result().drifted
    assert alarms <= stats.binom.ppf(0.999, seeds, 0.05)
