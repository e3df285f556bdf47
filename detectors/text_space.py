"""Clustering query texts in a fitted TF-IDF space: spherical k-means on sparse rows (`detectors.explain`).

Why: the query-text test compares queries as rows of `TfidfEmbedder`, about
a million sparse slots wide, weighted by how rare each word was in the
reference. Grouping the new queries in that same space (rather than in the
384-d hashing space, where unrelated words share slots by chance) groups
them the way the test saw them. k-means on unit rows with centres kept at
unit length (spherical k-means; Dhillon and Modha 2001) follows cosine
similarity, the test's own measure. The rows are kept sparse and only the
slots they use become columns, so a centre is a few tens of thousands of
floats, not 2^20; an iteration is one sparse-times-dense product.
A dense reduction (truncated SVD to 64 or 200 coordinates) was tried first:
its leading directions were function words ("would like to", "how much
do"), and it took 10-50 s per window.

Guarantees: deterministic given the rows and the generator; every row gets
the centre it is most similar to; a cluster that empties keeps its centre.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp

__all__ = ["compact_columns", "nearest_centres", "spherical_kmeans"]


def compact_columns(rows: sp.csr_matrix) -> sp.csr_matrix:
    """The same rows with only the columns some row uses (in slot order)."""
    used = np.unique(rows.indices)
    indices = np.searchsorted(used, rows.indices)
    return sp.csr_matrix((rows.data, indices, rows.indptr), shape=(rows.shape[0], used.size))


def nearest_centres(
    rows: sp.csr_matrix, centres: npt.NDArray[np.float64]
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]]:
    """Each row's most similar centre and that cosine similarity (rows and centres at unit length)."""
    similarity = np.asarray(rows @ centres.T, dtype=np.float64)
    labels = np.argmax(similarity, axis=1)
    return labels, similarity[np.arange(rows.shape[0]), labels]


def _unit(matrix: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    norms = np.linalg.norm(matrix, axis=1)
    norms[norms == 0] = 1.0
    unit: npt.NDArray[np.float64] = matrix / norms[:, None]
    return unit


def _seeded_centres(rows: sp.csr_matrix, k: int, rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """k-means++ seeding under the cosine distance 1 - similarity."""
    n = rows.shape[0]
    chosen = [int(rng.integers(n))]
    closest = np.asarray(rows @ rows[chosen[0]].T.toarray()).ravel()
    for _ in range(1, k):
        weights = np.maximum(1.0 - closest, 0.0) ** 2
        total = float(weights.sum())
        pick = int(rng.integers(n)) if total <= 0 else int(rng.choice(n, p=weights / total))
        chosen.append(pick)
        closest = np.maximum(closest, np.asarray(rows @ rows[pick].T.toarray()).ravel())
    return _unit(rows[chosen].toarray().astype(np.float64))


def spherical_kmeans(
    rows: sp.csr_matrix, k: int, restarts: int, rng: np.random.Generator, iterations: int = 30
) -> npt.NDArray[np.float64]:
    """The unit centres of the best of `restarts` seeded runs (largest total similarity to own centre)."""
    best: tuple[float, npt.NDArray[np.float64]] | None = None
    n = rows.shape[0]
    for _ in range(restarts):
        centres = _seeded_centres(rows, k, rng)
        labels, similarity = nearest_centres(rows, centres)
        for _ in range(iterations):
            members = sp.csr_matrix((np.ones(n), (labels, np.arange(n))), shape=(k, n))
            sums = np.asarray((members @ rows).toarray(), dtype=np.float64)
            filled = np.asarray(members.sum(axis=1)).ravel() > 0
            centres[filled] = _unit(sums[filled])
            updated, similarity = nearest_centres(rows, centres)
            if np.array_equal(updated, labels):
                break
            labels = updated
        score = float(similarity.sum())
        if best is None or score > best[0]:
            best = (score, centres)
    assert best is not None
    return best[1]
