"""Query-embedding drift for large windows: MMD approximated with random Fourier features, in linear time.

Each embedding x is mapped to z(x) = sqrt(2/D) cos(xW + b), with W drawn from
N(0, I/bandwidth²) and b from U[0, 2π) (Rahimi & Recht, 2007), so that
z(x)·z(y) approximates the same Gaussian kernel as `MmdDrift`. The statistic
is |mean z(reference) - mean z(window)|², and its null distribution comes from
label permutations: every permutation is one column of Zᵀ·A, a single matrix
product over the D features, so time and memory grow linearly with n.

Guarantees: W, b and the bandwidth are drawn once at fit from `seed` and are
saved with the state, so a restored detector gives identical results. The
p-value is a permutation p-value, (1 + #{permuted ≥ observed}) / (1 + permutations),
so the false-alarm rate is at most `alpha` under no shift.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from detectors.base import FittedDetector, Outcome, check_alpha
from detectors.kernel import median_bandwidth
from detectors.mmd import check_embeddings, permutation_labels

__all__ = ["RffMmdDrift"]


class RffMmdDrift(FittedDetector):
    """Linear-time MMD permutation test on random Fourier features of embeddings."""

    name: ClassVar[str] = "query_embedding_rff"
    version: ClassVar[str] = "1"

    def __init__(
        self,
        alpha: float = 0.05,
        features: int = 256,
        permutations: int = 200,
        bandwidth_sample: int = 1000,
        seed: int = 0,
    ) -> None:
        check_alpha(alpha)
        if features < 1:
            raise ValueError(f"features must be positive, got {features}")
        if permutations < 19:
            raise ValueError(
                f"permutations must be at least 19 for a p-value at alpha 0.05, got {permutations}"
            )
        if bandwidth_sample < 2:
            raise ValueError("bandwidth_sample must be at least 2")
        self.alpha = alpha
        self.features = features
        self.permutations = permutations
        self.bandwidth_sample = bandwidth_sample
        self.seed = seed
        self.bandwidth: float | None = None
        self._frequencies: npt.NDArray[np.float32] | None = None
        self._phases: npt.NDArray[np.float32] | None = None
        self._reference_features: npt.NDArray[np.float32] | None = None

    def _check(self, values: npt.NDArray[Any], role: str) -> None:
        dim = None if self._frequencies is None or role == "reference" else self._frequencies.shape[0]
        check_embeddings(values, role, self.name, dim)

    def _fit(self, values: npt.NDArray[Any]) -> None:
        self.bandwidth = median_bandwidth(values, sample=self.bandwidth_sample, seed=self.seed)
        rng = np.random.default_rng([self.seed, 3])
        dim = values.shape[1]
        self._frequencies = (rng.standard_normal((dim, self.features)) / self.bandwidth).astype(np.float32)
        self._phases = rng.uniform(0.0, 2.0 * np.pi, self.features).astype(np.float32)
        self._reference_features = self._featurize(values)

    def _fitted_state(self) -> dict[str, Any]:
        return {"bandwidth": self.bandwidth, "frequencies": self._frequencies, "phases": self._phases}

    def _load_fitted(self, values: npt.NDArray[Any], fitted: Mapping[str, Any]) -> None:
        self.bandwidth = float(fitted["bandwidth"])
        self._frequencies = np.asarray(fitted["frequencies"], dtype=np.float32)
        self._phases = np.asarray(fitted["phases"], dtype=np.float32)
        self._reference_features = self._featurize(values)

    def _featurize(self, values: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
        if self._frequencies is None or self._phases is None:
            raise RuntimeError(f"{self.name}: not fitted")
        projected = np.asarray(values, dtype=np.float32) @ self._frequencies
        projected += self._phases
        np.cos(projected, out=projected)
        projected *= np.float32(np.sqrt(2.0 / self.features))
        return projected

    def _score(self, values: npt.NDArray[Any]) -> Outcome:
        if self._reference_features is None:
            raise RuntimeError(f"{self.name}: not fitted")
        reference = self._reference_features
        window = self._featurize(values)
        n, m = reference.shape[0], window.shape[0]
        pooled = np.concatenate([reference, window])
        del window
        labels = permutation_labels(n, n + m, self.permutations, np.random.default_rng(self.seed))
        # mean_x - mean_y = (1/n + 1/m) Zᵀa - (1/m) Zᵀ1 for a 0/1 label vector a marking the reference side.
        sums = (pooled.T @ labels.T).astype(np.float64)
        totals = pooled.sum(axis=0, dtype=np.float64)[:, None]
        differences = sums * (1.0 / n + 1.0 / m) - totals / m
        statistics = np.einsum("ij,ij->j", differences, differences)
        observed = float(statistics[0])
        exceed = int(np.count_nonzero(statistics[1:] >= observed))
        return Outcome(
            statistic=observed,
            p_value=(1 + exceed) / (1 + self.permutations),
            details={
                "statistic_name": "mmd2_rff",
                "bandwidth": self.bandwidth,
                "features": self.features,
                "permutations": self.permutations,
            },
        )
