"""Retrieval drift in where hits land: how traces spread over documents or collections, reference vs window.

Each trace contributes one category (its top hit's document id, or the
collection it came from: see `detectors.features`), so observations are
independent. The test is Pearson's chi-square test of homogeneity on the
2 × K table of counts.

Small counts: document ids have a long tail, and chi-square's approximation
needs expected counts of about five or more. Categories whose expected count
is below `min_expected` in either row are pooled into one "(rare)" column;
the pooling looks only at the pooled column totals, which the test conditions
on, so it does not bias the test. When pooling still leaves an expected count
below `min_expected` (or fewer than two columns), or when `method` is
"permutation", the p-value comes from a seeded Monte Carlo permutation test
of the same statistic on the unpooled table instead, valid at any count.

Guarantees: deterministic given `seed`; false-alarm rate at most `alpha` under
no shift (exactly so for the permutation path, asymptotically for chi-square).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt
from scipy import stats

from detectors.base import FittedDetector, Outcome, check_alpha, check_min_size

__all__ = ["HitDistributionDrift", "chi_square_statistic"]

RARE = "(rare)"


def chi_square_statistic(table: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Pearson's statistic of one or many 2 × K tables (last two axes), skipping all-zero columns."""
    rows = table.sum(axis=-1, keepdims=True)
    columns = table.sum(axis=-2, keepdims=True)
    expected = rows * columns / table.sum(axis=(-2, -1), keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(expected > 0, (table - expected) ** 2 / expected, 0.0)
    return np.asarray(terms.sum(axis=(-2, -1)), dtype=np.float64)


class HitDistributionDrift(FittedDetector):
    """Chi-square test (rare categories pooled, permutation fallback) on one category per trace."""

    name: ClassVar[str] = "retrieval_hits"
    version: ClassVar[str] = "1"

    def __init__(
        self,
        alpha: float = 0.05,
        min_expected: float = 5.0,
        method: Literal["auto", "chi2", "permutation"] = "auto",
        permutations: int = 999,
        seed: int = 0,
    ) -> None:
        check_alpha(alpha)
        if min_expected <= 0:
            raise ValueError(f"min_expected must be positive, got {min_expected}")
        if method not in ("auto", "chi2", "permutation"):
            raise ValueError(f"method must be 'auto', 'chi2' or 'permutation', got {method!r}")
        if permutations < 19:
            raise ValueError(f"permutations must be at least 19, got {permutations}")
        self.alpha = alpha
        self.min_expected = min_expected
        self.method = method
        self.permutations = permutations
        self.seed = seed
        self._categories: npt.NDArray[np.str_] | None = None

    def _check(self, values: npt.NDArray[Any], role: str) -> None:
        if values.ndim != 1 or values.dtype.kind not in "UST":
            raise ValueError(
                f"{self.name}: the {role} must be a 1-D array of category strings, one per trace"
            )
        check_min_size(values, role, 1, self.name)

    def _fit(self, values: npt.NDArray[Any]) -> None:
        self._categories = np.asarray(values).astype(str)

    def _score(self, values: npt.NDArray[Any]) -> Outcome:
        if self._categories is None:
            raise RuntimeError(f"{self.name}: not fitted")
        reference, window = self._categories, np.asarray(values).astype(str)
        names, codes = np.unique(np.concatenate([reference, window]), return_inverse=True)
        n_ref = reference.size
        table = np.stack(
            [
                np.bincount(codes[:n_ref], minlength=names.size),
                np.bincount(codes[n_ref:], minlength=names.size),
            ]
        ).astype(np.float64)
        pooled, n_pooled = self._pool(table)
        expected = pooled.sum(axis=1, keepdims=True) * pooled.sum(axis=0, keepdims=True) / pooled.sum()
        asymptotic_ok = pooled.shape[1] >= 2 and bool((expected >= self.min_expected).all())
        if self.method == "chi2" or (self.method == "auto" and asymptotic_ok):
            if pooled.shape[1] < 2:
                statistic, p_value, used = 0.0, 1.0, "chi2"
            else:
                chi2 = stats.chi2_contingency(pooled, correction=False)
                statistic, p_value, used = float(chi2.statistic), float(chi2.pvalue), "chi2"
        else:
            statistic, p_value = self._permutation(table, codes, n_ref)
            used = "permutation"
        shares_ref = table[0] / table[0].sum()
        shares_now = table[1] / table[1].sum()
        change = shares_now - shares_ref
        top = np.argsort(-np.abs(change), kind="stable")[:5]
        return Outcome(
            statistic=statistic,
            p_value=min(1.0, p_value),
            details={
                "statistic_name": "chi2",
                "method": used,
                "categories": int(names.size),
                "columns_after_pooling": int(pooled.shape[1]),
                "pooled_categories": int(n_pooled),
                "new_categories": int(np.count_nonzero((table[0] == 0) & (table[1] > 0))),
                "largest_changes": [
                    {
                        "category": str(names[i]),
                        "share_window": float(shares_now[i]),
                        "share_reference": float(shares_ref[i]),
                    }
                    for i in top
                ],
            },
        )

    def _pool(self, table: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.float64], int]:
        """Merge columns whose smallest expected count is under `min_expected` into one rare column."""
        rows = table.sum(axis=1)
        smallest_expected = table.sum(axis=0) * rows.min() / rows.sum()
        rare = smallest_expected < self.min_expected
        n_rare = int(np.count_nonzero(rare))
        if n_rare == 0:
            return table, 0
        kept = table[:, ~rare]
        rare_column = table[:, rare].sum(axis=1, keepdims=True)
        return np.concatenate([kept, rare_column], axis=1), n_rare

    def _permutation(
        self, table: npt.NDArray[np.float64], codes: npt.NDArray[np.intp], n_ref: int
    ) -> tuple[float, float]:
        observed = float(chi_square_statistic(table))
        rng = np.random.default_rng(self.seed)
        k = table.shape[1]
        column_totals = table.sum(axis=0)
        exceed = 0
        for _ in range(self.permutations):
            shuffled = rng.permutation(codes)
            reference_counts = np.bincount(shuffled[:n_ref], minlength=k).astype(np.float64)
            permuted = np.stack([reference_counts, column_totals - reference_counts])
            if chi_square_statistic(permuted) >= observed - 1e-9 * max(1.0, observed):
                exceed += 1
        return observed, (1 + exceed) / (1 + self.permutations)
