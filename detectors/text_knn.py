"""Query-text drift: a nearest-neighbour two-sample test on TF-IDF vectors fitted on part of the reference.

What it tests: pool the reference and window queries, link each query to its
`neighbours` most similar queries (cosine of `TfidfEmbedder` rows), and count
the links that join two queries of the same side (Schilling 1986; Henze
1988). A new topic is a group of window queries that are each other's
nearest neighbours and nobody's in the reference, so it raises that count;
without drift the sides mix and it stays at its permutation mean. The
statistic is the MMD form of that count (within-reference and within-window
link densities minus twice the cross density), so unequal sides are fine.

Why a graph and not a kernel mean: measured on clinc150 and banking77
(bench/drift), a held-out intent at 10 % of the window lifts the share of
same-side links far more than it moves the mean of any global kernel,
because the new queries are near-paraphrases of each other; the same
TF-IDF vectors under a Gaussian-kernel MMD had less power on the diffuse
shifts (ten new banking intents at 1 % each).

Why part of the reference fits the embedder: fitting the IDF on the very
rows that are then compared with the window makes the sides differ by
construction (a reference row's words were all seen while fitting, a window
row's need not be): that test alarmed in 4 of 10 windows without any shift.
So `fit` splits the reference with its seed: `fit_share` of the rows (at
most `max_fit`) fit the embedder and are then set aside; the rest are the
side the window is compared with. Both of those are unseen by the fit, so
under no shift they are exchangeable and the permutation p-value,
(1 + #{permuted >= observed}) / (1 + permutations), keeps the false-alarm
rate at most `alpha`. The graph is built on a seeded shuffle of the pooled
rows, so ties between equally similar queries are not broken in favour of
either side.

Why a second statistic: queries unlike anything in the reference that are
also unlike each other (clinc150's out-of-scope queries: diverse, not a
topic) mix with both sides in the graph, so the link count misses them (2 of
10 windows at 10 % and n = 2,000). Each such query is, however, far from
every reference query. So every compared row (reference or window) gets its
cosine similarity to the nearest of the rows that fitted the embedder, a
fixed anchor that no labelling moves; the novelty statistic is how much lower
that similarity is on the window side than on the reference side. Both sides
are unseen by the fit, so under no drift these similarities are exchangeable
too. The two statistics are computed on the same label permutations and
combined by min-p (`detectors.min_p`), so the test's p-value is still exact
and the false-alarm rate still at most `alpha`; each one's own p-value is in
the details.

Guarantees: depends only on the texts and `seed`; memory is bounded by
`max_reference`, `max_window` and a fixed block of similarities (the full
N x N matrix is never held). The fitted embedder travels in the state, so a
restored detector scores exactly like the original.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp

from detectors.base import FittedDetector, Outcome, check_alpha, check_min_size
from detectors.min_p import min_p_combination
from detectors.mmd import permutation_labels
from detectors.tfidf import TfidfEmbedder

__all__ = ["TextKnnDrift", "knn_graph", "nearest_similarity"]

_BLOCK = 1024


def knn_graph(rows: sp.csr_matrix, neighbours: int) -> sp.csr_matrix:
    """The symmetrised k-nearest-neighbour graph of L2-normalised rows, by cosine similarity.

    Entry (i, j) is 1 or 2 (one or both chose the other); the diagonal is 0.
    Similarities are computed in blocks of rows, so the peak memory is one
    block of N floats per row, not N x N.
    """
    n = rows.shape[0]
    k = min(neighbours, n - 1)
    if k < 1:
        raise ValueError("a neighbour graph needs at least two rows")
    transposed = rows.T.tocsc()
    chosen = np.empty((n, k), dtype=np.int64)
    for start in range(0, n, _BLOCK):
        stop = min(n, start + _BLOCK)
        similarity = (rows[start:stop] @ transposed).toarray()
        similarity[np.arange(stop - start), np.arange(start, stop)] = -np.inf
        chosen[start:stop] = np.argpartition(-similarity, k - 1, axis=1)[:, :k]
    graph = sp.csr_matrix(
        (np.ones(n * k, dtype=np.float32), (np.repeat(np.arange(n), k), chosen.ravel())), shape=(n, n)
    )
    return (graph + graph.T).tocsr()


def nearest_similarity(rows: sp.csr_matrix, anchor: sp.csr_matrix) -> npt.NDArray[np.float64]:
    """Each row's cosine similarity to its most similar anchor row (rows L2-normalised; 0 for none).

    In blocks of rows, so the peak memory is one block of anchor-many floats per row.
    """
    if anchor.shape[0] == 0:
        return np.zeros(rows.shape[0])
    transposed = anchor.T.tocsc()
    nearest = np.empty(rows.shape[0])
    for start in range(0, rows.shape[0], _BLOCK):
        block = (rows[start : start + _BLOCK] @ transposed).toarray()
        nearest[start : start + block.shape[0]] = np.maximum(block.max(axis=1), 0.0)
    return nearest


class TextKnnDrift(FittedDetector):
    """Nearest-neighbour and novelty two-sample tests on query texts, in TF-IDF fitted on part of the
    reference, combined into one exact permutation test."""

    name: ClassVar[str] = "query_text_knn"
    version: ClassVar[str] = "2"

    def __init__(
        self,
        alpha: float = 0.05,
        neighbours: int = 10,
        permutations: int = 200,
        fit_share: float = 0.2,
        max_fit: int = 1000,
        max_reference: int = 4000,
        max_window: int = 4000,
        seed: int = 0,
    ) -> None:
        check_alpha(alpha)
        if neighbours < 1:
            raise ValueError(f"neighbours must be at least 1, got {neighbours}")
        if permutations < 19:
            raise ValueError(
                f"permutations must be at least 19 for a p-value at alpha 0.05, got {permutations}"
            )
        if not 0.0 < fit_share < 1.0:
            raise ValueError(f"fit_share must lie in (0, 1), got {fit_share}")
        if max_fit < 1 or max_reference < 2 or max_window < 2:
            raise ValueError("max_fit must be at least 1, max_reference and max_window at least 2")
        self.alpha = alpha
        self.neighbours = neighbours
        self.permutations = permutations
        self.fit_share = fit_share
        self.max_fit = max_fit
        self.max_reference = max_reference
        self.max_window = max_window
        self.seed = seed
        self.embedder: TfidfEmbedder | None = None
        self._fit_rows: npt.NDArray[np.int64] | None = None
        self._reference_rows: sp.csr_matrix | None = None
        self._anchor_rows: sp.csr_matrix | None = None

    @property
    def fit_rows(self) -> npt.NDArray[np.int64] | None:
        """Positions of the reference rows that fitted the embedder (left out of the test)."""
        return None if self._fit_rows is None else self._fit_rows.copy()

    def _check(self, values: npt.NDArray[Any], role: str) -> None:
        if values.ndim != 1 or values.dtype.kind not in "UST":
            raise ValueError(f"{self.name}: the {role} must be a 1-D array of query texts")
        check_min_size(values, role, 3 if role == "reference" else 2, self.name)

    def split(self, n: int) -> npt.NDArray[np.int64]:
        """The reference positions that fit the embedder: a seeded `fit_share` of n, at most `max_fit`."""
        size = min(self.max_fit, max(1, round(self.fit_share * n)), n - 2)
        order = np.random.default_rng([self.seed, 5]).permutation(n)
        return np.sort(order[:size]).astype(np.int64)

    def _fit(self, values: npt.NDArray[Any]) -> None:
        texts = [str(t) for t in values]
        fit_rows = self.split(len(texts))
        embedder = TfidfEmbedder().fit([texts[i] for i in fit_rows])
        self._install(texts, fit_rows, embedder)

    def _install(self, texts: list[str], fit_rows: npt.NDArray[np.int64], embedder: TfidfEmbedder) -> None:
        held_out = np.ones(len(texts), dtype=bool)
        held_out[fit_rows] = False
        test_rows = self._bounded(np.flatnonzero(held_out), self.max_reference, salt=1)
        self.embedder = embedder
        self._fit_rows = fit_rows
        self._reference_rows = embedder.transform([texts[i] for i in test_rows])
        self._anchor_rows = embedder.transform([texts[i] for i in fit_rows])

    def _bounded(self, positions: npt.NDArray[Any], limit: int, salt: int) -> npt.NDArray[Any]:
        if positions.shape[0] <= limit:
            return positions
        rows = np.random.default_rng([self.seed, salt]).choice(positions.shape[0], limit, replace=False)
        return positions[np.sort(rows)]

    def _fitted_state(self) -> dict[str, Any]:
        if self.embedder is None or self._fit_rows is None:
            return {}
        return {"embedder": self.embedder.to_state(), "fit_rows": self._fit_rows.copy()}

    def _load_fitted(self, values: npt.NDArray[Any], fitted: Mapping[str, Any]) -> None:
        if not fitted:
            self._fit(values)
            return
        texts = [str(t) for t in values]
        fit_rows = np.asarray(fitted["fit_rows"], dtype=np.int64)
        if fit_rows.size == 0 or fit_rows.min() < 0 or fit_rows.max() >= len(texts):
            raise ValueError(f"{self.name}: the stored fit rows do not match the reference")
        self._install(texts, fit_rows, TfidfEmbedder.from_state(fitted["embedder"]))

    def _score(self, values: npt.NDArray[Any]) -> Outcome:
        if (
            self._reference_rows is None
            or self._anchor_rows is None
            or self.embedder is None
            or self._fit_rows is None
        ):
            raise RuntimeError(f"{self.name}: not fitted")
        texts = [str(t) for t in values]
        positions = self._bounded(np.arange(len(texts)), self.max_window, salt=2)
        window = self.embedder.transform([texts[i] for i in positions])
        reference = self._reference_rows
        n, m = reference.shape[0], window.shape[0]
        pooled = sp.vstack([reference, window], format="csr")
        # Build the graph on a seeded shuffle: argpartition breaks ties by position, which must not
        # favour either side (duplicate queries are common in real traffic).
        order = np.random.default_rng([self.seed, 6]).permutation(n + m)
        shuffled = knn_graph(pooled[order], self.neighbours)
        inverse = np.empty_like(order)
        inverse[order] = np.arange(n + m)
        graph = shuffled[inverse][:, inverse].tocsr()
        labels = permutation_labels(n, n + m, self.permutations, np.random.default_rng(self.seed))
        linked = np.asarray(graph @ labels.T, dtype=np.float64)
        degrees = np.asarray(graph.sum(axis=1), dtype=np.float64).ravel()
        total = float(degrees.sum())
        # a'Ga counts within-reference links (twice), 1'Ga - a'Ga cross links, the rest within-window.
        within_x = np.einsum("ji,ij->j", labels.astype(np.float64), linked)
        cross = labels.astype(np.float64) @ degrees - within_x
        within_y = total - within_x - 2.0 * cross
        statistic = within_x / (n * (n - 1)) + within_y / (m * (m - 1)) - 2.0 * cross / (n * m)
        # Novelty: how much less similar to the anchor (the fit rows) the window side is than the reference
        # side; a function of each row alone, so a labelling only decides which side averages it.
        nearest = nearest_similarity(pooled, self._anchor_rows)
        on_reference = labels.astype(np.float64) @ nearest
        novelty = on_reference / n - (float(nearest.sum()) - on_reference) / m
        combined = min_p_combination(np.column_stack([statistic, novelty]))
        window_degree = float(degrees[n:].sum())
        window_within = float(within_y[0])
        # The reference side's 5th percentile of nearest similarity: the share of window queries below it
        # is about 0.05 without drift and reads as "the share of queries unlike the reference".
        low = float(np.quantile(nearest[:n], 0.05))
        return Outcome(
            statistic=-math.log10(combined.smallest),
            p_value=combined.p_value,
            details={
                "statistic_name": "min_p_neg_log10",
                "knn_statistic": float(statistic[0]),
                "knn_p_value": combined.p_values[0],
                "novelty_statistic": float(novelty[0]),
                "novelty_p_value": combined.p_values[1],
                "window_nearest_fit_similarity": float(nearest[n:].mean()),
                "reference_nearest_fit_similarity": float(nearest[:n].mean()),
                "window_share_unlike_reference": float(np.mean(nearest[n:] < low)),
                "neighbours": self.neighbours,
                "permutations": self.permutations,
                "embedder": self.embedder.model_name,
                "n_fit": int(self._fit_rows.size),
                "n_reference_used": n,
                "n_window_used": m,
                "subsampled": m < len(texts),
                # Interpretable: the share of the window's links that stay in the window, and what
                # it would be if the sides mixed (its expectation under no drift).
                "window_links_in_window": window_within / window_degree if window_degree else 0.0,
                "window_links_in_window_expected": (m - 1) / (n + m - 1),
            },
        )
