"""Wire schemas of the plain JSON API (`POST /api/v1/traces`, `POST /api/v1/feedback`).

These are what apps without OpenTelemetry send; they are kept apart from
`RagTrace` (the internal record) and from the store's rows. Validation is
strict: NaN and infinite numbers, negative durations and token counts, and
malformed trace ids are refused with a message naming the field.

Every number, string, time and vector is also held to the limits the OTLP
decoder uses (the table in `service/ingest/otlp.py`): a record that passes
here can be stored, counted and dated without overflowing anything after
ingest (a token count of 10**30 once passed here and failed the whole bus
batch at insert). `rejection_reason` names the `RejectReason` of a record's
first error, for `ragmon_ingest_rejected_total{reason}`. A record within
every field's limit whose whole trace is over `span_size.MAX_SPAN_BYTES`
stored (what one Kafka record carries) is rejected alone as well, `too_large`,
in either mode (`http_receivers.ingest_json_traces`).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, ValidationError
from pydantic_core import PydanticCustomError

from service.ingest.otlp import (
    MAX_COST_USD,
    MAX_COUNT,
    MAX_IDENTIFIER_CHARS,
    MAX_SECONDS,
    MAX_TEXT_CHARS,
    MAX_TIME_NS,
    MAX_VECTOR_LENGTH,
)
from service.labels import RejectReason
from service.model import TRACE_ID_PATTERN, FeedbackKind

__all__ = [
    "EARLIEST_TIME",
    "LATEST_TIME",
    "MAX_METADATA_DEPTH",
    "ChunkIn",
    "EmbeddingIn",
    "FeedbackIn",
    "FeedbackOut",
    "RejectedRecord",
    "RetrievalIn",
    "TimeInRange",
    "TimingsIn",
    "TraceBatchIn",
    "TraceBatchOut",
    "TraceIn",
    "UsageIn",
    "hash_user_id",
    "rejection_reason",
]

EARLIEST_TIME = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_TIME = EARLIEST_TIME + timedelta(microseconds=MAX_TIME_NS // 1000)
"""The times a record may carry: what OTLP's nanoseconds since 1970 hold in a signed 64 bits."""
MAX_METADATA_DEPTH = 32
"""How deeply a chunk's metadata may nest (objects and arrays); the store walks it recursively."""
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _in_time_range(value: datetime) -> datetime:
    """`value` unchanged, if it lies within EARLIEST_TIME..LATEST_TIME (a naive value is UTC)."""
    try:
        utc = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:  # year 1 at +05:00 is before year 1 in UTC: no datetime holds it
        utc = None
    if utc is None or not EARLIEST_TIME <= utc <= LATEST_TIME:
        raise PydanticCustomError(
            "invalid_time",
            "time {value} is outside the range ragmon keeps, {earliest} to {latest}",
            {"value": str(value), "earliest": EARLIEST_TIME.isoformat(), "latest": LATEST_TIME.isoformat()},
        )
    return value


