"""The span attribute names ragmon reads, by convention, and the kind of value each must carry.

Three conventions are read side by side, so an app may mix instrumentations
(an OpenInference LangChain chain around an OpenLLMetry Chroma query, say),
with what two libraries that write GenAI spans add to them (OpenLIT,
`OpenLITAttributes`; Pydantic AI, `PydanticAIAttributes`):

* OpenInference, through the constants of `openinference-semantic-conventions`;
* OpenTelemetry GenAI (`gen_ai.*`, `GenAIAttributes`); the names are spelled
  out here because the `opentelemetry-semantic-conventions` package marks them
  as moving to a separate repository;
* OpenLLMetry (Traceloop, `TraceloopAttributes`): `traceloop.span.kind`,
  `traceloop.entity.*`, `gen_ai.prompt.N.*` / `gen_ai.completion.N.*`,
  `llm.request.type`, `llm.usage.total_tokens`, and the vector-DB result
  events `db.query.result` (Chroma, Pinecone, Milvus query) and
  `db.search.result` (Milvus search).

What no convention covers, ragmon reads from its own attributes
(`RagmonAttributes`, on any span of the trace; the root span's value wins):

=============================  ==========================  ==============================================
attribute                      type                        meaning
=============================  ==========================  ==============================================
`ragmon.intent`                string                      intent / route of the request
`ragmon.release`               string                      release of the app (wins over `service.version`)
`ragmon.regeneration`          bool                        the user asked for this answer again
`ragmon.probe.run_id`          string                      golden-set probe run that sent this request
`ragmon.probe.question_id`     string                      golden-set question of that probe
`ragmon.retrieval.filter`      string (or kvlist)          filter predicate the retriever applied
`ragmon.retrieval.excluded_ids` string[] (or JSON string)  ids the retriever was told to leave out
`ragmon.cited_chunk_ids`       string[] (or JSON string)   chunk ids the answer cites
`ragmon.ttft_ms`               double                      time to first token of the answer, ms
`ragmon.dropped`               string[]                    set by ingest: keys of the span's (or its
                                                           events') values it dropped as invalid or out
                                                           of range (`service/ingest/otlp.py`)
`ragmon.truncated`             string[]                    set by ingest: keys of the text values it cut
                                                           to fit the span size limit; each ends with a
                                                           note (`service/ingest/span_size.py`)
=============================  ==========================  ==============================================

`attribute_kind` and `embedding_model_of` tell the decoder (`service/ingest/otlp.py`) which
attribute values must be numbers, counts or vectors, so a `RagTrace` is never
built from a score that is not a number; `COST_KEY_PREFIX` which numbers are
costs, and `is_identifier` which strings name something (and so are held to an
identifier's length there).
"""

from __future__ import annotations

from typing import Literal

from openinference.semconv.resource import ResourceAttributes
from openinference.semconv.trace import (
    DocumentAttributes,
    EmbeddingAttributes,
    RerankerAttributes,
    SpanAttributes,
)

from service.conventions.spans import Attributes

__all__ = [
    "COST_KEY_PREFIX",
    "EMBEDDING_MODEL_KEYS",
    "SDK_DEFAULT_SERVICE",
    "VECTOR_KEY_SUFFIX",
    "AttributeKind",
    "GenAIAttributes",
    "OpenLITAttributes",
    "PydanticAIAttributes",
    "RagmonAttributes",
    "TraceloopAttributes",
    "attribute_kind",
    "embedding_model_of",
    "is_identifier",
]

AttributeKind = Literal["count", "number", "vector"]

SDK_DEFAULT_SERVICE = "unknown_service"
"""How the OTel SDKs' default `service.name` starts (`unknown_service:<process>`): no app named it."""


class RagmonAttributes:
    """ragmon's own span attributes (see the module docstring)."""

    INTENT = "ragmon.intent"
    RELEASE = "ragmon.release"
    REGENERATION = "ragmon.regeneration"
    PROBE_RUN_ID = "ragmon.probe.run_id"
    PROBE_QUESTION_ID = "ragmon.probe.question_id"
    RETRIEVAL_FILTER = "ragmon.retrieval.filter"
    RETRIEVAL_EXCLUDED_IDS = "ragmon.retrieval.excluded_ids"
    CITED_CHUNK_IDS = "ragmon.cited_chunk_ids"
    TTFT_MS = "ragmon.ttft_ms"
    DROPPED = "ragmon.dropped"
    TRUNCATED = "ragmon.truncated"


