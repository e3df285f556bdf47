"""Regeneration-rate control band: a streaming p-chart for one app × intent, with exact binomial limits.

Each trace adds one observation (regenerated or not) to the current window.
The band for a window of n traces is the set of regeneration counts that an
equal-tailed exact binomial test at the baseline rate does not reject at
`alpha`, so the band is wider for small windows and narrows as n grows, and it
stays valid for rates near zero where the normal p-chart is not. `result()`
compares the open window with the band at any moment; `close_window()` ends
it and starts the next.

Baseline: the pooled counts of the last `baseline_windows` closed windows
that were in band (evicted by subtracting, never recomputed). A window that
closes out of band is not added, so the baseline stays frozen while the rate
is out of band and an incident cannot teach the band that it is normal.
Until the baseline holds `min_baseline` traces the monitor is warming up: it
never alarms and every closed window joins the baseline. The baseline rate is
(regenerations + 0.5) / (traces + 1), so a clean history does not make one
regeneration an alarm by itself.

The service keeps one monitor per (app, intent) and exports `lower`/`upper`
from `result().details` as metrics for alert rules.
"""

from __future__ import annotations

from collections import deque
from datetime import datetime
from typing import Any, ClassVar, Self

import numpy as np
import numpy.typing as npt
from scipy import special

from detectors.base import DetectorState, DriftResult, check_alpha, detector_params

__all__ = ["RegenerationBand", "binomial_band", "binomial_p_value"]


def _p_values(counts: npt.NDArray[np.int64], n: int, rate: float) -> npt.NDArray[np.float64]:
    # bdtr(k) = P(X <= k) and bdtrc(k) = P(X > k): SciPy's binomial ufuncs, far cheaper than stats.binom.
    lower_tail = special.bdtr(counts, n, rate)
    upper_tail = np.where(counts > 0, special.bdtrc(np.maximum(counts - 1, 0), n, rate), 1.0)
    return np.asarray(np.minimum(1.0, 2.0 * np.minimum(lower_tail, upper_tail)), dtype=np.float64)


def binomial_p_value(count: int, n: int, rate: float) -> float:
    """Equal-tailed exact binomial p-value of `count` of `n` at `rate`: twice the smaller tail, at most 1."""
    if n < 1:
        return 1.0
    return float(_p_values(np.array([count]), n, rate)[0])


def binomial_band(n: int, rate: float, alpha: float) -> tuple[int, int]:
    """The smallest and largest counts out of `n` whose `binomial_p_value` at `rate` exceeds `alpha`.

    Every count in between also exceeds it (the two tails are monotone), so
    the band is exactly the set of counts that do not alarm.
    """
    if n < 1:
        return 0, 0
    inside = np.flatnonzero(_p_values(np.arange(n + 1), n, rate) > alpha)
    if inside.size == 0:
        return 1, 0
    return int(inside[0]), int(inside[-1])


class RegenerationBand:
    """Streaming regeneration-rate monitor for one app × intent (see the module docstring)."""

    name: ClassVar[str] = "regeneration_band"
    version: ClassVar[str] = "1"

    def __init__(self, alpha: float = 0.01, baseline_windows: int = 24, min_baseline: int = 200) -> None:
        check_alpha(alpha)
        if baseline_windows < 1:
            raise ValueError(f"baseline_windows must be at least 1, got {baseline_windows}")
        if min_baseline < 1:
            raise ValueError(f"min_baseline must be at least 1, got {min_baseline}")
        self.alpha = alpha
        self.baseline_windows = baseline_windows
        self.min_baseline = min_baseline
        self._windows: deque[tuple[int, int]] = deque()
        self._baseline_regenerations = 0
        self._baseline_traces = 0
        self._regenerations = 0
        self._traces = 0
        self._start: datetime | None = None
        self._end: datetime | None = None
        self._frozen = False

    @property
    def baseline_rate(self) -> float:
        return (self._baseline_regenerations + 0.5) / (self._baseline_traces + 1)

    @property
    def warming_up(self) -> bool:
        return self._baseline_traces < self.min_baseline

    def band(self, n: int) -> tuple[float, float]:
        """Lower and upper regeneration-rate limits for a window of `n` traces at the current baseline."""
        if n < 1:
            return 0.0, 1.0
        lower, upper = binomial_band(n, self.baseline_rate, self.alpha)
        return lower / n, upper / n

    def update(self, value: bool, at: datetime | None = None) -> None:
        """Add one trace to the open window; `at` (its time) widens the window's time range."""
        if not isinstance(value, bool):
            raise TypeError(
                f"value must be a bool (is this trace a regeneration?), got {type(value).__name__}"
            )
        self._traces += 1
        self._regenerations += int(value)
        if at is not None:
            self._start = at if self._start is None or at < self._start else self._start
            self._end = at if self._end is None or at > self._end else self._end

    def result(self) -> DriftResult:
        """The open window against the band; never alarms while warming up or on an empty window."""
        n, count = self._traces, self._regenerations
        rate = self.baseline_rate
        p_value = binomial_p_value(count, n, rate) if n else 1.0
        lower, upper = self.band(n)
        # The band and the p-value come from the same test: a count is out of band exactly when p <= alpha.
        judged = n > 0 and not self.warming_up
        return DriftResult(
            detector=self.name,
            version=self.version,
            reference_id=None,
            window_start=self._start,
            window_end=self._end,
            n_reference=self._baseline_traces,
            n_window=n,
            statistic=count / n if n else 0.0,
            p_value=p_value,
            alpha=self.alpha,
            drifted=judged and p_value <= self.alpha,
            details={
                "statistic_name": "regeneration_rate",
                "baseline_rate": rate,
                "lower": lower,
                "upper": upper,
                "regenerations": count,
                "warming_up": self.warming_up,
                "baseline_frozen": self._frozen,
            },
        )

    def close_window(self) -> DriftResult:
        """End the open window and return its result; it joins the baseline only if in band (or warming)."""
        closing = self.result()
        if closing.n_window > 0:
            if closing.drifted:
                self._frozen = True
            else:
                self._frozen = False
                self._windows.append((self._regenerations, self._traces))
                self._baseline_regenerations += self._regenerations
                self._baseline_traces += self._traces
                while len(self._windows) > self.baseline_windows:
                    evicted_regenerations, evicted_traces = self._windows.popleft()
                    self._baseline_regenerations -= evicted_regenerations
                    self._baseline_traces -= evicted_traces
        self._regenerations = self._traces = 0
        self._start = self._end = None
        return closing

    def to_state(self) -> DetectorState:
        return {
            "params": detector_params(self),
            "windows": [list(window) for window in self._windows],
            "open": [self._regenerations, self._traces],
            "start": self._start,
            "end": self._end,
            "frozen": self._frozen,
        }

    @classmethod
    def from_state(cls, state: DetectorState) -> Self:
        monitor = cls(**state["params"])
        for regenerations, traces in state["windows"]:
            monitor._windows.append((int(regenerations), int(traces)))
            monitor._baseline_regenerations += int(regenerations)
            monitor._baseline_traces += int(traces)
        monitor._regenerations, monitor._traces = (int(x) for x in state["open"])
        monitor._start, monitor._end = state["start"], state["end"]
        monitor._frozen = bool(state["frozen"])
        return monitor

    def __repr__(self) -> str:
        params: dict[str, Any] = detector_params(self)
        return f"RegenerationBand({', '.join(f'{k}={v!r}' for k, v in params.items())})"
