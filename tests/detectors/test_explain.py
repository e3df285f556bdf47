from __future__ import annotations

import numpy as np
import pytest

from detectors.explain import explain_query_drift


def _planted(seed: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((6, 16)) * 4
    reference = centres[rng.integers(0, 5, 600)] + rng.standard_normal((600, 16))
    old = centres[rng.integers(0, 5, 540)] + rng.standard_normal((540, 16))
    new = centres[5] + rng.standard_normal((60, 16))
    texts = [f"old query {i}" for i in range(540)] + [f"crypto wallet question {i}" for i in range(60)]
    return reference, np.concatenate([old, new]), texts


def test_planted_new_topic_is_the_top_group() -> None:
    found = 0
    for seed in range(10):
        reference, window, texts = _planted(seed)
        groups = explain_query_drift(reference, window, texts, groups=8, seed=seed)
        top = groups[0]
        found += (
            top.significant
            and all(example.startswith("crypto") for example in top.examples)
            and "crypto" in top.terms
            and top.share_reference < 0.02 < 0.08 < top.share_window
        )
    assert found >= 9


def test_groups_are_sorted_by_significance_and_only_growing() -> None:
    reference, window, texts = _planted(0)
    groups = explain_query_drift(reference, window, texts, groups=8)
    p_values = [group.p_value for group in groups]
    assert p_values == sorted(p_values)
    assert all(group.share_change > 0 for group in groups)
    assert groups[0].to_json()["examples"] == list(groups[0].examples)


def test_no_shift_rarely_reports_a_significant_group() -> None:
    significant = 0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        centres = rng.standard_normal((5, 16)) * 4
        reference = centres[rng.integers(0, 5, 500)] + rng.standard_normal((500, 16))
        window = centres[rng.integers(0, 5, 500)] + rng.standard_normal((500, 16))
        groups = explain_query_drift(reference, window, [str(i) for i in range(500)], groups=10, seed=seed)
        significant += any(group.significant for group in groups)
    # Holm keeps the family-wise error per run at 0.05; allow sampling error over 20 runs.
    assert significant <= 4


def test_rejects_mismatched_inputs() -> None:
    with pytest.raises(ValueError):
        explain_query_drift(np.zeros((5, 3)), np.zeros((5, 4)), ["a"] * 5)
    with pytest.raises(ValueError):
        explain_query_drift(np.zeros((5, 3)), np.zeros((5, 3)), ["a"] * 4)
    assert explain_query_drift(np.zeros((0, 3)), np.zeros((0, 3)), []) == []
