"""Recording implementations of the stage interfaces, to test one stage alone (STYLE.md §1)."""

from __future__ import annotations

from collections.abc import Sequence

from service.conventions.spans import Span
from service.errors import RagmonError
from service.model import Feedback, RagTrace


class SinkConsumer:
    """Accepts everything and keeps it, in arrival order."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.traces: list[RagTrace] = []
        self.feedback: list[Feedback] = []
        self.batches = 0

    async def consume_spans(self, batch: Sequence[Span]) -> None:
        self.batches += 1
        self.spans.extend(batch)

    async def consume_traces(self, batch: Sequence[RagTrace]) -> None:
        self.batches += 1
        self.traces.extend(batch)

    async def consume_feedback(self, batch: Sequence[Feedback]) -> None:
        self.batches += 1
        self.feedback.extend(batch)


class ErrorConsumer(SinkConsumer):
    """Raises `exc` for the first `times` calls (always when times is None), then records."""

    def __init__(self, exc: RagmonError, times: int | None = None) -> None:
        super().__init__()
        self.exc = exc
        self.times = times
        self.calls = 0

    def _maybe_raise(self) -> None:
        self.calls += 1
        if self.times is None or self.calls <= self.times:
            raise self.exc

    async def consume_spans(self, batch: Sequence[Span]) -> None:
        self._maybe_raise()
        await super().consume_spans(batch)

    async def consume_traces(self, batch: Sequence[RagTrace]) -> None:
        self._maybe_raise()
        await super().consume_traces(batch)

    async def consume_feedback(self, batch: Sequence[Feedback]) -> None:
        self._maybe_raise()
        await super().consume_feedback(batch)
