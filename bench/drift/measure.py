"""Wall time and peak resident memory of one call, and binomial rates with exact intervals.

Peak memory is read from /proc/self/statm by a sampling thread (every 2 ms)
rather than from tracemalloc, because PyTorch (the peer) allocates outside
Python's allocator; both sides are measured the same way. It is the peak RSS
above the RSS just before the call.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from scipy import stats

__all__ = ["Measured", "Rate", "measure", "rate"]

T = TypeVar("T")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE


@dataclass(frozen=True)
class Measured:
    seconds: float
    peak_bytes: int


def measure(call: Callable[[], T]) -> tuple[T, Measured]:
    """Run `call` once; its result, wall time and peak RSS growth."""
    baseline = _rss()
    peak = [baseline]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _rss())
            stop.wait(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    try:
        result = call()
    finally:
        elapsed = time.perf_counter() - started
        stop.set()
        sampler.join()
    peak[0] = max(peak[0], _rss())
    return result, Measured(seconds=elapsed, peak_bytes=peak[0] - baseline)


@dataclass(frozen=True)
class Rate:
    hits: int
    trials: int
    low: float
    high: float

    @property
    def value(self) -> float:
        return self.hits / self.trials if self.trials else float("nan")

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}] ({self.hits}/{self.trials})"


def rate(hits: int, trials: int, confidence: float = 0.95) -> Rate:
    """The observed rate with its exact (Clopper–Pearson) confidence interval."""
    if trials == 0:
        return Rate(0, 0, float("nan"), float("nan"))
    interval = stats.binomtest(hits, trials).proportion_ci(confidence_level=confidence, method="exact")
    return Rate(hits, trials, float(interval.low), float(interval.high))


@dataclass
class Tally:
    """Alarms over trials of one test, with the time and peak memory of each trial."""

    alarms: int = 0
    trials: int = 0
    times: list[float] = field(default_factory=list)
    peaks: list[int] = field(default_factory=list)

    def add(self, drifted: bool, measured: Measured) -> None:
        self.alarms += int(drifted)
        self.trials += 1
        self.times.append(measured.seconds)
        self.peaks.append(measured.peak_bytes)

    def merge(self, other: Tally) -> None:
        self.alarms += other.alarms
        self.trials += other.trials
        self.times += other.times
        self.peaks += other.peaks
