"""The Gaussian kernel used by the embedding drift tests, and its bandwidth pinned from the reference.

The bandwidth is the median heuristic: the median Euclidean distance between
pairs of reference points, taken on a seeded subsample so that fitting costs
the same at any reference size. It is fitted once with the reference and
stored with it; windows never move it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.spatial.distance import pdist

__all__ = ["gaussian_kernel_matrix", "median_bandwidth"]


def median_bandwidth(values: npt.NDArray[Any], *, sample: int, seed: int) -> float:
    """The median pairwise distance of (a seeded subsample of at most `sample` rows of) `values`.

    Raises ValueError when every sampled pair coincides: no bandwidth can be
    read from a reference without spread.
    """
    if sample < 2:
        raise ValueError(f"sample must be at least 2, got {sample}")
    points = np.asarray(values, dtype=np.float64)
    if points.shape[0] > sample:
        rows = np.random.default_rng(seed).choice(points.shape[0], size=sample, replace=False)
        points = points[np.sort(rows)]
    distances = pdist(points)
    positive = distances[distances > 0]
    if positive.size == 0:
        raise ValueError("the reference has no spread: all sampled points coincide")
    return float(np.median(positive))


def gaussian_kernel_matrix(points: npt.NDArray[np.float32], bandwidth: float) -> npt.NDArray[np.float32]:
    """exp(-|x - y|² / (2 bandwidth²)) for every pair of rows, as one float32 matrix.

    Built in place from the Gram matrix so that the peak memory is the matrix
    itself (4 N² bytes) plus O(N) — the reason for float32.
    """
    squared_norms = np.einsum("ij,ij->i", points, points)
    kernel = points @ points.T
    kernel *= -2.0
    kernel += squared_norms[:, None]
    kernel += squared_norms[None, :]
    np.maximum(kernel, 0.0, out=kernel)
    np.fill_diagonal(kernel, 0.0)
    kernel *= np.float32(-0.5 / bandwidth**2)
    np.exp(kernel, out=kernel)
    return kernel
