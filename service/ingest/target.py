"""`IngestTarget`: what the receivers hand accepted input to, and the dependency that finds it.

The pipeline (`service/pipeline.py`) implements it. Receivers know only this
interface, so ingest never imports the pipeline that wires it: imports run one
way. Returning from an `accept_*` method means accepted; each raises
`QueueFull` (503 + Retry-After) when the pipeline cannot take more.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Protocol

from fastapi import Depends, Request

from service.config import RagmonConfig
from service.conventions.pricing import PriceTable
from service.conventions.spans import AnySpan, LogEvent
from service.ingest.decoded import DecodedBatch
from service.ingest.pool import IngestPool
from service.ingest.wal import LoggedRequest
from service.metrics import Metrics
from service.model import Feedback, RagTrace

__all__ = ["IngestDep", "IngestTarget", "RequestTee"]


class RequestTee(Protocol):
    """Where an accepted OTLP request is copied as-is (the Phoenix tee); never blocks, never raises."""

    def offer(self, body: bytes, content_type: str, content_encoding: str = "") -> bool: ...


class IngestTarget(Protocol):
    """The receivers' next consumer: room checks, decoding workers, and the three kinds of input."""

    @property
    def config(self) -> RagmonConfig: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def prices(self) -> PriceTable: ...

    @property
    def ingest_pool(self) -> IngestPool: ...

    @property
    def phoenix_forward(self) -> RequestTee: ...

    def check_room(self) -> None:
        """Raise `QueueFull` now if nothing more can be taken, before any decoding work."""

    async def accept_spans(
        self, spans: Sequence[AnySpan], receiver: str, logged: LoggedRequest | None = None
    ) -> None:
        """Take a request's spans; `logged` is the request as received, for the write-ahead log."""

    async def accept_decoded(
        self, decoded: DecodedBatch, receiver: str, logged: LoggedRequest | None = None
    ) -> None:
        """Take a decoded request (`IngestPool.decode`'s answer): its spans, or the spans-topic
        records its decoder encoded them into."""

    async def accept_log_events(
        self, events: Sequence[LogEvent], receiver: str, logged: LoggedRequest | None = None
    ) -> None: ...

    async def accept_traces(self, traces: Sequence[RagTrace]) -> None: ...

    async def accept_feedback(self, events: Sequence[Feedback]) -> None: ...


async def _target(request: Request) -> IngestTarget:  # async: no thread-pool hop (auth._tenant)
    target: IngestTarget = request.app.state.pipeline
    return target


IngestDep = Annotated[IngestTarget, Depends(_target)]
