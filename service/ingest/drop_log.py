"""What ingest says in its log about attribute values it dropped or truncated: once, then once per interval.

Every dropped value is counted (`ragmon_ingest_rejected_total{reason}`) and
every truncated one (`ragmon_ingest_truncated_values_total`), and the OTLP
answer names them to the sender; the log is for the operator who wants to know
which app sends them. One client that sends a bad value in every span must not
flood it, so `DropLog` writes the first at once, and after that at most one
line per `every_s`, saying how many more there were and naming the latest.

A line names where the value was (`span <trace id>/<span id>`, or a log
record's or resource's position), its attribute key (cut to 100 characters)
and the reason; never the value: attribute values are the app's data (queries,
answers, documents).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from service.ingest.decoded import DecodedBatch
from service.throttled_log import REPORT_EVERY_S, ThrottledLog

__all__ = ["REPORT_EVERY_S", "DropLog"]

_KEY_CHARS = 100


class DropLog(ThrottledLog):
    """The log lines of one process's dropped and truncated attribute values (see the module
    docstring). Not thread-safe: the event loop reports to it."""

    def __init__(
        self,
        log: logging.Logger,
        *,
        every_s: float = REPORT_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(log, every_s=every_s, clock=clock)
        self.unsaid = 0  # values dropped or truncated since the last line

    def note(self, decoded: DecodedBatch) -> None:
        """Report what one request (or one build) dropped and truncated, if anything."""
        count = decoded.dropped + decoded.truncated
        if not count:
            return
        self.unsaid += count
        now = self.clock()
        if not self.due(now):
            return
        where, key, reason = decoded.drops[-1] if decoded.drops else ("?", "?", "?")
        shown = key if len(key) <= _KEY_CHARS else f"{key[:_KEY_CHARS]}..."
        if self.said_at is None:
            self.log.warning(
                "ingest dropped or truncated %d attribute value%s, e.g. %r of %s (%s); such values are "
                "counted in ragmon_ingest_rejected_total and ragmon_ingest_truncated_values_total, "
                "and logged at most once per %.0f s",
                count,
                "" if count == 1 else "s",
                shown,
                where,
                reason,
                self.every_s,
            )
        else:
            self.log.warning(
                "ingest dropped or truncated %d attribute value%s in the last %.0f s; latest: %r of %s (%s)",
                self.unsaid,
                "" if self.unsaid == 1 else "s",
                now - self.said_at,
                shown,
                where,
                reason,
            )
        self.said_at = now
        self.unsaid = 0
