"""`ReaskDetector`: marks implicit regenerations, a user asking nearly the same question again.

"Near-identical" is decided on normalized word sets: lower-case, Unicode
word characters only, a short stop-word list removed; two queries are
near-identical when the Jaccard similarity of their word sets is at least
`similarity` (default 0.8: "how do I reset my password" and "how do I reset
my password?" or "how can I reset my password" match; "reset my password" and
"change my email" do not). Only queries in the same session, at most
`window_s` apart, are compared. The first of the pair is left alone; the
re-ask is marked `is_regeneration=True, regeneration_source="reask"` unless
the app already flagged it.

Memory is bounded: the last query of at most `max_sessions` sessions (LRU).
Traces arrive roughly in completion order; a re-ask whose earlier question
completes later is not detected (documented limitation).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence

from service.config import RegenerationConfig
from service.consumer import RecordConsumer
from service.model import Feedback, RagTrace

_WORD = re.compile(r"\w+", re.UNICODE)
_STOP_WORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "is",
        "are",
        "was",
        "were",
        "be",
        "to",
        "of",
        "in",
        "on",
        "for",
        "and",
        "or",
        "at",
        "by",
        "with",
        "do",
        "does",
        "did",
        "i",
        "my",
        "me",
        "you",
        "your",
        "it",
        "this",
        "that",
        "please",
        "can",
        "could",
        "would",
        "should",
    ]
)


def query_words(text: str) -> frozenset[str]:
    """The normalized word set used to compare queries."""
    words = {w for w in _WORD.findall(text.lower())}
    content = words - _STOP_WORDS
    return frozenset(content or words)


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


class ReaskDetector:
    """Processor between assembly and the bus: passes every trace and feedback event on, marking re-asks.

    A user who clicks "regenerate" on answer A and then gets answer B to the
    same question made one regeneration, not two: the `regenerate` feedback on
    A already counts it, so B is not marked as a re-ask of A. Feedback for A
    that arrives after B was passed on cannot undo B's mark (documented limit).
    """

    def __init__(self, config: RegenerationConfig, next: RecordConsumer) -> None:
        self.config = config
        self.next = next
        self._last: OrderedDict[tuple[str, str], tuple[float, frozenset[str], str]] = OrderedDict()
        self._regenerated: OrderedDict[tuple[str, str], None] = OrderedDict()

    def _mark(self, trace: RagTrace) -> RagTrace:
        if not trace.session_id or not trace.query or self.config.window_s <= 0:
            return trace
        key = (trace.tenant, trace.session_id)
        words = query_words(trace.query)
        at = trace.start_time.timestamp()
        previous = self._last.get(key)
        self._last[key] = (at, words, trace.trace_id)
        self._last.move_to_end(key)
        if len(self._last) > self.config.max_sessions:
            self._last.popitem(last=False)
        if previous is None or trace.is_regeneration:
            return trace
        previous_at, previous_words, previous_id = previous
        if previous_id == trace.trace_id:
            return trace  # a later version of the same trace (its late spans arrived), not a re-ask
        if (trace.tenant, previous_id) in self._regenerated:
            return trace  # counted once already, by the regenerate feedback on the previous answer
        near = jaccard(words, previous_words) >= self.config.similarity
        if 0 <= at - previous_at <= self.config.window_s and near:
            return trace.model_copy(update={"is_regeneration": True, "regeneration_source": "reask"})
        return trace

    async def consume_traces(self, batch: Sequence[RagTrace]) -> None:
        ordered = sorted(batch, key=lambda t: t.start_time)
        await self.next.consume_traces([self._mark(t) for t in ordered])

    async def consume_feedback(self, batch: Sequence[Feedback]) -> None:
        for event in batch:
            if event.kind == "regenerate":
                self._regenerated[(event.tenant, event.trace_id)] = None
                if len(self._regenerated) > self.config.max_sessions:
                    self._regenerated.popitem(last=False)
        await self.next.consume_feedback(batch)
