from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from pydantic import ValidationError

from detectors.base import DriftResult, Reference, Window, content_hash

T = datetime(2024, 1, 1, tzinfo=UTC)


def test_reference_hash_depends_on_content_only() -> None:
    values = np.arange(12.0).reshape(4, 3)
    first = Reference("a", values, T, T)
    second = Reference("b", values.copy(), T, T + timedelta(days=1))
    assert first.content_hash == second.content_hash
    assert Reference("c", values + 1, T, T).content_hash != first.content_hash
    assert content_hash(["x", "y"]) == content_hash(np.array(["x", "y"], dtype=object))
    assert first.n == 4


def test_samples_are_frozen_copies() -> None:
    values = np.zeros((3, 2))
    window = Window(values, T, T)
    values[0, 0] = 5.0
    assert window.values[0, 0] == 0.0
    with pytest.raises(ValueError):
        window.values[0, 0] = 1.0


def test_time_ranges_and_ids_are_checked() -> None:
    with pytest.raises(ValueError):
        Window(np.zeros(3), T, T - timedelta(seconds=1))
    with pytest.raises(ValueError):
        Reference("", np.zeros(3), T, T)


def test_drift_result_rejects_impossible_values() -> None:
    fields = dict(
        detector="d",
        version="1",
        reference_id="r",
        window_start=T,
        window_end=T,
        n_reference=1,
        n_window=1,
        statistic=0.1,
        drifted=False,
    )
    assert DriftResult(**fields, p_value=0.5, alpha=0.05).p_value == 0.5
    with pytest.raises(ValidationError):
        DriftResult(**fields, p_value=1.5, alpha=0.05)
    with pytest.raises(ValidationError):
        DriftResult(**fields, p_value=0.5, alpha=0.0)
    with pytest.raises(ValidationError):
        DriftResult(**{**fields, "n_window": -1})
