"""Embedding-model change: a new model name or vector dimension in traces is an event of its own.

Cosine similarity between vectors of two models means nothing, so a model
swap must not be scored as query drift: it gets its own alert, and the
service keeps one embedding window (and one reference) per model key. This
detector is a rule, not a test: it fires when at least `min_count` window
traces carry a model key that the reference never had. It has no alpha and
no p-value, and under no change it never fires.

A model key is `embedding_model_key(name, dim)`: "name@dim", with "unknown"
for traces that sent a vector without a model name. Guarantees: deterministic;
the details list every new and every vanished key with its counts.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from detectors.base import FittedDetector, Outcome, check_min_size

__all__ = ["EmbeddingModelChange", "embedding_model_key", "split_model_key"]

UNKNOWN_MODEL = "unknown"


def embedding_model_key(name: str | None, dim: int) -> str:
    """The key that tells embedding models apart: "name@dim"; raises ValueError for a non-positive dim."""
    if dim < 1:
        raise ValueError(f"an embedding dimension must be positive, got {dim}")
    return f"{name or UNKNOWN_MODEL}@{dim}"


def split_model_key(key: str) -> tuple[str, int]:
    """The (name, dim) of a key made by `embedding_model_key`; raises ValueError for anything else."""
    name, separator, dim = key.rpartition("@")
    if not separator or not name or not dim.isdigit():
        raise ValueError(f"not an embedding model key: {key!r}")
    return name, int(dim)


class EmbeddingModelChange(FittedDetector):
    """Fires when window traces carry an embedding model (name or dimension) the reference never had."""

    name: ClassVar[str] = "embedding_model_change"
    version: ClassVar[str] = "1"

    def __init__(self, min_count: int = 1) -> None:
        if min_count < 1:
            raise ValueError(f"min_count must be at least 1, got {min_count}")
        self.min_count = min_count
        self._reference_counts: Counter[str] | None = None

    def _check(self, values: npt.NDArray[Any], role: str) -> None:
        if values.ndim != 1 or values.dtype.kind not in "UST":
            raise ValueError(
                f"{self.name}: the {role} must be a 1-D array of model keys (embedding_model_key)"
            )
        check_min_size(values, role, 1, self.name)
        for key in np.unique(values):
            split_model_key(str(key))

    def _fit(self, values: npt.NDArray[Any]) -> None:
        self._reference_counts = Counter(str(key) for key in values)

    def _score(self, values: npt.NDArray[Any]) -> Outcome:
        if self._reference_counts is None:
            raise RuntimeError(f"{self.name}: not fitted")
        window_counts = Counter(str(key) for key in values)
        new = {
            key: count for key, count in sorted(window_counts.items()) if key not in self._reference_counts
        }
        vanished = sorted(key for key in self._reference_counts if key not in window_counts)
        new_traces = sum(new.values())
        reference_dims = {split_model_key(key)[1] for key in self._reference_counts}
        return Outcome(
            statistic=new_traces / max(1, values.size),
            p_value=None,
            drifted=new_traces >= self.min_count,
            details={
                "statistic_name": "share_of_window_with_new_model",
                "new_models": dict(new),
                "vanished_models": list(vanished),
                "reference_models": dict(sorted(self._reference_counts.items())),
                "dimension_changed": any(split_model_key(key)[1] not in reference_dims for key in new),
            },
        )
