"""Query-embedding drift: a kernel two-sample test (MMD) whose permutations all reuse one kernel matrix.

The statistic is the unbiased estimate of the squared maximum mean
discrepancy between the reference and the window under a Gaussian kernel with
the median-heuristic bandwidth pinned on the reference. Its null distribution
comes from label permutations of the pooled sample. The kernel matrix is
built once per window; every permutation only needs K·a for its label vector
a, so all permutations together are one matrix product K·A (Aᵀ's rows are
the label vectors). At 2,000 rows a
side in 384 dimensions that is about 4,000 × 4,000 float32 (64 MB).

Guarantees: the p-value is (1 + #{permuted ≥ observed}) / (1 + permutations),
so the false-alarm rate is at most `alpha` under no shift; results depend only
on the data and `seed`. Windows or references larger than `max_per_side` are
subsampled (seeded) to keep the kernel matrix bounded; the result says so.
For larger windows use `RffMmdDrift` (linear time).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from detectors.base import FittedDetector, Outcome, check_alpha, check_min_size
from detectors.kernel import gaussian_kernel_matrix, median_bandwidth

__all__ = ["MmdDrift", "check_embeddings", "permutation_labels"]


def check_embeddings(values: npt.NDArray[Any], role: str, detector: str, dim: int | None) -> None:
    """Raise ValueError unless `values` is a finite 2-D numeric array (of width `dim` when given)."""
    if values.ndim != 2 or not np.issubdtype(values.dtype, np.number):
        raise ValueError(
            f"{detector}: the {role} must be a 2-D numeric array, got {values.dtype} {values.shape}"
        )
    if dim is not None and values.shape[1] != dim:
        raise ValueError(
            f"{detector}: the {role} has dimension {values.shape[1]}, the reference {dim}; "
            "vectors of different models cannot be compared (see EmbeddingModelChange)"
        )
    check_min_size(values, role, 2, detector)
    if not np.isfinite(values).all():
        raise ValueError(f"{detector}: the {role} contains NaN or infinite values")


def permutation_labels(
    n_first: int, n_total: int, permutations: int, rng: np.random.Generator
) -> npt.NDArray[np.float32]:
    """A (1 + permutations, n_total) 0/1 matrix: row 0 marks the first `n_first` items, each other row
    a uniformly random subset of `n_first` items.

    A random subset is the `n_first` smallest of i.i.d. uniform keys: one
    vectorised draw and a partition per row, several times cheaper than
    shuffling each row (float64 keys make ties practically impossible).
    """
    labels = np.zeros((permutations + 1, n_total), dtype=np.float32)
    labels[0, :n_first] = 1.0
    keys = rng.random((permutations, n_total))
    threshold = np.partition(keys, n_first - 1, axis=1)[:, n_first - 1 : n_first]
    labels[1:] = keys <= threshold
    return labels


class MmdDrift(FittedDetector):
    """Quadratic-time MMD permutation test on embeddings (exact kernel, for windows up to a few thousand)."""

    name: ClassVar[str] = "query_embedding_mmd"
    version: ClassVar[str] = "1"

    def __init__(
        self,
        alpha: float = 0.05,
        permutations: int = 200,
        max_per_side: int = 2500,
        bandwidth_sample: int = 1000,
        seed: int = 0,
    ) -> None:
        check_alpha(alpha)
        if permutations < 19:
            raise ValueError(
                f"permutations must be at least 19 for a p-value at alpha 0.05, got {permutations}"
            )
        if max_per_side < 2 or bandwidth_sample < 2:
            raise ValueError("max_per_side and bandwidth_sample must be at least 2")
        self.alpha = alpha
        self.permutations = permutations
        self.max_per_side = max_per_side
        self.bandwidth_sample = bandwidth_sample
        self.seed = seed
        self.bandwidth: float | None = None
        self._reference_points: npt.NDArray[np.float32] | None = None

    def _check(self, values: npt.NDArray[Any], role: str) -> None:
        dim = (
            None if self._reference_points is None or role == "reference" else self._reference_points.shape[1]
        )
        check_embeddings(values, role, self.name, dim)

    def _fit(self, values: npt.NDArray[Any]) -> None:
        self.bandwidth = median_bandwidth(values, sample=self.bandwidth_sample, seed=self.seed)
        self._reference_points = self._bounded(np.asarray(values, dtype=np.float32), salt=1)

    def _fitted_state(self) -> dict[str, Any]:
        return {"bandwidth": self.bandwidth}

    def _load_fitted(self, values: npt.NDArray[Any], fitted: Mapping[str, Any]) -> None:
        self._reference_points = self._bounded(np.asarray(values, dtype=np.float32), salt=1)
        self.bandwidth = float(fitted["bandwidth"])

    def _bounded(self, points: npt.NDArray[np.float32], salt: int) -> npt.NDArray[np.float32]:
        if points.shape[0] <= self.max_per_side:
            return points
        rows = np.random.default_rng([self.seed, salt]).choice(
            points.shape[0], self.max_per_side, replace=False
        )
        return points[np.sort(rows)]

    def _score(self, values: npt.NDArray[Any]) -> Outcome:
        if self._reference_points is None or self.bandwidth is None:
            raise RuntimeError(f"{self.name}: not fitted")
        reference = self._reference_points
        window = self._bounded(np.asarray(values, dtype=np.float32), salt=2)
        n, m = reference.shape[0], window.shape[0]
        kernel = gaussian_kernel_matrix(np.concatenate([reference, window]), self.bandwidth)
        labels = permutation_labels(n, n + m, self.permutations, np.random.default_rng(self.seed))
        # One product gives K·a for every label vector a; the row sums K·1 come from the same product.
        kernel_labels = kernel @ np.concatenate([labels, np.ones((1, n + m), dtype=np.float32)]).T
        del kernel
        row_sums = kernel_labels[:, -1].astype(np.float64)
        total = float(row_sums.sum())
        # a'Ka is the within-reference kernel sum; 1'Ka - a'Ka the cross sum; the rest is within-window.
        within_x = np.einsum("ji,ij->j", labels, kernel_labels[:, :-1], dtype=np.float64)
        cross = labels.astype(np.float64) @ row_sums - within_x
        within_y = total - within_x - 2.0 * cross
        mmd2 = (within_x - n) / (n * (n - 1)) + (within_y - m) / (m * (m - 1)) - 2.0 * cross / (n * m)
        observed = float(mmd2[0])
        exceed = int(np.count_nonzero(mmd2[1:] >= observed))
        p_value = (1 + exceed) / (1 + self.permutations)
        return Outcome(
            statistic=observed,
            p_value=p_value,
            details={
                "statistic_name": "mmd2_unbiased",
                "bandwidth": self.bandwidth,
                "permutations": self.permutations,
                "n_reference_used": n,
                "n_window_used": m,
                "subsampled": n < (self._reference.n if self._reference else n) or m < values.shape[0],
            },
        )
