"""The conformance suite every registered detector must pass (STYLE.md §3).

Synthetic data keeps it fast: small Gaussian embeddings, normal scores,
Bernoulli flags, Zipf-like categories. Rates are checked over many seeds
against binomial bounds, never as exact snapshots.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from scipy import stats

from detectors.base import BatchDetector, DriftResult, Reference, StreamingMonitor, Window
from detectors.registry import DETECTORS, DetectorSpec, build

T0 = datetime(2024, 6, 1, tzinfo=UTC)
T1 = T0 + timedelta(days=7)
T2 = T1 + timedelta(hours=1)
SEEDS = 200
N = 120

Sample = Any
Generator = Callable[[np.random.Generator, int, bool], Sample]

CATEGORY_P = np.array([1.0 / (k + 1) for k in range(30)])
CATEGORY_P /= CATEGORY_P.sum()
SHIFTED_P = CATEGORY_P[::-1].copy()


def _embedding(rng: np.random.Generator, n: int, shifted: bool) -> Sample:
    points = rng.standard_normal((n, 8))
    if shifted:
        points[:, 0] += 1.0
    return points


TOPICS = [[f"t{topic}w{word}" for word in range(8)] for topic in range(13)]
COMMON = ["how", "do", "i", "my", "the", "please", "can", "you"]


def _text(rng: np.random.Generator, n: int, shifted: bool) -> Sample:
    # Twelve topics in the reference; a shifted window draws 40 % of its queries from a thirteenth.
    topics = rng.integers(0, 12, n)
    if shifted:
        topics[rng.random(n) < 0.4] = 12
    return np.array(
        [" ".join([*rng.choice(COMMON, 2), *rng.choice(TOPICS[topic], 3, replace=False)]) for topic in topics]
    )


def _score(rng: np.random.Generator, n: int, shifted: bool) -> Sample:
    return rng.normal(0.6 if shifted else 0.0, 1.0, n)


def _flag(rng: np.random.Generator, n: int, shifted: bool) -> Sample:
    return rng.random(n) < (0.35 if shifted else 0.1)


def _category(rng: np.random.Generator, n: int, shifted: bool) -> Sample:
    return np.array([f"doc-{k}" for k in rng.choice(30, size=n, p=SHIFTED_P if shifted else CATEGORY_P)])


def _model_key(rng: np.random.Generator, n: int, shifted: bool) -> Sample:
    keys = np.where(rng.random(n) < 0.5, "text-embedding-3-small@1536", "unknown@384")
    if shifted:
        keys[: n // 4] = "text-embedding-3-large@3072"
    return keys


def _regeneration(rng: np.random.Generator, n: int, shifted: bool) -> Sample:
    return rng.random(n) < (0.25 if shifted else 0.05)


GENERATORS: dict[str, Generator] = {
    "embedding": _embedding,
    "text": _text,
    "score": _score,
    "flag": _flag,
    "category": _category,
    "model_key": _model_key,
    "regeneration": _regeneration,
}

SPECS = sorted(DETECTORS.values(), key=lambda spec: spec.name)


def _params(spec: DetectorSpec, seed: int) -> dict[str, Any]:
    params: dict[str, Any] = {}
    factory_params = spec.factory.__init__.__code__.co_varnames  # type: ignore[misc]
    if "seed" in factory_params:
        params["seed"] = seed
    if "alpha" in factory_params:
        params["alpha"] = 0.05
    return params


def _run(spec: DetectorSpec, seed: int, shifted: bool, detector: Any = None) -> tuple[DriftResult, Any]:
    """Fit (or warm up) one detector on seeded reference data and score one seeded window."""
    rng = np.random.default_rng(seed)
    generate = GENERATORS[spec.input]
    reference = generate(rng, N, False)
    window = generate(rng, N, shifted)
    if spec.kind == "batch":
        if detector is None:
            detector = build(spec.name, **_params(spec, seed))
            detector.fit(Reference(f"ref-{seed}", reference, T0, T1))
        return detector.score(Window(window, T1, T2)), detector
    if detector is None:
        detector = build(spec.name, **_params(spec, seed))
        # A baseline of many windows, so its own sampling error is small against one window's.
        for _ in range(20):
            for value in generate(rng, N, False):
                detector.update(bool(value))
            detector.close_window()
    for value in window:
        detector.update(bool(value), at=T1)
    return detector.result(), detector


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.name)
def test_detector_satisfies_its_protocol(spec: DetectorSpec) -> None:
    detector = build(spec.name)
    protocol = BatchDetector if spec.kind == "batch" else StreamingMonitor
    assert isinstance(detector, protocol)
    assert type(detector).name == spec.name
    assert type(detector).__doc__


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.name)
def test_result_fields_are_valid(spec: DetectorSpec) -> None:
    result, _ = _run(spec, seed=1, shifted=True)
    assert result.detector == spec.name
    assert result.version
    assert result.n_window == N
    if spec.kind == "batch":
        assert result.n_reference == N
        assert result.reference_id == "ref-1"
        assert (result.window_start, result.window_end) == (T1, T2)
    assert np.isfinite(result.statistic)
    if result.p_value is None:
        assert result.alpha is None
    else:
        assert result.alpha is not None
        assert 0.0 <= result.p_value <= 1.0
        assert result.drifted == (result.p_value <= result.alpha)
    assert DriftResult.model_validate_json(result.model_dump_json()) == result


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.name)
def test_seeded_runs_are_deterministic(spec: DetectorSpec) -> None:
    first, _ = _run(spec, seed=7, shifted=False)
    second, _ = _run(spec, seed=7, shifted=False)
    assert first == second


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.name)
def test_state_round_trip_scores_identically(spec: DetectorSpec) -> None:
    result, detector = _run(spec, seed=3, shifted=True)
    restored = type(detector).from_state(detector.to_state())
    if spec.kind == "batch":
        rng = np.random.default_rng(99)
        window = Window(GENERATORS[spec.input](rng, N, True), T1, T2)
        assert restored.score(window) == detector.score(window)
        assert restored.reference.content_hash == detector.reference.content_hash
    else:
        assert restored.result() == result
        restored.update(True)
        detector.update(True)
        assert restored.result() == detector.result()


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.name)
def test_no_shift_alarm_rate_is_within_alpha(spec: DetectorSpec) -> None:
    alarms = sum(_run(spec, seed, shifted=False)[0].drifted for seed in range(SEEDS))
    # At most alpha = 0.05 up to sampling error: the 99.9 % binomial quantile of Binomial(SEEDS, 0.05).
    assert alarms <= stats.binom.ppf(0.999, SEEDS, 0.05)


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.name)
def test_planted_shift_is_caught(spec: DetectorSpec) -> None:
    caught = sum(_run(spec, seed, shifted=True)[0].drifted for seed in range(40))
    assert caught >= 36
