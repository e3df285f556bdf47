from __future__ import annotations

import numpy as np
import pytest

from detectors.explain import explain_query_drift, explain_query_text_drift
from detectors.tfidf import TfidfEmbedder


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


def test_the_explanation_does_not_depend_on_the_order_traces_arrived_in() -> None:
    # Exporters flush batches in any order, so the same window must give the same groups however its rows
    # are ordered; before the canonical order, 3 in 200 orderings of a demo window lost the new topic.
    reference, window, texts = _planted(3)
    rng = np.random.default_rng(1)
    expected = explain_query_drift(reference, window, texts, groups=8)
    for _ in range(5):
        ref_order, win_order = rng.permutation(len(reference)), rng.permutation(len(window))
        shuffled = explain_query_drift(
            reference[ref_order], window[win_order], [texts[i] for i in win_order], groups=8
        )
        assert [(g.n_window, g.n_reference, g.p_value) for g in shuffled] == [
            (g.n_window, g.n_reference, g.p_value) for g in expected
        ]
        assert [set(g.examples) for g in shuffled] == [set(g.examples) for g in expected]


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
    with pytest.raises(ValueError):
        explain_query_drift(np.zeros((5, 3)), np.zeros((5, 3)), ["a"] * 5, restarts=0)
    assert explain_query_drift(np.zeros((0, 3)), np.zeros((0, 3)), []) == []


TRAVEL = {"visa", "passport", "flight", "hotel", "luggage", "embassy"}


def _texts(seed: int) -> tuple[list[str], list[str]]:
    """Bank queries in the reference; the window adds 10 % travel queries the reference never had."""
    rng = np.random.default_rng(seed)
    old = [
        ["card", "declined", "blocked", "pin", "contactless", "expired"],
        ["transfer", "iban", "beneficiary", "pending", "sepa", "wire"],
        ["password", "login", "email", "profile", "address", "verify"],
    ]
    new = sorted(TRAVEL)

    def query(words: list[str]) -> str:
        return "how do i " + " ".join(rng.choice(words, 3, replace=False)) + f" {int(rng.integers(50))}"

    reference = [query(old[int(rng.integers(3))]) for _ in range(900)]
    window = [query(new if i % 10 == 0 else old[int(rng.integers(3))]) for i in range(600)]
    return reference, window


def _embedder(reference: list[str]) -> TfidfEmbedder:
    return TfidfEmbedder().fit(reference[:180])


def test_in_the_text_space_the_new_topic_is_the_top_group_and_only_it() -> None:
    found = 0
    for seed in range(5):
        reference, window = _texts(seed)
        groups = explain_query_text_drift(_embedder(reference), reference, window, groups=8, seed=seed)
        top = groups[0]
        travel_in_top = sum(i % 10 == 0 for i in top.members)
        travel_in_significant = sum(i % 10 == 0 for g in groups if g.significant for i in g.members)
        found += (
            top.significant
            and travel_in_top >= 0.9 * len(top.members)  # the top group is the new topic
            and travel_in_significant >= 54  # and the significant groups hold >= 90 % of its 60 queries
            and all(example.split()[3] in TRAVEL for example in top.examples)
        )
    assert found >= 4


def test_text_space_groups_do_not_depend_on_the_order_traces_arrived_in() -> None:
    reference, window = _texts(7)
    embedder = _embedder(reference)
    expected = explain_query_text_drift(embedder, reference, window, groups=8)
    rng = np.random.default_rng(2)
    for _ in range(3):
        ref_order, win_order = rng.permutation(len(reference)), rng.permutation(len(window))
        shuffled = explain_query_text_drift(
            embedder, [reference[i] for i in ref_order], [window[i] for i in win_order], groups=8
        )
        assert [(g.n_window, g.n_reference, g.p_value, g.terms) for g in shuffled] == [
            (g.n_window, g.n_reference, g.p_value, g.terms) for g in expected
        ]
        assert [set(g.examples) for g in shuffled] == [set(g.examples) for g in expected]
        assert [{int(win_order[i]) for i in g.members} for g in shuffled] == [
            set(g.members) for g in expected
        ]
