"""The records that travel through ragmon after ingest: `RagTrace` and `Feedback`.

Everything downstream of the receivers speaks these types and nothing else
(DESIGN.md, "The RagTrace"). They are frozen: the bus fans one batch out to
several sinks without copying, so no sink may change what another sees.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

TRACE_ID_PATTERN = r"^[0-9a-f]{32}$"

RegenerationSource = Literal["attribute", "feedback", "reask"]
# "unknown_usage": the call reported no token counts and no cost (DSPy's LLM spans, a streamed call
# through the OpenInference OpenAI Node instrumentation), so its tokens and cost are unknown (None),
# never 0; "unpriced": tokens known, but no app cost and no price-table entry.
CostSource = Literal["app", "price_table", "unpriced", "unknown_usage"]
FeedbackKind = Literal["up", "down", "regenerate"]
# What a trace is (service/conventions/semconv.py decides): a user's request, or work that is not
# one: embedding calls only (index building, batch embedding), or no RAG stage at all (health checks).
TraceKind = Literal["request", "embedding", "other"]


def _unpickled(cls: type[_Frozen], values: dict[str, Any], fields_set: set[str] | None) -> _Frozen:
    record = cls.__new__(cls)
    object.__setattr__(record, "__dict__", values)
    # None: every field was given. Records of one class then share one set (frozen models never
    # change it: pydantic's model_copy copies it before adding to it), one container fewer a record
    # for the unpickling and for the server's garbage collector.
    object.__setattr__(
        record, "__pydantic_fields_set__", _every_field(cls) if fields_set is None else fields_set
    )
    object.__setattr__(record, "__pydantic_extra__", None)
    object.__setattr__(record, "__pydantic_private__", None)
    return record


_EVERY_FIELD: dict[type[BaseModel], set[str]] = {}


def _every_field(cls: type[BaseModel]) -> set[str]:
    every = _EVERY_FIELD.get(cls)
    if every is None:
        every = _EVERY_FIELD[cls] = set(cls.model_fields)
    return every


def _given(record: BaseModel) -> set[str] | None:
    """The record's set of given fields as pickled: None when every field was given."""
    given = record.__pydantic_fields_set__
    return None if len(given) == len(_every_field(type(record))) else given


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def __reduce__(self) -> tuple[Any, ...]:
        # Every trace is pickled out of a builder process (service/ingest/pool.py). Pydantic's
        # generic state (a dict of four dicts, rebuilt through __setstate__) took ~40 % more CPU
        # both ways than the field values alone; these models have no extra or private state.
        return (_unpickled, (type(self), self.__dict__, _given(self)))


class Chunk(_Frozen):
    """One retrieved (or reranked) chunk, in the order the retriever returned it."""

    id: str
    rank: int = Field(ge=0, description="0-based position in the list it belongs to")
    score: float | None = None
    content: str | None = None
    metadata: dict[str, JsonValue] | None = None


class Retrieval(_Frozen):
    """What the retriever (and the reranker, when there is one) returned for the query."""

    retriever: str | None = None
    k: int | None = None
    chunks: tuple[Chunk, ...] = ()
    filter: str | None = Field(default=None, description="filter predicate as the app logged it")
    excluded_ids: tuple[str, ...] = ()
    reranker_input: tuple[Chunk, ...] = ()
    reranker_output: tuple[Chunk, ...] = ()

    @property
    def context(self) -> tuple[Chunk, ...]:
        """The chunks the LLM saw: the reranker's output when there was a reranker."""
        return self.reranker_output or self.chunks

    @property
    def top1_score(self) -> float | None:
        return self.chunks[0].score if self.chunks else None


class Timings(_Frozen):
    """Stage durations in seconds; None where the trace had no such stage."""

    total_s: float | None = None
    embedding_s: float | None = None
    retrieval_s: float | None = None
    rerank_s: float | None = None
    generation_s: float | None = None
    ttft_s: float | None = None


class ModelUsage(_Frozen):
    """Tokens and cost of one model within a trace (summed over its calls).

    A token count is None when a call reported none (its sum is unknown), never 0.
    """

    model: str
    kind: Literal["llm", "embedding", "reranker"] = "llm"
    input_tokens: int | None = Field(default=0, ge=0)
    output_tokens: int | None = Field(default=0, ge=0)
    cost_usd: float | None = Field(default=None, ge=0)
    cost_source: CostSource = "unpriced"


def vector_bytes(vector: Sequence[float]) -> bytes:
    """A vector as one block of little-endian doubles, to cross a process boundary: a tuple of hundreds
    of floats pickles item by item (~40 % of a trace's pickle both ways at 256 numbers). `struct` packs
    a tuple's floats in about half the time `array("d", ...)` takes (bench/RESULTS.md, session 32)."""
    return struct.pack(f"<{len(vector)}d", *vector)