class GenAIAttributes:
    """OpenTelemetry GenAI semantic-convention names (spec registry `gen_ai.*`)."""

    OPERATION_NAME = "gen_ai.operation.name"
    REQUEST_MODEL = "gen_ai.request.model"
    RESPONSE_MODEL = "gen_ai.response.model"
    USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
    USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
    USAGE_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"  # deprecated spelling, still sent
    USAGE_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"  # deprecated spelling, still sent
    INPUT_MESSAGES = "gen_ai.input.messages"
    OUTPUT_MESSAGES = "gen_ai.output.messages"
    PROMPT = "gen_ai.prompt"
    COMPLETION = "gen_ai.completion"
    CONVERSATION_ID = "gen_ai.conversation.id"
    RETRIEVAL_DOCUMENTS = "gen_ai.retrieval.documents"
    RETRIEVAL_QUERY_TEXT = "gen_ai.retrieval.query.text"
    TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
    EVENT_PROMPT = "gen_ai.content.prompt"
    EVENT_COMPLETION = "gen_ai.content.completion"
    EVENT_USER_MESSAGE = "gen_ai.user.message"
    EVENT_CHOICE = "gen_ai.choice"
    EVENT_DETAILS = "gen_ai.client.inference.operation.details"


class OpenLITAttributes:
    """OpenLIT's names beside the GenAI ones it writes (`openlit` `SemanticConvention`)."""

    VECTOR_DB = "vectordb"  # its `gen_ai.operation.name` on every vector-database span
    # the first token's time on every chat span, the whole call's when it did not stream
    # (`gen_ai.request.stream` false); the OTel GenAI metric of that name, written as a span attribute
    SERVER_TIME_TO_FIRST_TOKEN = "gen_ai.server.time_to_first_token"
    REQUEST_STREAM = "gen_ai.request.stream"


class PydanticAIAttributes:
    """Pydantic AI's names beside the GenAI ones it writes (`pydantic_ai.models.instrumented`)."""

    # the first chunk's time on a streamed model request: the OTel GenAI client metric of that
    # name, written as a span attribute
    TIME_TO_FIRST_CHUNK = "gen_ai.client.operation.time_to_first_chunk"
    # an embeddings span's texts and vectors, each a JSON list; `input_type` is "query" or "document"
    EMBEDDING_INPUTS = "inputs"
    EMBEDDING_VECTORS = "embeddings"
    EMBEDDING_INPUT_TYPE = "input_type"
    QUERY_INPUT = "query"


class TraceloopAttributes:
    """OpenLLMetry names (`opentelemetry-semantic-conventions-ai`)."""

    SPAN_KIND = "traceloop.span.kind"
    ENTITY_INPUT = "traceloop.entity.input"
    ENTITY_OUTPUT = "traceloop.entity.output"
    TASK_OUTPUT = "gen_ai.task.output"  # the same JSON as ENTITY_OUTPUT, in newer OpenLLMetry
    ASSOCIATION_PREFIX = "traceloop.association.properties."
    REQUEST_TYPE = "llm.request.type"
    USAGE_TOTAL_TOKENS = "llm.usage.total_tokens"
    COMPLETION_CHUNK_EVENT = "llm.content.completion.chunk"
    PROMPT_PREFIX = "gen_ai.prompt"
    COMPLETION_PREFIX = "gen_ai.completion"
    DB_SYSTEM = ("db.system", "db.system.name")
    DB_OPERATION = ("db.operation", "db.operation.name")
    QUERY_RESULT_EVENT = "db.query.result"
    SEARCH_RESULT_EVENT = "db.search.result"
    QUERY_EMBEDDINGS_EVENT = "db.query.embeddings"
    QUERY_EMBEDDINGS_VECTOR = "db.query.embeddings.vector"
    # The k of a vector-database query; on a vector-DB span, one of these makes the span a query.
    VECTOR_QUERY_TOP_K = (
        "db.vector.query.top_k",
        "db.chroma.query.n_results",
        "pinecone.query.top_k",
        "db.milvus.search.limit",
    )
    TOP_K = (
        "gen_ai.request.top_k",  # GenAI retrieval spans (read on retriever spans only: on an LLM span it
        "gen_ai.retrieval.top_k",  # is a sampling setting)
        *VECTOR_QUERY_TOP_K,
    )
    FILTERS = (
        "db.chroma.query.where",
        "pinecone.query.filter",
        "db.milvus.search.filter",
        "db.milvus.query.filter",
    )


