"""The small interfaces between pipeline stages (STYLE.md §1).

A stage receives a batch and either returns (accepted: the caller may forget
the batch) or raises a `RagmonError` (refused: `PermanentError` means the same
batch will always fail, `RetryableError` means try again later). A stage never
mutates a batch it received; `RagTrace` and `Feedback` are frozen, and `Span`
batches are handed on, not edited.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from service.conventions.spans import Span
from service.model import Feedback, RagTrace


class SpanConsumer(Protocol):
    async def consume_spans(self, batch: Sequence[Span]) -> None: ...


class TraceConsumer(Protocol):
    async def consume_traces(self, batch: Sequence[RagTrace]) -> None: ...


class FeedbackConsumer(Protocol):
    async def consume_feedback(self, batch: Sequence[Feedback]) -> None: ...


class RecordConsumer(TraceConsumer, FeedbackConsumer, Protocol):
    """Takes both record kinds (the bus, and processors in front of it)."""