def vector_from_bytes(block: bytes) -> tuple[float, ...]:
    """The vector `vector_bytes` made, every number's bits as they were."""
    numbers: tuple[float, ...] = struct.unpack(f"<{len(block) // 8}d", block)
    return numbers


def _embedding_unpickled(model: str | None, packed: bytes, fields_set: set[str] | None) -> QueryEmbedding:
    values = {"model": model, "vector": vector_from_bytes(packed)}
    return _unpickled(QueryEmbedding, values, fields_set)  # type: ignore[return-value]


class QueryEmbedding(_Frozen):
    """The app's own vector for the query, with the model that made it."""

    model: str | None = None
    vector: tuple[float, ...]

    @property
    def dim(self) -> int:
        return len(self.vector)

    def __reduce__(self) -> tuple[Any, ...]:
        # The vector as one block of doubles (`vector_bytes`).
        return (_embedding_unpickled, (self.model, vector_bytes(self.vector), _given(self)))


class RagTrace(_Frozen):
    """One request of the RAG app, normalized from its spans or from the JSON API.

    Idempotency key: (tenant, trace_id). Every processor must give the same
    result when it sees the same trace twice.
    """

    trace_id: str = Field(pattern=TRACE_ID_PATTERN)
    tenant: str = "default"
    app: str = "unknown"
    release: str | None = None
    intent: str | None = None
    session_id: str | None = None
    user_hash: str | None = Field(default=None, description="sha256 of the app's user id, never the id")
    start_time: datetime
    query: str | None = None
    query_embedding: QueryEmbedding | None = None
    retrieval: Retrieval = Retrieval()
    answer: str | None = None
    cited_chunk_ids: tuple[str, ...] = ()
    timings: Timings = Timings()
    usage: tuple[ModelUsage, ...] = ()
    is_regeneration: bool = False
    regeneration_source: RegenerationSource | None = None
    probe_run_id: str | None = None
    probe_question_id: str | None = None
    partial: bool = Field(default=False, description="assembled before the root span ended")
    span_count: int = 0
    revision: int = Field(
        default=0,
        ge=0,
        description="distinct spans and span events the trace was built from: a later version of a "
        "trace built from more of them (its late spans arrived) replaces the stored one; 0 when it was "
        "not built from spans (JSON API)",
    )
    source: Literal["otlp", "json"] = "otlp"
    kind: TraceKind = Field(
        default="request", description="a request, or work that is not one (`TraceKind`), not monitored"
    )

    @property
    def cost_usd(self) -> float | None:
        """Total known cost; None when no model call could be priced or any call's usage is unknown.

        An unknown usage would understate the total by an unknown amount, so such a trace
        stays out of cost averages (and is counted as `usage_unknown_models`).
        """
        if self.usage_unknown_models:
            return None
        known = [u.cost_usd for u in self.usage if u.cost_usd is not None]
        return sum(known) if known else None

    @property
    def unpriced_models(self) -> tuple[str, ...]:
        return tuple(u.model for u in self.usage if u.cost_source == "unpriced")

    @property
    def usage_unknown_models(self) -> tuple[str, ...]:
        """Models called without token counts or a cost: their usage is unknown, not zero."""
        return tuple(u.model for u in self.usage if u.cost_source == "unknown_usage")

    @property
    def input_tokens(self) -> int | None:
        """Input tokens of all model calls; None when any call's are unknown (the sum is)."""
        return sum_counts(u.input_tokens for u in self.usage)

    @property
    def output_tokens(self) -> int | None:
        """Output tokens of all model calls; None when any call's are unknown (the sum is)."""
        return sum_counts(u.output_tokens for u in self.usage)

    @property
    def known_input_tokens(self) -> int:
        """Input tokens of the calls that reported them."""
        return sum(u.input_tokens or 0 for u in self.usage)

    @property
    def known_output_tokens(self) -> int:
        """Output tokens of the calls that reported them."""
        return sum(u.output_tokens or 0 for u in self.usage)


def sum_counts(counts: Iterable[int | None]) -> int | None:
    """The sum of token counts; None when any is None (unknown), never the sum of the known ones."""
    total = 0
    for count in counts:
        if count is None:
            return None
        total += count
    return total


class Feedback(_Frozen):
    """A user's reaction to an answer, joined to its trace by trace id.

    It may arrive before the trace is assembled; the store joins them on read.
    `event_id` makes redelivery harmless: the same event id is stored once.
    """

    event_id: str
    trace_id: str = Field(pattern=TRACE_ID_PATTERN)
    tenant: str = "default"
    app: str | None = None
    kind: FeedbackKind
    reason: str | None = Field(default=None, description="reason category, e.g. wrong, incomplete")
    text: str | None = None
    time: datetime
