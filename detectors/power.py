"""What a drift test could have caught at a window's size: power estimates read off the bench's power curve.

A run that says "no drift" on 300 queries means less than one on 2,000, and
the user should see by how much. Computing the power for each window would
need a model of the shift; instead every run carries the power that
`bench/drift/run.py` measured for one named shift (a tenth of the window from
intents absent from the reference, on real query sets) at the window sizes
below, interpolated in log n. It is an estimate from benchmark data, and
says so: the `basis` names where it comes from and the `shift` what it is the
power against.

Guarantees: monotone in n between the measured sizes; below the smallest
measured size the value is an upper bound (`bound="at_most"`), above the
largest a lower bound (`bound="at_least"`): power only grows with n.
Detectors without a measured curve get None.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import JsonValue

__all__ = ["POWER_CURVES", "PowerCurve", "PowerEstimate", "estimated_power"]


@dataclass(frozen=True, slots=True)
class PowerCurve:
    """Power measured at window sizes (n, power, windows tried), with the reference size it held for."""

    detector: str
    shift: str
    n_reference: int
    alpha: float
    points: tuple[tuple[int, float, int], ...]
    basis: str


@dataclass(frozen=True, slots=True)
class PowerEstimate:
    """The power of a test at one window size against the curve's shift, and how it was obtained."""

    power: float
    n_window: int
    bound: Literal["interpolated", "at_most", "at_least"]
    shift: str
    basis: str

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "power": round(self.power, 3),
            "n_window": self.n_window,
            "bound": self.bound,
            "shift": self.shift,
            "basis": self.basis,
        }

    def describe(self) -> str:
        """One line for the plain CLI output, e.g. `power~0.95 (estimated, 10 % new intents)`."""
        sign = {"interpolated": "~", "at_most": "<=", "at_least": ">="}[self.bound]
        return (
            f"power{sign}{self.power:.2f} at n={self.n_window} against {self.shift} (estimated: {self.basis})"
        )


# Written from the recorded bench run (bench/RESULTS.md, drift section); the bench prints this table.
POWER_CURVES: dict[str, PowerCurve] = {
    "query_text_knn": PowerCurve(
        detector="query_text_knn",
        shift="10 % of queries from intents absent from the reference",
        n_reference=5000,
        alpha=0.05,
        points=((250, 0.79, 100), (500, 0.98, 100), (1000, 1.0, 100), (2000, 1.0, 200)),
        basis="bench/drift power curve of TextKnnDrift v2 (clinc150 new domains + banking77 new intent "
        "pairs, run.py --power, 2026-12-01)",
    ),
}


def estimated_power(detector: str, n_window: int, alpha: float | None = None) -> PowerEstimate | None:
    """The curve's power at `n_window`, or None without a curve (or for a curve at another alpha)."""
    curve = POWER_CURVES.get(detector)
    if curve is None or n_window < 1 or (alpha is not None and not math.isclose(alpha, curve.alpha)):
        return None
    sizes = [n for n, _, _ in curve.points]
    powers = [p for _, p, _ in curve.points]
    if n_window <= sizes[0]:
        bound: Literal["interpolated", "at_most", "at_least"] = (
            "interpolated" if n_window == sizes[0] else "at_most"
        )
        power = powers[0]
    elif n_window >= sizes[-1]:
        bound = "interpolated" if n_window == sizes[-1] else "at_least"
        power = powers[-1]
    else:
        bound = "interpolated"
        power = powers[-1]
        for i in range(len(sizes) - 1):
            (n0, p0), (n1, p1) = (sizes[i], powers[i]), (sizes[i + 1], powers[i + 1])
            if n0 <= n_window <= n1:
                weight = (math.log(n_window) - math.log(n0)) / (math.log(n1) - math.log(n0))
                power = p0 + weight * (p1 - p0)
                break
    return PowerEstimate(power=power, n_window=n_window, bound=bound, shift=curve.shift, basis=curve.basis)
