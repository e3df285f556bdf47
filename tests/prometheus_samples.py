"""What the metric tests compare: a registry's samples, and two registries holding the same values."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of `registry` by (name, sorted labels), creation timestamps left out."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


def assert_same(batched: CollectorRegistry, one_by_one: CollectorRegistry) -> None:
    """The same series with the same values (NaN equal to NaN)."""
    got, want = samples(batched), samples(one_by_one)
    assert got.keys() == want.keys()
    for key, value in want.items():
        if math.isnan(value):
            assert math.isnan(got[key]), key
        else:  # a sum added in another order may differ in its last bits
            assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key
