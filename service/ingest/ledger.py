"""`AckLedger`: which acknowledged records are not stored yet, and so how much of the log must stay.

Every accepted request holds the keys it brought (a trace's `(tenant, trace_id)`,
a feedback event's `("feedback", tenant, event_id)`) at its log sequence
number. A key is let go when its record reached an end: stored (the bus's
delivery to the store sink returned), dead-lettered, dropped as not a request,
or failed to build. The watermark, the lowest sequence number still held, says
that every log record below it is stored: `WriteAheadLog.release_below` deletes
those segments.

A key held by several requests (spans of one trace in two exports) keeps the
lowest sequence number and a count of holders. Spans that arrive after their
trace was handed on are dropped by the assembler as late: that lets go of the
one hold of that request only (`late`), since the trace itself may still be on
its way to the store. An end (`done`) lets go of the key whatever its count.
Memory: one entry per trace or event in flight, bounded by the bus capacity and
the assembler's buffer.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable

__all__ = ["AckLedger", "Key"]

Key = Hashable


class AckLedger:
    """Keys held by acknowledged requests not yet stored, with the lowest log seq holding each."""

    def __init__(self) -> None:
        self._held: dict[Key, list[int]] = {}  # key -> [lowest seq, holders]
        self._heap: list[tuple[int, int, Key]] = []  # (seq, tie-breaker, key), stale entries skipped
        self._pushed = 0

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, keys: Iterable[Key], seq: int) -> None:
        """The request logged at `seq` brought these keys (each once)."""
        for key in keys:
            entry = self._held.get(key)
            if entry is None:
                self._held[key] = [seq, 1]
                self._push(seq, key)
            else:
                entry[1] += 1
                if seq < entry[0]:
                    entry[0] = seq
                    self._push(seq, key)

    def late(self, key: Key) -> None:
        """One request's spans of `key` were dropped as late: that request no longer holds it."""
        entry = self._held.get(key)
        if entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                del self._held[key]

    def done(self, keys: Iterable[Key]) -> None:
        """These records reached their end (stored, dead-lettered, dropped): nothing holds them now."""
        for key in keys:
            self._held.pop(key, None)

    def watermark(self, next_seq: int) -> int:
        """The lowest seq still held, or `next_seq` when nothing is: every record below is stored."""
        heap = self._heap
        while heap:
            seq, _, key = heap[0]
            entry = self._held.get(key)
            if entry is not None and entry[0] == seq:
                return seq
            heapq.heappop(heap)  # let go of, or held at a lower seq since
        return next_seq

    def _push(self, seq: int, key: Key) -> None:
        self._pushed += 1
        heapq.heappush(self._heap, (seq, self._pushed, key))
