"""What a process says about a dependency it cannot reach: once when it goes, then once per interval.

A client that retries with backoff fails many times a minute while a broker or a database is down;
a line per failure buries everything else in the log (a worker without Kafka once printed 140 lines
in 45 s). `OutageLog` turns the failures into one warning when the outage starts, at most one line
per `every_s` while it lasts (how long, how many retries, the latest error: `ThrottledLog`) and one
info line when the dependency answers again. Counting is the caller's job (metrics); this is only
the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from service.throttled_log import REPORT_EVERY_S, ThrottledLog

__all__ = ["REPORT_EVERY_S", "OutageLog"]


class OutageLog(ThrottledLog):
    """The log lines of one dependency's outages (see the module docstring). Not thread-safe: one
    loop reports to it."""

    def __init__(
        self,
        log: logging.Logger,
        what: str,
        *,
        every_s: float = REPORT_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(log, every_s=every_s, clock=clock)
        self.what = what
        self.since: float | None = None  # when the outage began; None while reachable
        self.retries = 0

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, error: BaseException | str) -> None:
        """One failed attempt: logs the outage's start, or a progress line once `every_s` has passed."""
        now = self.clock()
        if self.since is None:
            self.since, self.said_at, self.retries = now, now, 0
            self.log.warning(
                "%s is unreachable (%s); retrying with backoff, next report in %.0f s",
                self.what,
                error,
                self.every_s,
            )
            return
        self.retries += 1
        if self.due(now):
            self.said_at = now
            self.log.warning(
                "%s still unreachable after %.0f s and %d retries (%s)",
                self.what,
                now - self.since,
                self.retries,
                error,
            )

    def recovered(self) -> None:
        """A successful attempt: logs the outage's end, if there was one (a no-op otherwise)."""
        if self.since is None:
            return
        self.log.info(
            "%s is reachable again after %.0f s and %d retries",
            self.what,
            self.clock() - self.since,
            self.retries,
        )
        self.since = None
        self.retries = 0
