"""Explanation of query drift: which groups of current queries are over-represented against the reference.

The pooled embeddings (reference and window) are clustered with k-means
(k-means++ seeding, SciPy); each cluster is a group of similar queries. For
every group we compare its share of the window with its share of the
reference (one-sided Fisher exact test, Holm-adjusted over groups) and
describe it with the window queries closest to its centre and the words that
are most over-used in it. Nothing is generated: every word shown comes from
the queries themselves, and no LLM is involved.

Guarantees: deterministic given `seed` and the same set of vectors, in any
order (rows are put in a canonical order first, since traces arrive in
whatever order the exporters flush them); k-means runs from `restarts` seeded
starts and keeps the tightest clustering, so one unlucky start does not split
a new topic; clustering runs on at most `max_points` points (seeded
subsample) and every point is then assigned to its nearest centre, so the
cost is bounded whatever the window size. Groups are
sorted by adjusted p-value (most surely over-represented first), then by how
much their share grew; `significant` marks an adjusted p-value at or below
`alpha`.
"""

from __future__ import annotations

import math
import re
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import stats
from scipy.cluster.vq import kmeans2

from detectors.text_space import compact_columns, nearest_centres, spherical_kmeans
from detectors.tfidf import TfidfEmbedder

__all__ = ["QueryGroup", "explain_query_drift", "explain_query_text_drift"]

_WORD = re.compile(r"[^\W_]+", re.UNICODE)


@dataclass(frozen=True, slots=True)
class QueryGroup:
    """A group of similar queries whose share of traffic grew between the reference and the window."""

    share_window: float
    share_reference: float
    n_window: int
    n_reference: int
    p_value: float
    significant: bool
    terms: tuple[str, ...]
    examples: tuple[str, ...]
    members: tuple[int, ...] = ()
    """Positions of the group's window rows in the window as given (not in `to_json`: it can be long)."""

    @property
    def share_change(self) -> float:
        return self.share_window - self.share_reference

    def to_json(self) -> dict[str, Any]:
        return {
            "share_window": self.share_window,
            "share_reference": self.share_reference,
            "n_window": self.n_window,
            "n_reference": self.n_reference,
            "p_value": self.p_value,
            "significant": self.significant,
            "terms": list(self.terms),
            "examples": list(self.examples),
        }


def _nearest(points: npt.NDArray[np.float64], centres: npt.NDArray[np.float64]) -> npt.NDArray[np.intp]:
    labels = np.empty(points.shape[0], dtype=np.intp)
    centre_norms = np.einsum("ij,ij->i", centres, centres)
    for start in range(0, points.shape[0], 4096):
        block = points[start : start + 4096]
        # |x - c|² up to the |x|² term, which does not change the argmin.
        labels[start : start + block.shape[0]] = np.argmin(
            centre_norms[None, :] - 2.0 * block @ centres.T, axis=1
        )
    return labels