def _bounded_json(value: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """`value` unchanged, if it nests at most MAX_METADATA_DEPTH deep and each key, string and
    integer in it is within the limits (integers: 64 bits, what JSON readers and orjson take)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_METADATA_DEPTH:
                raise PydanticCustomError(
                    "out_of_range", "nested more than {limit} levels deep", {"limit": MAX_METADATA_DEPTH}
                )
            children: Iterable[Any] = item
            if isinstance(item, dict):
                for key in item:
                    if len(key) > MAX_IDENTIFIER_CHARS:
                        raise _too_long("a key", len(key), MAX_IDENTIFIER_CHARS)
                children = item.values()
            stack.extend((child, depth + 1) for child in children)
        elif isinstance(item, str):
            if len(item) > MAX_TEXT_CHARS:
                raise _too_long("a string", len(item), MAX_TEXT_CHARS)
        elif isinstance(item, int) and not isinstance(item, bool) and not _INT64_MIN <= item <= _INT64_MAX:
            raise PydanticCustomError("out_of_range", "an integer is outside the signed 64-bit range")
    return value


def _too_long(what: str, chars: int, limit: int) -> PydanticCustomError:
    return PydanticCustomError(
        "string_too_long",
        "{what} of {chars} characters is over the limit of {limit}",
        {"what": what, "chars": chars, "limit": limit},
    )


_Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
_Finite = Annotated[float, Field(allow_inf_nan=False)]
_Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
_Id = Annotated[str, Field(max_length=MAX_IDENTIFIER_CHARS)]
_Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
TimeInRange = Annotated[datetime, AfterValidator(_in_time_range)]
"""A time ragmon can store and compute with (EARLIEST_TIME..LATEST_TIME); any other is a 422 naming the
field (`invalid_time`), for request bodies and query parameters alike: year 1 or 9999 once reached
date arithmetic and answered 500 (OverflowError)."""
_Metadata = Annotated[dict[str, JsonValue], AfterValidator(_bounded_json)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ChunkIn(_In):
    id: str = Field(min_length=1, max_length=MAX_IDENTIFIER_CHARS)
    score: _Finite | None = None
    content: _Text | None = None
    metadata: _Metadata | None = None


class RetrievalIn(_In):
    retriever: _Id | None = None
    k: _Count | None = None
    chunks: list[ChunkIn] = Field(default_factory=list, description="in rank order, best first")
    filter: _Text | None = None
    excluded_ids: list[_Id] = Field(default_factory=list)
    reranked: list[ChunkIn] = Field(default_factory=list, description="reranker output, best first, if any")


class EmbeddingIn(_In):
    model: _Id | None = None
    vector: list[_Finite] = Field(min_length=1, max_length=MAX_VECTOR_LENGTH)


class TimingsIn(_In):
    total_s: _Seconds | None = None
    embedding_s: _Seconds | None = None
    retrieval_s: _Seconds | None = None
    rerank_s: _Seconds | None = None
    generation_s: _Seconds | None = None
    ttft_s: _Seconds | None = None


class UsageIn(_In):
    model: str = Field(min_length=1, max_length=MAX_IDENTIFIER_CHARS)
    kind: Literal["llm", "embedding", "reranker"] = "llm"
    input_tokens: _Count = 0
    output_tokens: _Count = 0
    cost_usd: Annotated[float, Field(ge=0, le=MAX_COST_USD, allow_inf_nan=False)] | None = Field(
        default=None, description="the app's own cost; wins over ragmon's price table"
    )


class TraceIn(_In):
    """One RAG request as an app without OpenTelemetry reports it."""

    trace_id: str = Field(
        pattern=TRACE_ID_PATTERN, description="32 lower-case hex digits; the idempotency key"
    )
    app: str = Field("unknown", min_length=1, max_length=200)
    release: _Id | None = None
    intent: _Id | None = None
    session_id: _Id | None = None
    user_id: _Id | None = Field(
        default=None, description="hashed with SHA-256 on arrival; never stored as sent"
    )
    start_time: TimeInRange | None = Field(default=None, description="default: time of arrival; 1970..2262")
    query: _Text | None = None
    query_embedding: EmbeddingIn | None = None
    retrieval: RetrievalIn | None = None
    answer: _Text | None = None
    cited_chunk_ids: list[_Id] = Field(default_factory=list)
    timings: TimingsIn = TimingsIn()
    usage: list[UsageIn] = Field(default_factory=list)
    is_regeneration: bool = False
    probe_run_id: _Id | None = None
    probe_question_id: _Id | None = None


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
    app: str | None = Field(default=None, max_length=200)
    time: TimeInRange | None = Field(default=None, description="default: time of arrival; 1970..2262")

    def resolved_event_id(self) -> str:
        return self.event_id or uuid.uuid4().hex

    def resolved_time(self) -> datetime:
        return self.time or datetime.now(UTC)


class FeedbackOut(BaseModel):
    accepted: int


def hash_user_id(user_id: str | None) -> str | None:
    return hashlib.sha256(user_id.encode()).hexdigest() if user_id else None


_RANGE_ERRORS = frozenset(
    {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "out_of_range"}
)


def rejection_reason(exc: ValidationError) -> RejectReason | Literal["invalid_input"]:
    """The `ragmon_ingest_rejected_total` reason of a record's first validation error: a limit of
    the table in `otlp.py` by its reason (out_of_range, string_too_long, vector_too_long,
    invalid_time; nan_vector for a non-finite embedding), anything else invalid_input."""
    errors = exc.errors()
    if not errors:
        return "invalid_input"
    first = errors[0]
    kind, loc = first["type"], first["loc"]
    if kind in _RANGE_ERRORS:
        return RejectReason.OUT_OF_RANGE
    if kind == "string_too_long":
        return RejectReason.STRING_TOO_LONG
    if kind == "too_long" and "vector" in loc:
        return RejectReason.VECTOR_TOO_LONG
    if kind == "finite_number" and "vector" in loc:
        return RejectReason.NAN_VECTOR
    if kind == "invalid_time":
        return RejectReason.INVALID_TIME
    return "invalid_input"
