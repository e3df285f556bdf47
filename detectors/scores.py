"""Retrieval-score drift: two-sample tests on per-trace scores, and the share of empty retrievals.

`ScoreDistributionDrift` compares one number per trace (the top-1 score, or
the mean of the top-k scores: see `detectors.features`) between the reference
and the window with a Kolmogorov–Smirnov or Cramér–von Mises two-sample test
from SciPy. One number per trace keeps observations
independent; pooling all k scores of every trace would not.

`EmptyRetrievalDrift` compares the share of traces whose retrieval returned
nothing with Fisher's exact test on the 2×2 table, valid at any count.

Guarantees: deterministic (no randomness); the false-alarm rate is at most
`alpha` up to the test's own approximation (KS and Fisher are exact or
conservative for continuous scores; ties make KS conservative).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt
from scipy import stats

from detectors.base import FittedDetector, Outcome, check_alpha, check_min_size

__all__ = ["EmptyRetrievalDrift", "ScoreDistributionDrift", "ScoreTest", "TopScoreDrift", "TopkScoreDrift"]

ScoreTest = Literal["ks", "cvm"]


class ScoreDistributionDrift(FittedDetector):
    """Two-sample test on one retrieval score per trace (KS by default)."""

    name: ClassVar[str] = "retrieval_score"
    version: ClassVar[str] = "1"

    def __init__(self, alpha: float = 0.05, test: ScoreTest = "ks", min_size: int = 20) -> None:
        check_alpha(alpha)
        if test not in ("ks", "cvm"):
            raise ValueError(f"test must be 'ks' or 'cvm', got {test!r}")
        if min_size < 2:
            raise ValueError(f"min_size must be at least 2, got {min_size}")
        self.alpha = alpha
        self.test = test
        self.min_size = min_size
        self._scores: npt.NDArray[np.float64] | None = None

    def _check(self, values: npt.NDArray[Any], role: str) -> None:
        if values.ndim != 1 or not np.issubdtype(values.dtype, np.number):
            raise ValueError(f"{self.name}: the {role} must be a 1-D numeric array of one score per trace")
        check_min_size(values, role, self.min_size, self.name)
        if not np.isfinite(values).all():
            raise ValueError(f"{self.name}: the {role} contains NaN or infinite scores; drop unscored traces")

    def _fit(self, values: npt.NDArray[Any]) -> None:
        self._scores = np.asarray(values, dtype=np.float64)

    def _score(self, values: npt.NDArray[Any]) -> Outcome:
        if self._scores is None:
            raise RuntimeError(f"{self.name}: not fitted")
        reference, window = self._scores, np.asarray(values, dtype=np.float64)
        if self.test == "ks":
            ks = stats.ks_2samp(reference, window)
            statistic, p_value = float(ks.statistic), float(ks.pvalue)
        else:
            cvm = stats.cramervonmises_2samp(reference, window)
            statistic, p_value = float(cvm.statistic), float(cvm.pvalue)
        return Outcome(
            statistic=statistic,
            p_value=min(1.0, max(0.0, p_value)),
            details={
                "statistic_name": self.test,
                "median_reference": float(np.median(reference)),
                "median_window": float(np.median(window)),
                "mean_shift": float(window.mean() - reference.mean()),
            },
        )


class EmptyRetrievalDrift(FittedDetector):
    """Fisher's exact test on the share of traces whose retrieval returned no chunk."""

    name: ClassVar[str] = "retrieval_empty_share"
    version: ClassVar[str] = "1"

    def __init__(
        self, alpha: float = 0.05, alternative: Literal["two-sided", "greater"] = "two-sided"
    ) -> None:
        check_alpha(alpha)
        if alternative not in ("two-sided", "greater"):
            raise ValueError(f"alternative must be 'two-sided' or 'greater', got {alternative!r}")
        self.alpha = alpha
        self.alternative = alternative
        self._counts: tuple[int, int] | None = None

    def _check(self, values: npt.NDArray[Any], role: str) -> None:
        if values.ndim != 1 or values.dtype != np.bool_:
            raise ValueError(
                f"{self.name}: the {role} must be a 1-D boolean array (True = nothing retrieved)"
            )
        check_min_size(values, role, 1, self.name)

    def _fit(self, values: npt.NDArray[Any]) -> None:
        self._counts = (int(values.sum()), int(values.size))

    def _score(self, values: npt.NDArray[Any]) -> Outcome:
        if self._counts is None:
            raise RuntimeError(f"{self.name}: not fitted")
        empty_ref, n_ref = self._counts
        empty_now, n_now = int(values.sum()), int(values.size)
        table = [[empty_now, n_now - empty_now], [empty_ref, n_ref - empty_ref]]
        # "greater" asks whether the window has more empty retrievals than the reference.
        fisher = stats.fisher_exact(table, alternative=self.alternative)
        share_now, share_ref = empty_now / n_now, empty_ref / n_ref
        return Outcome(
            statistic=share_now - share_ref,
            p_value=float(fisher.pvalue),
            details={
                "statistic_name": "share_difference",
                "share_window": share_now,
                "share_reference": share_ref,
                "empty_window": empty_now,
                "empty_reference": empty_ref,
            },
        )


class TopScoreDrift(ScoreDistributionDrift):
    """Drift of the top-1 retrieval score per trace (`features.top1_score`)."""

    name: ClassVar[str] = "retrieval_top1_score"


class TopkScoreDrift(ScoreDistributionDrift):
    """Drift of the mean top-k retrieval score per trace (`features.topk_mean_score`)."""

    name: ClassVar[str] = "retrieval_topk_score"