_EMBEDDINGS_PREFIX = SpanAttributes.EMBEDDING_EMBEDDINGS + "."
# Every key `attribute_kind` calls a vector ends with this.
VECTOR_KEY_SUFFIX = "." + EmbeddingAttributes.EMBEDDING_VECTOR
_SCORE_SUFFIX = "." + DocumentAttributes.DOCUMENT_SCORE
_TOKEN_COUNT_PREFIX = "llm.token_count."
# Every key under it is a cost in USD (`llm.cost.total`, `.prompt`, `.completion`, ...).
COST_KEY_PREFIX = "llm.cost."
# Where a span names its embedding model, in order of preference.
EMBEDDING_MODEL_KEYS = (
    SpanAttributes.EMBEDDING_MODEL_NAME,
    GenAIAttributes.RESPONSE_MODEL,
    GenAIAttributes.REQUEST_MODEL,
)

_EXACT_KINDS: dict[str, AttributeKind] = {
    GenAIAttributes.USAGE_INPUT_TOKENS: "count",
    GenAIAttributes.USAGE_OUTPUT_TOKENS: "count",
    GenAIAttributes.USAGE_PROMPT_TOKENS: "count",
    GenAIAttributes.USAGE_COMPLETION_TOKENS: "count",
    TraceloopAttributes.USAGE_TOTAL_TOKENS: "count",
    RerankerAttributes.RERANKER_TOP_K: "count",
    **{key: "count" for key in TraceloopAttributes.TOP_K},
    RagmonAttributes.TTFT_MS: "number",
    GenAIAttributes.TIME_TO_FIRST_CHUNK: "number",
    OpenLITAttributes.SERVER_TIME_TO_FIRST_TOKEN: "number",
    PydanticAIAttributes.TIME_TO_FIRST_CHUNK: "number",
    "db.query.result.score": "number",
    "db.query.result.distance": "number",
    "db.search.result.score": "number",
    "db.search.result.distance": "number",
}


def attribute_kind(key: str) -> AttributeKind | None:
    """What an attribute's value must be for `build_trace` to read it; None when any value will do."""
    kind = _EXACT_KINDS.get(key)
    if kind is not None:
        return kind
    if key.endswith(_SCORE_SUFFIX):
        return "number"
    if key.startswith(_TOKEN_COUNT_PREFIX):
        return "count"
    if key.startswith(COST_KEY_PREFIX):
        return "number"
    if key.startswith(_EMBEDDINGS_PREFIX) and key.endswith(VECTOR_KEY_SUFFIX):
        return "vector"
    return None


# Attributes whose text becomes a record's identifier or a metric label: the app and release, the
# trace's intent, session and user, probe ids, and model names (resource attributes included).
_IDENTIFIER_KEYS = frozenset(
    {
        "service.name",
        "service.version",
        ResourceAttributes.PROJECT_NAME,
        SpanAttributes.SESSION_ID,
        SpanAttributes.USER_ID,
        "enduser.id",
        GenAIAttributes.CONVERSATION_ID,
        RagmonAttributes.INTENT,
        RagmonAttributes.RELEASE,
        RagmonAttributes.PROBE_RUN_ID,
        RagmonAttributes.PROBE_QUESTION_ID,
        SpanAttributes.LLM_MODEL_NAME,
        SpanAttributes.LLM_REQUEST_MODEL_NAME,
        SpanAttributes.LLM_RESPONSE_MODEL_NAME,
        SpanAttributes.EMBEDDING_MODEL_NAME,
        RerankerAttributes.RERANKER_MODEL_NAME,
        GenAIAttributes.REQUEST_MODEL,
        GenAIAttributes.RESPONSE_MODEL,
    }
)
_DOCUMENT_ID_SUFFIX = "." + DocumentAttributes.DOCUMENT_ID


def is_identifier(key: str) -> bool:
    """Whether an attribute's value names something (an app, release, intent, session, user, model or
    document) rather than carrying content: its text becomes an id or a metric label."""
    return key in _IDENTIFIER_KEYS or key.endswith(_DOCUMENT_ID_SUFFIX)


def embedding_model_of(attributes: Attributes) -> str | None:
    """The embedding model a span names, under any of the conventions."""
    for key in EMBEDDING_MODEL_KEYS:
        value = attributes.get(key)
        if isinstance(value, str) and value:
            return value
    return None
