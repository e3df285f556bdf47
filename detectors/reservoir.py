"""A bounded, uniformly sampled drift window: reservoir sampling with Li's Algorithm L.

However much traffic arrives, the window holds at most `capacity` items, and
after n offers every subset of min(n, capacity) items is equally likely to be
the one held (a uniform sample without replacement). Algorithm L draws how
many items to skip instead of a random number per item, so an offer that is
skipped costs one comparison. The window also tracks the time range of every
item offered, which is the range the sample represents.

Guarantees: memory is `capacity` items plus O(1); results depend only on the
offered sequence and `seed`; `to_state()` / `from_state()` resume the exact
same random sequence, so a restarted worker samples as if it never stopped.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Generic, Self, TypeVar

import numpy as np

from detectors.base import DetectorState, detector_params

__all__ = ["Reservoir"]

T = TypeVar("T")


class Reservoir(Generic[T]):
    """Uniform sample of at most `capacity` items from an unbounded stream (Algorithm L)."""

    def __init__(self, capacity: int, seed: int = 0) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._items: list[T] = []
        self._seen = 0
        self._weight = 1.0
        self._next = 0
        self._start: datetime | None = None
        self._end: datetime | None = None

    @property
    def seen(self) -> int:
        """How many items were offered in total."""
        return self._seen

    @property
    def items(self) -> list[T]:
        """A copy of the sample, in slot order (not arrival order)."""
        return list(self._items)

    @property
    def start(self) -> datetime | None:
        return self._start

    @property
    def end(self) -> datetime | None:
        return self._end

    def __len__(self) -> int:
        return len(self._items)

    def _uniform(self) -> float:
        # (0, 1]: log(0) must never happen.
        return 1.0 - float(self._rng.random())

    def _schedule_next(self) -> None:
        self._weight *= math.exp(math.log(self._uniform()) / self.capacity)
        skip = math.floor(math.log(self._uniform()) / math.log1p(-self._weight)) if self._weight < 1.0 else 0
        self._next += skip + 1

    def offer(self, item: T, at: datetime | None = None) -> bool:
        """Offer one item; True when it was taken into the sample."""
        if at is not None:
            self._start = at if self._start is None or at < self._start else self._start
            self._end = at if self._end is None or at > self._end else self._end
        index = self._seen
        self._seen += 1
        if index < self.capacity:
            self._items.append(item)
            if self._seen == self.capacity:
                self._next = self.capacity - 1
                self._schedule_next()
            return True
        if index != self._next:
            return False
        self._items[int(self._rng.integers(self.capacity))] = item
        self._schedule_next()
        return True

    def to_state(self) -> DetectorState:
        """Parameters, the sample, the counters and the random generator's exact position."""
        return {
            "params": detector_params(self),
            "items": list(self._items),
            "seen": self._seen,
            "weight": self._weight,
            "next": self._next,
            "start": self._start,
            "end": self._end,
            "rng": self._rng.bit_generator.state,
        }

    @classmethod
    def from_state(cls, state: DetectorState) -> Self:
        reservoir = cls(**state["params"])
        reservoir._items = list(state["items"])
        reservoir._seen = int(state["seen"])
        reservoir._weight = float(state["weight"])
        reservoir._next = int(state["next"])
        reservoir._start, reservoir._end = state["start"], state["end"]
        reservoir._rng.bit_generator.state = state["rng"]
        return reservoir

    def clear(self) -> None:
        """Empty the sample and counters; the random sequence continues (no seed reuse across windows)."""
        self._items = []
        self._seen = 0
        self._weight = 1.0
        self._next = 0
        self._start = self._end = None