def _tightest_kmeans(
    sample: npt.NDArray[np.float64], k: int, restarts: int, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    runs: list[tuple[float, npt.NDArray[np.float64]]] = []
    for _ in range(restarts):
        with warnings.catch_warnings():
            # An empty cluster only means fewer groups; it is not a problem worth a warning.
            warnings.simplefilter("ignore", UserWarning)
            centres, labels = kmeans2(sample, k, minit="++", rng=rng)
        runs.append((float(np.sum((sample - centres[labels]) ** 2)), centres))
    return min(runs, key=lambda run: run[0])[1]


def _terms(texts: Sequence[str], background: Counter[str], n_background: int, limit: int) -> tuple[str, ...]:
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(set(_WORD.findall(text.lower())))
    if not texts:
        return ()
    # How much more often the group uses a word than the whole window does, weighted by how often the
    # group uses it: words common everywhere ("what", "the") score about zero.
    lift = {}
    for word, count in counts.items():
        inside, overall = count / len(texts), (background[word] + 1) / (n_background + 1)
        lift[word] = inside * math.log(inside / overall)
    ranked = sorted(lift.items(), key=lambda item: (-item[1], item[0]))
    return tuple(word for word, score in ranked[:limit] if score > 0)


def _holm(p_values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    order = np.argsort(p_values, kind="stable")
    m = p_values.size
    adjusted = np.empty(m)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def _groups(
    labels: npt.NDArray[np.intp],
    k: int,
    n_ref: int,
    closeness: npt.NDArray[np.float64],
    window_texts: Sequence[str],
    examples: int,
    terms: int,
    alpha: float,
) -> list[QueryGroup]:
    """The growing groups of a clustering of the pooled rows (reference first), most significant first."""
    n_win = labels.shape[0] - n_ref
    reference_counts = np.bincount(labels[:n_ref], minlength=k)
    window_counts = np.bincount(labels[n_ref:], minlength=k)
    p_values = np.array(
        [
            stats.fisher_exact(
                [
                    [window_counts[g], n_win - window_counts[g]],
                    [reference_counts[g], n_ref - reference_counts[g]],
                ],
                alternative="greater",
            ).pvalue
            for g in range(k)
        ],
        dtype=np.float64,
    )
    adjusted = _holm(p_values)
    window_labels = labels[n_ref:]
    background: Counter[str] = Counter()
    for text in window_texts:
        background.update(set(_WORD.findall(text.lower())))
    result: list[QueryGroup] = []
    for g in range(k):
        share_window, share_reference = window_counts[g] / n_win, reference_counts[g] / n_ref
        if share_window <= share_reference:
            continue
        members = np.flatnonzero(window_labels == g)
        closest = members[np.argsort(-closeness[members], kind="stable")[:examples]]
        result.append(
            QueryGroup(
                share_window=float(share_window),
                share_reference=float(share_reference),
                n_window=int(window_counts[g]),
                n_reference=int(reference_counts[g]),
                p_value=float(adjusted[g]),
                significant=bool(adjusted[g] <= alpha),
                terms=_terms([window_texts[int(i)] for i in members], background, n_win, terms),
                examples=tuple(window_texts[int(i)] for i in closest),
                members=tuple(int(i) for i in members),
            )
        )
    result.sort(key=lambda group: (group.p_value, -group.share_change))
    return result


def _check_grouping(groups: int, restarts: int) -> None:
    if groups < 2:
        raise ValueError(f"groups must be at least 2, got {groups}")
    if restarts < 1:
        raise ValueError(f"restarts must be at least 1, got {restarts}")


def _clustered_sample(
    canonical: npt.NDArray[np.intp], groups: int, max_points: int, rng: np.random.Generator
) -> tuple[npt.NDArray[np.intp], int]:
    """(the rows k-means is fitted on, in canonical order or a seeded draw of `max_points` of them,
    and the number of groups k)."""
    sample = (
        canonical
        if canonical.size <= max_points
        else canonical[rng.choice(canonical.size, max_points, replace=False)]
    )
    # Fine clusters keep a small new topic from being merged into a large old one; at least ~20 points each.
    return sample, max(2, min(groups, sample.size // 20))


def explain_query_drift(
    reference: npt.ArrayLike,
    window: npt.ArrayLike,
    window_texts: Sequence[str],
    *,
    groups: int = 40,
    examples: int = 5,
    terms: int = 5,
    alpha: float = 0.05,
    max_points: int = 4000,
    restarts: int = 4,
    seed: int = 0,
) -> list[QueryGroup]:
    """The groups of window queries whose share grew against the reference, most significant first.

    Raises ValueError when the shapes disagree, `window_texts` does not have
    one text per window row, or `groups` is below 2.
    """
    reference_points = np.asarray(reference, dtype=np.float64)
    window_points = np.asarray(window, dtype=np.float64)
    if (
        reference_points.ndim != 2
        or window_points.ndim != 2
        or reference_points.shape[1] != window_points.shape[1]
    ):
        raise ValueError("reference and window must be 2-D arrays of the same width")
    if len(window_texts) != window_points.shape[0]:
        raise ValueError(f"{len(window_texts)} texts for {window_points.shape[0]} window vectors")
    _check_grouping(groups, restarts)
    n_ref, n_win = reference_points.shape[0], window_points.shape[0]
    if n_ref == 0 or n_win == 0:
        return []
    pooled = np.concatenate([reference_points, window_points])
    rng = np.random.default_rng(seed)
    sample, k = _clustered_sample(np.lexsort(pooled.T[::-1]), groups, max_points, rng)
    centres = _tightest_kmeans(pooled[sample], k, restarts, rng)
    labels = _nearest(pooled, centres)
    window_labels = labels[n_ref:]
    # Closeness of a window row to its group's centre: the examples are the closest ones.
    closeness = -np.linalg.norm(window_points - centres[window_labels], axis=1)
    return _groups(labels, k, n_ref, closeness, window_texts, examples, terms, alpha)


def explain_query_text_drift(
    embedder: TfidfEmbedder,
    reference_texts: Sequence[str],
    window_texts: Sequence[str],
    *,
    groups: int = 40,
    examples: int = 5,
    terms: int = 5,
    alpha: float = 0.05,
    max_points: int = 4000,
    restarts: int = 4,
    seed: int = 0,
) -> list[QueryGroup]:
    """`explain_query_drift` in the fitted TF-IDF space of the query-text test (`detectors.text_space`).

    The reference and window texts are embedded together by `embedder` and
    grouped by spherical k-means; the canonical order is the texts' sorted
    order (equal texts are equal rows), so shuffled windows give the same
    groups. ValueError when `groups` is below 2 or `restarts` below 1.
    """
    _check_grouping(groups, restarts)
    n_ref, n_win = len(reference_texts), len(window_texts)
    if n_ref == 0 or n_win == 0:
        return []
    texts = [str(t) for t in (*reference_texts, *window_texts)]
    rows = compact_columns(embedder.transform(texts))
    rng = np.random.default_rng(seed)
    canonical = np.argsort(np.array(texts, dtype=str), kind="stable")
    sample, k = _clustered_sample(canonical, groups, max_points, rng)
    centres = spherical_kmeans(rows[sample], k, restarts, rng)
    labels, similarity = nearest_centres(rows, centres)
    return _groups(labels, k, n_ref, similarity[n_ref:], texts[n_ref:], examples, terms, alpha)
