"""A log for a condition that repeats: its first line at once, then at most one line per interval.

One client that sends a bad value in every span, or a retry loop against a broker that is down,
would otherwise write a line per event and bury everything else in the log. `ThrottledLog` keeps
the interval and when the last line was written; `DropLog` (`ingest/drop_log.py`: dropped and
truncated attribute values) and `OutageLog` (`bus/outage_log.py`: a dependency out of reach) say
what their lines say. Counting is the callers' job (metrics); this is only the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["REPORT_EVERY_S", "ThrottledLog"]

REPORT_EVERY_S = 30.0
"""While a condition lasts, ragmon says so once, then at most once per this many seconds."""


class ThrottledLog:
    """The clock and the pacing of one throttled log (see the module docstring). Not thread-safe:
    one loop reports to it."""

    def __init__(
        self,
        log: logging.Logger,
        *,
        every_s: float = REPORT_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if every_s <= 0:
            raise ValueError(f"every_s must be positive, got {every_s}")
        self.log = log
        self.every_s = every_s
        self.clock = clock
        self.said_at: float | None = None  # when the last line was written; None before the first

    def due(self, now: float) -> bool:
        """Whether a line may be written at `now`: none was yet, or the last is `every_s` old."""
        return self.said_at is None or now - self.said_at >= self.every_s
