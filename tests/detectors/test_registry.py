from __future__ import annotations

import pytest

import detectors
from detectors.mmd import MmdDrift
from detectors.registry import DETECTORS, build, embedding_detector
from detectors.rff import RffMmdDrift


def test_registry_names_are_the_detectors_own_names() -> None:
    for name, spec in DETECTORS.items():
        assert spec.name == name
        assert type(build(name)).name == name
    assert len(DETECTORS) == 9


def test_unknown_detector_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="query_embedding_mmd"):
        build("nope")


def test_embedding_detector_switches_to_linear_time_for_large_windows() -> None:
    assert isinstance(embedding_detector(2000), MmdDrift)
    assert isinstance(embedding_detector(10_000), RffMmdDrift)


def test_package_exports_exactly_its_public_names() -> None:
    for name in detectors.__all__:
        assert hasattr(detectors, name), name
    assert sorted(detectors.__all__) == sorted(set(detectors.__all__))
