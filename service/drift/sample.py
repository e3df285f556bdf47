"""Drift observations (one per trace) and the arithmetic of keeping uniform samples of them.

An `Observation` is what the drift detectors need from one trace: its query
text and vector, its top-1 and mean top-k retrieval scores, whether the
retrieval came back empty, and its top hit. A `Sample` is a list of them with
the arrays each detector reads.

Samples are kept per time bucket, each a uniform sample of the bucket's
traffic with a known `seen` count. Two functions keep them uniform:

* `merge_counts` says how many rows of an old bucket sample survive when a
  new reservoir of the same bucket is merged in (hypergeometric, so the
  merged sample is again uniform over both);
* `draw_counts` says how many rows to take from each bucket so that a sample
  across many buckets is uniform over all their traffic, not over the rows
  that happen to be stored (a busy hour stands for more traces than a quiet
  one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import numpy.typing as npt

__all__ = ["Observation", "Sample", "draw_counts", "merge_counts"]


@dataclass(frozen=True, slots=True)
class Observation:
    """One trace as the drift detectors see it; None where the trace lacks the value."""

    trace_id: str
    time: datetime
    release: str | None = None
    intent: str | None = None
    query: str | None = None
    vector: npt.NDArray[np.float32] | None = None
    top1: float | None = None
    topk: float | None = None
    empty: bool | None = None
    hit: str | None = None


@dataclass(frozen=True, slots=True)
class Sample:
    """A uniform sample of observations of one (tenant, app, embedding model) over a time range."""

    observations: tuple[Observation, ...]

    def __len__(self) -> int:
        return len(self.observations)

    def vectors(self) -> tuple[npt.NDArray[np.float32], list[str]]:
        """The query vectors (rows) of observations that have one, and their query texts ("" if none)."""
        rows = [o for o in self.observations if o.vector is not None and o.vector.size]
        if not rows:
            return np.zeros((0, 0), dtype=np.float32), []
        dims = {o.vector.shape[0] for o in rows if o.vector is not None}
        if len(dims) > 1:
            # A window is per model key, so one dimension; guard against a mixed sample anyway.
            width = max(
                dims, key=lambda d: sum(1 for o in rows if o.vector is not None and o.vector.size == d)
            )
            rows = [o for o in rows if o.vector is not None and o.vector.shape[0] == width]
        matrix = np.stack([o.vector for o in rows if o.vector is not None]).astype(np.float32, copy=False)
        return matrix, [o.query or "" for o in rows]

    def texts(self) -> list[str]:
        """The query texts of observations that have one, in sample order."""
        return [o.query for o in self.observations if o.query]

    def scores(self, field: str) -> npt.NDArray[np.float64]:
        """`top1` or `topk` of every observation that has it."""
        if field not in ("top1", "topk"):
            raise ValueError(f"field must be 'top1' or 'topk', got {field!r}")
        values = [getattr(o, field) for o in self.observations]
        return np.array([v for v in values if v is not None], dtype=np.float64)

    def empty_flags(self) -> npt.NDArray[np.bool_]:
        return np.array([o.empty for o in self.observations if o.empty is not None], dtype=np.bool_)

    def hits(self) -> npt.NDArray[np.str_]:
        return np.array([o.hit for o in self.observations if o.hit is not None], dtype=str)


def merge_counts(
    seen_old: int, kept_old: int, seen_new: int, kept_new: int, capacity: int, rng: np.random.Generator
) -> tuple[int, int]:
    """How many (old, new) rows a merged bucket sample keeps, at most `capacity` in all.

    Old rows are a uniform sample of `seen_old` traces, new rows of `seen_new`
    later ones. Drawing the old share from the hypergeometric law keeps the
    merged sample uniform over all `seen_old + seen_new` traces. The in-memory
    reservoir of one flush may hold fewer rows than the bucket may keep, so
    the merged size is also capped where either side would be expected to
    give more rows than it holds (kept · total / seen): every trace of the
    bucket keeps the same chance of being in the sample, and a busy bucket
    grows towards `capacity` flush by flush. Raises ValueError when a kept
    count exceeds its seen count.
    """
    if capacity < 1:
        raise ValueError(f"capacity must be at least 1, got {capacity}")
    if not (0 <= kept_old <= seen_old and 0 <= kept_new <= seen_new):
        raise ValueError("kept counts must lie within 0..seen")
    total = seen_old + seen_new
    target = min(capacity, total, kept_old + kept_new)
    for seen, kept in ((seen_old, kept_old), (seen_new, kept_new)):
        if kept < seen:
            target = min(target, kept * total // seen)
    if target == kept_old + kept_new:
        return kept_old, kept_new
    if not (seen_old and seen_new):
        return (target, 0) if seen_old else (0, target)
    if kept_old == seen_old and kept_new == seen_new:
        # Both sides whole: the hypergeometric share is an exact uniform sample and never asks for more
        # rows than a side has.
        take_old = int(rng.hypergeometric(seen_old, seen_new, target))
        return take_old, target - take_old
    # A side is itself a sample: the proportional share, rounded at random, gives every trace the same
    # chance target/total and never exceeds what a side kept (target was capped for that above). A
    # hypergeometric draw clipped to the kept rows would favour the smaller side.
    exact = target * seen_old / total
    take_old = int(exact) + int(rng.random() < exact - int(exact))
    return take_old, target - take_old


def draw_counts(
    seen: Sequence[int], kept: Sequence[int], capacity: int, rng: np.random.Generator
) -> list[int]:
    """Rows to take from each bucket for a sample of at most `capacity` that is uniform over all traffic.

    Bucket i stands for `seen[i]` traces and holds `kept[i]` of them. The
    total n is capped so that no bucket is expected to give more rows than
    it holds (n · seen[i] / Σseen ≤ kept[i]); the per-bucket counts are then
    one multivariate hypergeometric draw, clipped to what each bucket holds.
    """
    if len(seen) != len(kept):
        raise ValueError("seen and kept must have the same length")
    if capacity < 1:
        raise ValueError(f"capacity must be at least 1, got {capacity}")
    total = int(sum(seen))
    if total == 0:
        return [0] * len(seen)
    limit = min(capacity, int(sum(kept)))
    for s, k in zip(seen, kept, strict=True):
        if s > k:
            limit = min(limit, int(k * total / s))
    limit = max(limit, 0)
    if limit == 0:
        return [0] * len(seen)
    counts = rng.multivariate_hypergeometric(np.asarray(seen, dtype=np.int64), limit)
    return [int(min(c, k)) for c, k in zip(counts, kept, strict=True)]
