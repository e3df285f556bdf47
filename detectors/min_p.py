"""Several permutation tests on one set of label permutations, combined into one exact p-value (min-p).

Why: two statistics see different drifts (the query-text test's neighbour
mixing sees a new cluster of queries, its novelty statistic sees queries
unlike any in the reference), and alarming when either p-value is at most
alpha would double the false-alarm rate. Instead every statistic is computed
on the same labellings (row 0 the observed one, rows 1.. random); each
labelling gets, per statistic, the share of labellings whose statistic is at
least its own (its permutation p-value), and the smallest of those is
compared with the same quantity of every other labelling (Tippett's
combination in the permutation form of Pesarin, "Multivariate Permutation
Tests", 2001). Under no drift the labellings are exchangeable, so the
combined p-value, (1 + #{b >= 1: min_p[b] <= min_p[0]}) / (1 + B), is exact:
at most alpha with probability at most alpha, whatever the dependence between
the statistics. With one statistic it is that statistic's own permutation
p-value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["MinP", "min_p_combination"]


@dataclass(frozen=True, slots=True)
class MinP:
    """The combined p-value and each statistic's own permutation p-value, for the observed labelling."""

    p_value: float
    p_values: tuple[float, ...]
    smallest: float
    """min(p_values): Tippett's combining statistic before it is itself calibrated."""


def _p_values_of_every_row(column: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """For each row b, #{j: column[j] >= column[b]} / len(column), by one sort."""
    ordered = np.sort(column)
    at_least = column.size - np.searchsorted(ordered, column, side="left")
    return at_least.astype(np.float64) / column.size


def min_p_combination(statistics: npt.ArrayLike) -> MinP:
    """Combine the columns of a (1 + B, K) array of statistics (larger = more drift; row 0 observed).

    ValueError unless it is 2-D with at least two rows, one column and finite values.
    """
    values = np.asarray(statistics, dtype=np.float64)
    if values.ndim != 2 or values.shape[0] < 2 or values.shape[1] < 1:
        raise ValueError(f"statistics must be a (1 + permutations, tests) array, got shape {values.shape}")
    if not np.isfinite(values).all():
        raise ValueError("statistics must be finite")
    per_test = np.column_stack([_p_values_of_every_row(values[:, c]) for c in range(values.shape[1])])
    smallest = per_test.min(axis=1)
    combined = float(np.count_nonzero(smallest <= smallest[0])) / values.shape[0]
    return MinP(combined, tuple(float(p) for p in per_test[0]), float(smallest[0]))
