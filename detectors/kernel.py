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
    # Pairwise distances from the Gram matrix (BLAS), several times faster than pdist at 384 dimensions.
    squared_norms = np.einsum("ij,ij->i", points, points)
    squared = squared_norms[:, None] + squared_norms[None, :] - 2.0 * (points @ points.T)
    upper = squared[np.triu_indices(points.shape[0], k=1)]
    distances = np.sqrt(np.maximum(upper, 0.0))
    positive = distances[distances > 1e-12 * max(1.0, float(squared_norms.max()))]
    if positive.size == 0:
        raise ValueError("the reference has no spread: all sampled points coincide")
    return float(np.median(positive))


def gaussian_kernel_matrix(points: npt.NDArray[np.float32], bandwidth: float) -> npt.NDArray[np.float32]:
    """exp(-|x - y|² / (2 bandwidth²)) for every pair of rows, as one float32 matrix.

    Built in place from the Gram matrix so that the peak memory is the matrix
    itself (4 N² bytes) plus O(N) — the reason for float32.
    """
    scale = np.float32(1.0 / bandwidth)
    scaled = points * scale
    half_norms = np.einsum("ij,ij->i", scaled, scaled) * np.float32(0.5)
    # exp(-|x-y|²/2s²) = exp(x·y/s²) · exp(-|x|²/2s²) · exp(-|y|²/2s²): three passes over the matrix
    # instead of seven. It is used only while x·y/s² cannot overflow float32 (exp overflows near 88).
    if float(half_norms.max()) * 2.0 < 80.0:
        kernel = scaled @ scaled.T
        np.exp(kernel, out=kernel)
        factors = np.exp(-half_norms)
        kernel *= factors[:, None]
        kernel *= factors[None, :]
        np.fill_diagonal(kernel, 1.0)
        return kernel
    kernel = scaled @ scaled.T
    kernel -= half_norms[:, None]
    kernel -= half_norms[None, :]
    np.minimum(kernel, 0.0, out=kernel)
    np.exp(kernel, out=kernel)
    np.fill_diagonal(kernel, 1.0)
    return kernel
