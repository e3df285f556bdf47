"""What both faithfulness estimates (`estimate.py`, `corrected.py`) build their intervals from.

The normal quantile of a confidence level, Wilson's score interval (both use
it on Kish's effective sample size), and the variance below which a
linearization interval is a point, so that Wilson's is used instead.
"""

from __future__ import annotations

import math

__all__ = ["NEGLIGIBLE_VARIANCE", "check_confidence", "normal_quantile", "wilson"]

NEGLIGIBLE_VARIANCE = 1e-20
"""Equal scores (all 0.7, say) leave a variance of ~1e-33 from rounding where it is 0; below this a
linearization interval is narrower than 1e-10, a point."""


def check_confidence(confidence: float) -> None:
    """Raise ValueError unless `confidence` is in (0, 1)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")


def normal_quantile(confidence: float) -> float:
    """z such that a standard normal lies within ±z with probability `confidence` (checked)."""
    check_confidence(confidence)
    # SciPy here, not at the top: `service.config` imports this package, and with it every
    # `ragmon` command, which must not pay for importing SciPy (most of a second) to read its settings
    from scipy.stats import norm

    return float(norm.ppf(0.5 + confidence / 2.0))


def wilson(p: float, n: float, z: float) -> tuple[float, float]:
    """Wilson's score interval for a proportion `p` from `n` (effective) observations, inside [0, 1]."""
    z2n = z * z / n
    centre = (p + z2n / 2.0) / (1.0 + z2n)
    half = z / (1.0 + z2n) * math.sqrt(p * (1.0 - p) / n + z2n / (4.0 * n))
    return max(0.0, centre - half), min(1.0, centre + half)
