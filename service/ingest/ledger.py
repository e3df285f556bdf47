"""`AckLedger`: which acknowledged records are not stored yet, and so how much of the log must stay.

Every accepted request holds the keys it brought (a trace's `(tenant, trace_id)`,
a feedback event's `("feedback", tenant, event_id)`) at its log sequence
number. The watermark, the lowest sequence number still held, says that
every log record below it reached its end: `WriteAheadLog.release_below`
deletes those segments.

A trace is flushed by the span assembler and built, maybe several times:
spans that arrive after a flush complete the stored trace with a later
version (service/assemble.py). So the holds of a trace are kept per version:
when the assembler takes the trace (`taken`), the requests holding it so far
belong to that version; requests that bring more of its spans later hold it
for the next one. An end (`done`: stored, dead-lettered, dropped as not a
request or as too late, failed to build) lets go of the oldest version's
requests only, so a version stored never lets go of spans acknowledged after
it was taken and not yet merged into the stored trace (a SIGKILL between
the two then replays them). Versions of one trace end in the order they were
taken (the assembler hands them on in order, the bus delivers in order); were
one to end first, letting go of the oldest instead only keeps more of the
log, never less. A key never taken (a JSON-API trace, a feedback event) is
let go of whole by its end.

Memory: one entry per trace or event in flight, bounded by the bus capacity
and the assembler's buffer.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Hashable, Iterable

__all__ = ["AckLedger", "Key"]

Key = Hashable


class _Entry:
    __slots__ = ("held", "lowest", "versions")

    def __init__(self) -> None:
        self.held: list[int] = []  # requests whose spans are not taken yet
        self.versions: deque[list[int]] = deque()  # the requests of each version taken, oldest first
        self.lowest = -1

    def compute_lowest(self) -> int:
        seqs = [*self.held, *(seq for version in self.versions for seq in version)]
        return min(seqs) if seqs else -1


class AckLedger:
    """Keys held by acknowledged requests not yet stored, with the lowest log seq holding each."""

    def __init__(self) -> None:
        self._held: dict[Key, _Entry] = {}
        self._heap: list[tuple[int, int, Key]] = []  # (seq, tie-breaker, key), stale entries skipped
        self._pushed = 0

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, keys: Iterable[Key], seq: int) -> None:
        """The request logged at `seq` brought these keys (each once)."""
        for key in keys:
            entry = self._held.get(key)
            if entry is None:
                entry = self._held[key] = _Entry()
            entry.held.append(seq)
            if entry.lowest < 0 or seq < entry.lowest:
                entry.lowest = seq
                self._push(seq, key)

    def taken(self, keys: Iterable[Key]) -> None:
        """These traces were taken for a version: the requests holding them now belong to it."""
        for key in keys:
            entry = self._held.get(key)
            if entry is None:
                entry = self._held[key] = _Entry()
            entry.versions.append(entry.held)
            entry.held = []

    def done(self, keys: Iterable[Key]) -> None:
        """The oldest version of each key reached its end (a key given twice: two versions); a key
        never taken is let go of whole."""
        for key in keys:
            entry = self._held.get(key)
            if entry is None:
                continue
            if entry.versions:
                entry.versions.popleft()
            else:
                entry.held = []
            if not entry.held and not entry.versions:
                del self._held[key]
                continue
            lowest = entry.compute_lowest()
            if lowest != entry.lowest:
                entry.lowest = lowest
                if lowest >= 0:
                    self._push(lowest, key)

    def open_below(self, seq: int) -> list[Key]:
        """Keys whose requests not yet taken include one logged below `seq`: traces open for long,
        whose spans `rehold` can move to one record logged again."""
        return [key for key, entry in self._held.items() if entry.held and min(entry.held) < seq]

    def open_holds(self, key: Key) -> list[int]:
        """The requests holding `key` that are not taken yet (their spans are open in the assembler)."""
        entry = self._held.get(key)
        return list(entry.held) if entry is not None else []

    def rehold(self, key: Key, old: list[int], new: list[int]) -> bool:
        """The requests `old` of `key` are logged again as `new` (their spans, in one or two records):
        `new` takes their place, wherever they are now (still open, or taken by a version since).
        False, and nothing held, when they are gone (that version ended meanwhile)."""
        entry = self._held.get(key)
        if entry is None:
            return False
        for bucket in (entry.held, *entry.versions):
            remaining = list(bucket)
            try:
                for seq in old:
                    remaining.remove(seq)
            except ValueError:
                continue
            bucket[:] = [*remaining, *new]
            lowest = entry.compute_lowest()
            if lowest != entry.lowest:
                entry.lowest = lowest
                self._push(lowest, key)
            return True
        return False

    def watermark(self, next_seq: int) -> int:
        """The lowest seq still held, or `next_seq` when nothing is: every record below is stored."""
        heap = self._heap
        while heap:
            seq, _, key = heap[0]
            entry = self._held.get(key)
            if entry is not None and entry.lowest == seq:
                return seq
            heapq.heappop(heap)  # let go of, or held at another seq since
        return next_seq

    def _push(self, seq: int, key: Key) -> None:
        self._pushed += 1
        heapq.heappush(self._heap, (seq, self._pushed, key))
