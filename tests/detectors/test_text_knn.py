"""The fitted query embedder (`TfidfEmbedder`), the query-text test (`TextKnnDrift`) and the power curve."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest
import scipy.sparse as sp

from detectors import Reference, TextKnnDrift, TfidfEmbedder, Window, estimated_power
from detectors.power import POWER_CURVES
from detectors.text_knn import knn_graph

T = datetime(2024, 1, 1, tzinfo=UTC)
TOPICS = {
    "cards": ["card", "declined", "blocked", "pin", "contactless", "expired"],
    "transfers": ["transfer", "iban", "beneficiary", "pending", "sepa", "wire"],
    "account": ["password", "login", "email", "profile", "address", "verify"],
}
NEW = ["visa", "passport", "flight", "hotel", "luggage", "embassy"]
LETTERS = list("abcdefghijklmnopqrstuvwxyz")


def _queries(rng: np.random.Generator, n: int, new_share: float = 0.0) -> np.ndarray:
    out = []
    for _ in range(n):
        words = NEW if rng.random() < new_share else TOPICS[str(rng.choice(sorted(TOPICS)))]
        out.append("how do i " + " ".join(rng.choice(words, 3, replace=False)) + f" {int(rng.integers(50))}")
    return np.array(out)


def _diverse(rng: np.random.Generator, n: int) -> np.ndarray:
    """Queries unlike the reference and unlike each other (made-up words): out-of-scope traffic."""
    words = ["".join(rng.choice(LETTERS, 6)) for _ in range(3 * n)]
    return np.array(
        [f"how do i {' '.join(words[3 * i : 3 * i + 3])} {int(rng.integers(50))}" for i in range(n)]
    )


def test_embedder_is_deterministic_and_round_trips_through_its_state() -> None:
    texts = list(_queries(np.random.default_rng(0), 300))
    first = TfidfEmbedder().fit(texts)
    second = TfidfEmbedder().fit(texts)
    assert first.model_name == second.model_name
    probe = ["my card was declined abroad", "where is my passport", ""]
    assert (first.transform(probe) != second.transform(probe)).nnz == 0
    restored = TfidfEmbedder.from_state(first.to_state())
    assert restored.model_name == first.model_name
    assert (restored.transform(probe) != first.transform(probe)).nnz == 0
    rows = first.transform(probe)
    norms = np.sqrt(np.asarray(rows.multiply(rows).sum(axis=1)).ravel())
    assert np.allclose(norms, [1.0, 1.0, 0.0])
    # Another fit gives another name: the reference's key says which embedder it carries.
    other = TfidfEmbedder().fit(texts[:150])
    assert other.model_name != first.model_name and "-f150-" in other.model_name


def test_words_unseen_while_fitting_weigh_most() -> None:
    embedder = TfidfEmbedder().fit(["card declined"] * 50 + ["card blocked"] * 50)
    row = embedder.transform(["card passport"]).toarray()[0]
    slot = embedder._slot  # the slots of two words, to compare their weights
    assert row[slot("w:passport")] > 2 * row[slot("w:card")]


def test_embedder_state_of_another_version_or_out_of_range_is_refused() -> None:
    state = TfidfEmbedder().fit(["a b c", "d e f"]).to_state()
    with pytest.raises(ValueError, match="version"):
        TfidfEmbedder.from_state({**state, "version": "0"})
    with pytest.raises(ValueError, match="document frequency"):
        TfidfEmbedder.from_state({**state, "df": np.full_like(state["df"], 9)})


def test_knn_graph_links_each_row_to_its_nearest_rows_only() -> None:
    rows = sp.csr_matrix(np.array([[1, 0, 0], [0.9, 0.1, 0], [0, 1, 0], [0, 0.9, 0.1]], dtype=np.float32))
    rows = sp.csr_matrix(rows.multiply(1 / np.sqrt(rows.multiply(rows).sum(axis=1))))
    graph = knn_graph(rows, 1).toarray()
    assert np.array_equal(graph > 0, np.array([[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]]) > 0)


def test_the_embedder_fits_on_rows_the_test_never_compares() -> None:
    detector = TextKnnDrift(seed=4).fit(Reference("r", _queries(np.random.default_rng(1), 500), T, T))
    fit_rows = detector.fit_rows
    assert fit_rows is not None and fit_rows.size == 100
    result = detector.score(Window(_queries(np.random.default_rng(2), 300), T, T))
    assert result.details["n_fit"] == 100
    assert result.details["n_reference_used"] == 400
    assert result.details["embedder"] == detector.embedder.model_name  # type: ignore[union-attr]


def test_new_topic_at_ten_percent_is_caught_and_no_shift_stays_near_alpha() -> None:
    caught = alarms = 0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        detector = TextKnnDrift(seed=seed).fit(Reference("r", _queries(rng, 600), T, T))
        caught += detector.score(Window(_queries(rng, 400, new_share=0.1), T, T)).drifted
        alarms += detector.score(Window(_queries(rng, 400), T, T)).drifted
    assert caught >= 19
    assert alarms <= 4  # Binomial(20, 0.05): P(X > 4) < 0.003


def test_power_estimate_follows_the_curve_and_says_what_it_is() -> None:
    curve = POWER_CURVES["query_text_knn"]
    sizes = [n for n, _, _ in curve.points]
    estimates = [estimated_power("query_text_knn", n) for n in (10, *sizes, 3 * sizes[-1])]
    assert all(e is not None for e in estimates)
    powers = [e.power for e in estimates if e is not None]
    assert powers == sorted(powers) and all(0.0 <= p <= 1.0 for p in powers)
    low, high = estimates[0], estimates[-1]
    assert low is not None and low.bound == "at_most"
    assert high is not None and high.bound == "at_least"
    middle = estimated_power("query_text_knn", (sizes[0] + sizes[1]) // 2)
    assert middle is not None and powers[1] <= middle.power <= powers[2]
    assert "estimated" in middle.describe() and middle.to_json()["shift"] == curve.shift
    assert estimated_power("retrieval_top1_score", 2000) is None
    assert estimated_power("query_text_knn", 2000, alpha=0.01) is None


def test_diverse_unseen_queries_are_caught_by_the_novelty_statistic() -> None:
    # 10 % out-of-scope queries: each far from the reference, but no cluster, so they mix with both sides in
    # the neighbour graph. Before the novelty statistic the test's p-value was the k-NN one: 0 of 10 caught.
    caught = knn_caught = 0
    for seed in range(10):
        rng = np.random.default_rng(seed)
        detector = TextKnnDrift(seed=seed).fit(Reference("r", _queries(rng, 600), T, T))
        result = detector.score(Window(np.concatenate([_queries(rng, 360), _diverse(rng, 40)]), T, T))
        caught += result.drifted
        knn_caught += float(result.details["knn_p_value"]) <= 0.05  # type: ignore[arg-type]
        assert float(result.details["window_share_unlike_reference"]) > 0.1  # type: ignore[arg-type]
    assert caught == 10
    assert knn_caught <= 2


def test_the_k_nn_part_alone_is_the_earlier_test_and_both_parts_are_reported() -> None:
    rng = np.random.default_rng(3)
    detector = TextKnnDrift(seed=3).fit(Reference("r", _queries(rng, 600), T, T))
    result_window = _queries(rng, 400, new_share=0.1)
    result = detector.score(Window(result_window, T, T))
    details = result.details
    assert details["statistic_name"] == "min_p_neg_log10"
    assert float(details["knn_p_value"]) == pytest.approx(1 / 201)  # type: ignore[arg-type]
    assert 0.0 < float(details["novelty_p_value"]) <= 1.0  # type: ignore[arg-type]
    # min-p: never below the smaller part's p-value, at most that times the number of parts plus one draw.
    smaller = min(float(details["knn_p_value"]), float(details["novelty_p_value"]))  # type: ignore[arg-type]
    assert smaller <= float(result.p_value or 0.0) <= 2 * smaller + 1 / 201
    assert result.statistic == pytest.approx(-np.log10(smaller))
    restored = TextKnnDrift.from_state(detector.to_state()).score(Window(result_window, T, T))
    assert restored.p_value == result.p_value and restored.details == details
