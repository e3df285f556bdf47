"""Wire schemas of the plain JSON API (`POST /api/v1/traces`, `POST /api/v1/feedback`).

These are what apps without OpenTelemetry send; they are kept apart from
`RagTrace` (the internal record) and from the store's rows. Validation is
strict: NaN and infinite numbers, negative durations and token counts, and
malformed trace ids are refused with a message naming the field.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from service.model import TRACE_ID_PATTERN, FeedbackKind

_Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_Finite = Annotated[float, Field(allow_inf_nan=False)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ChunkIn(_In):
    id: str = Field(min_length=1)
    score: _Finite | None = None
    content: str | None = None
    metadata: dict[str, JsonValue] | None = None


class RetrievalIn(_In):
    retriever: str | None = None
    k: int | None = Field(default=None, ge=0)
    chunks: list[ChunkIn] = Field(default_factory=list, description="in rank order, best first")
    filter: str | None = None
    excluded_ids: list[str] = Field(default_factory=list)
    reranked: list[ChunkIn] = Field(default_factory=list, description="reranker output, best first, if any")


class EmbeddingIn(_In):
    model: str | None = None
    vector: list[_Finite] = Field(min_length=1)


class TimingsIn(_In):
    total_s: _Seconds | None = None
    embedding_s: _Seconds | None = None
    retrieval_s: _Seconds | None = None
    rerank_s: _Seconds | None = None
    generation_s: _Seconds | None = None
    ttft_s: _Seconds | None = None


class UsageIn(_In):
    model: str = Field(min_length=1)
    kind: Literal["llm", "embedding", "reranker"] = "llm"
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cost_usd: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = Field(
        default=None, description="the app's own cost; wins over ragmon's price table"
    )


class TraceIn(_In):
    """One RAG request as an app without OpenTelemetry reports it."""

    trace_id: str = Field(
        pattern=TRACE_ID_PATTERN, description="32 lower-case hex digits; the idempotency key"
    )
    app: str = Field("unknown", min_length=1, max_length=200)
    release: str | None = None
    intent: str | None = None
    session_id: str | None = None
    user_id: str | None = Field(
        default=None, description="hashed with SHA-256 on arrival; never stored as sent"
    )
    start_time: datetime | None = Field(default=None, description="default: time of arrival")
    query: str | None = None
    query_embedding: EmbeddingIn | None = None
    retrieval: RetrievalIn | None = None
    answer: str | None = None
    cited_chunk_ids: list[str] = Field(default_factory=list)
    timings: TimingsIn = TimingsIn()
    usage: list[UsageIn] = Field(default_factory=list)
    is_regeneration: bool = False
    probe_run_id: str | None = None
    probe_question_id: str | None = None


class TraceBatchIn(_In):
    traces: list[JsonValue] = Field(min_length=1, description="TraceIn records; each is validated on its own")


class RejectedRecord(BaseModel):
    index: int
    error: str


class TraceBatchOut(BaseModel):
    accepted: int
    rejected: list[RejectedRecord]


class FeedbackIn(_In):
    """A user's reaction to an answer: thumbs up/down, or a request to regenerate it."""

    trace_id: str = Field(pattern=TRACE_ID_PATTERN)
    kind: FeedbackKind = Field(description="up | down | regenerate")
    reason: str | None = Field(
        default=None, max_length=100, description="reason category, e.g. wrong, incomplete"
    )
    text: str | None = Field(default=None, max_length=10_000)
    event_id: str | None = Field(
        default=None, max_length=200, description="send one to make retries safe: the same id is stored once"
    )
    app: str | None = None
    time: datetime | None = None

    def resolved_event_id(self) -> str:
        return self.event_id or uuid.uuid4().hex

    def resolved_time(self) -> datetime:
        return self.time or datetime.now(UTC)


class FeedbackOut(BaseModel):
    accepted: int


def hash_user_id(user_id: str | None) -> str | None:
    return hashlib.sha256(user_id.encode()).hexdigest() if user_id else None
