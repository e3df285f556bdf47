"""Semantic-convention mapping: the decoded spans of one trace -> one `RagTrace`.

`build_trace` reads three conventions side by side, so an app may mix
instrumentations (an OpenInference LangChain chain around an OpenLLMetry
Chroma query, say):

* OpenInference, through the constants of `openinference-semantic-conventions`;
* OpenTelemetry GenAI (`gen_ai.*`); the names are spelled out below because
  the `opentelemetry-semantic-conventions` package marks them as moving to a
  separate repository;
* OpenLLMetry (Traceloop): `traceloop.span.kind`, `traceloop.entity.*`,
  `gen_ai.prompt.N.*` / `gen_ai.completion.N.*`, `llm.request.type`,
  `llm.usage.total_tokens`, and the vector-DB result events `db.query.result`
  (Chroma, Pinecone, Milvus query) and `db.search.result` (Milvus search).

What no convention covers, ragmon reads from its own attributes (on any span of
the trace; the root span's value wins):

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
=============================  ==========================  ==============================================

The OpenInference `metadata` attribute (a JSON object string) may carry the same
facts as `intent` (or `route`), `release`, `regenerate`, `probe_run_id` and
`probe_question_id`; `tag.tags` may carry `regenerate`, `intent:<x>`,
`route:<x>` and `release:<x>`. Explicit `ragmon.*` attributes win over
metadata, metadata over tags, and `ragmon.release`/metadata/tag over the
resource's `service.version`.

The app is the resource's `service.name`; when the SDK default
(`unknown_service:...`) was left in place, Phoenix's `openinference.project.name`
(what `phoenix.otel.register(project_name=...)` sets), else "unknown".

Stage roll-ups avoid double counting when instrumentations nest (a LangChain
LLM span around the OpenAI SDK's LLM span): a stage's time sums only the
outermost spans of that stage, and token usage is taken from a span only when
no span of the same stage below it reports usage.

`attribute_kind` and `embedding_model_of` tell the decoder (`otlp.py`) which
attribute values must be numbers, counts or vectors, so a `RagTrace` is never
built from a score that is not a number.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from openinference.semconv.resource import ResourceAttributes
from openinference.semconv.trace import (
    DocumentAttributes,
    EmbeddingAttributes,
    MessageAttributes,
    MessageContentAttributes,
    OpenInferenceMimeTypeValues,
    OpenInferenceSpanKindValues,
    RerankerAttributes,
    SpanAttributes,
)
from pydantic import JsonValue

from service.model import Chunk, CostSource, ModelUsage, QueryEmbedding, RagTrace, Retrieval, Timings
from service.pricing import PriceTable
from service.spans import Attributes, AttrValue, Span

__all__ = [
    "AttributeKind",
    "RagmonAttributes",
    "Stage",
    "attribute_kind",
    "build_trace",
    "embedding_model_of",
    "span_stage",
]

AttributeKind = Literal["count", "number", "vector"]
Stage = Literal["llm", "embedding", "retriever", "reranker", "chain", "tool", "other"]


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


class _GenAI:
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


class _Traceloop:
    """OpenLLMetry names (`opentelemetry-semantic-conventions-ai`)."""

    SPAN_KIND = "traceloop.span.kind"
    ENTITY_INPUT = "traceloop.entity.input"
    ENTITY_OUTPUT = "traceloop.entity.output"
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
    TOP_K = (
        "db.vector.query.top_k",
        "db.chroma.query.n_results",
        "pinecone.query.top_k",
        "db.milvus.search.limit",
    )
    FILTERS = (
        "db.chroma.query.where",
        "pinecone.query.filter",
        "db.milvus.search.filter",
        "db.milvus.query.filter",
    )


_FIRST_TOKEN_EVENT = "First Token Stream Event"  # openinference-instrumentation-openai, streaming calls
_SERVICE_NAME = "service.name"
_SERVICE_VERSION = "service.version"
_SDK_DEFAULT_SERVICE = "unknown_service"
_ENDUSER_ID = "enduser.id"
_MAX_CLOCK_SKEW = timedelta(minutes=5)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LITERAL_LIMIT = 4096

_DOC_PREFIX = "document."
_DOC_ID = DocumentAttributes.DOCUMENT_ID.removeprefix(_DOC_PREFIX)
_DOC_SCORE = DocumentAttributes.DOCUMENT_SCORE.removeprefix(_DOC_PREFIX)
_DOC_CONTENT = DocumentAttributes.DOCUMENT_CONTENT.removeprefix(_DOC_PREFIX)
_DOC_METADATA = DocumentAttributes.DOCUMENT_METADATA.removeprefix(_DOC_PREFIX)
_EMBEDDINGS_PREFIX = SpanAttributes.EMBEDDING_EMBEDDINGS + "."
_VECTOR_SUFFIX = "." + EmbeddingAttributes.EMBEDDING_VECTOR
_SCORE_SUFFIX = "." + DocumentAttributes.DOCUMENT_SCORE
_TOKEN_COUNT_PREFIX = "llm.token_count."
_COST_PREFIX = "llm.cost."

_EXACT_KINDS: dict[str, AttributeKind] = {
    _GenAI.USAGE_INPUT_TOKENS: "count",
    _GenAI.USAGE_OUTPUT_TOKENS: "count",
    _GenAI.USAGE_PROMPT_TOKENS: "count",
    _GenAI.USAGE_COMPLETION_TOKENS: "count",
    _Traceloop.USAGE_TOTAL_TOKENS: "count",
    RerankerAttributes.RERANKER_TOP_K: "count",
    **{key: "count" for key in _Traceloop.TOP_K},
    RagmonAttributes.TTFT_MS: "number",
    _GenAI.TIME_TO_FIRST_CHUNK: "number",
    "db.query.result.score": "number",
    "db.query.result.distance": "number",
    "db.search.result.score": "number",
    "db.search.result.distance": "number",
}

_OPENINFERENCE_STAGES: dict[str, Stage] = {
    OpenInferenceSpanKindValues.LLM.value: "llm",
    OpenInferenceSpanKindValues.EMBEDDING.value: "embedding",
    OpenInferenceSpanKindValues.RETRIEVER.value: "retriever",
    OpenInferenceSpanKindValues.RERANKER.value: "reranker",
    OpenInferenceSpanKindValues.CHAIN.value: "chain",
    OpenInferenceSpanKindValues.AGENT.value: "chain",
    OpenInferenceSpanKindValues.TOOL.value: "tool",
}
_GENAI_STAGES: dict[str, Stage] = {
    "chat": "llm",
    "text_completion": "llm",
    "generate_content": "llm",
    "embeddings": "embedding",
    "retrieval": "retriever",
    "execute_tool": "tool",
    "invoke_agent": "chain",
    "create_agent": "chain",
    "invoke_workflow": "chain",
}
_REQUEST_TYPE_STAGES: dict[str, Stage] = {
    "chat": "llm",
    "completion": "llm",
    "embedding": "embedding",
    "rerank": "reranker",
}
_TRACELOOP_STAGES: dict[str, Stage] = {"workflow": "chain", "task": "chain", "agent": "chain", "tool": "tool"}
_VECTOR_DBS = frozenset(
    {"chroma", "chromadb", "pinecone", "qdrant", "milvus", "weaviate", "lancedb", "marqo"}
)
_VECTOR_QUERY_OPERATIONS = frozenset(
    {"query", "_query", "search", "hybrid_search", "query_points", "search_batch", "query_batch_points"}
)
_USAGE_KINDS: dict[Stage, Literal["llm", "embedding", "reranker"]] = {
    "llm": "llm",
    "embedding": "embedding",
    "reranker": "reranker",
}
_QUERY_KEYS = ("query", "question", "input", "user_input", "q", "prompt", "text", "content", "messages")
_QUERY_CONTAINERS = ("inputs", "kwargs", "args")
_ANSWER_KEYS = ("answer", "output", "result", "response", "text", "content", "choices", "message", "messages")
_ANSWER_CONTAINERS = ("outputs", "generations")
_TRUE_STRINGS = frozenset({"true", "1", "yes"})


# ---------------------------------------------------------------- decoder support


def attribute_kind(key: str) -> AttributeKind | None:
    """What an attribute's value must be for `build_trace` to read it; None when any value will do."""
    kind = _EXACT_KINDS.get(key)
    if kind is not None:
        return kind
    if key.endswith(_SCORE_SUFFIX):
        return "number"
    if key.startswith(_TOKEN_COUNT_PREFIX):
        return "count"
    if key.startswith(_COST_PREFIX):
        return "number"
    if key.startswith(_EMBEDDINGS_PREFIX) and key.endswith(_VECTOR_SUFFIX):
        return "vector"
    return None


def embedding_model_of(attributes: Attributes) -> str | None:
    """The embedding model a span names, under any of the conventions."""
    for key in (SpanAttributes.EMBEDDING_MODEL_NAME, _GenAI.RESPONSE_MODEL, _GenAI.REQUEST_MODEL):
        value = attributes.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def span_stage(span: Span) -> Stage:
    """Which RAG stage a span is, by the first convention that says so."""
    attributes = span.attributes
    kind = attributes.get(SpanAttributes.OPENINFERENCE_SPAN_KIND)
    if isinstance(kind, str) and kind.upper() in _OPENINFERENCE_STAGES:
        return _OPENINFERENCE_STAGES[kind.upper()]
    for key, table in (
        (_GenAI.OPERATION_NAME, _GENAI_STAGES),
        (_Traceloop.REQUEST_TYPE, _REQUEST_TYPE_STAGES),
    ):
        value = attributes.get(key)
        if isinstance(value, str) and value.lower() in table:
            return table[value.lower()]
    if _is_vector_query(span):
        return "retriever"
    value = attributes.get(_Traceloop.SPAN_KIND)
    if isinstance(value, str) and value.lower() in _TRACELOOP_STAGES:
        return _TRACELOOP_STAGES[value.lower()]
    if _text(attributes, _GenAI.REQUEST_MODEL, SpanAttributes.LLM_MODEL_NAME):
        return "llm"
    return "other"


def _is_vector_query(span: Span) -> bool:
    if any(e.name in (_Traceloop.QUERY_RESULT_EVENT, _Traceloop.SEARCH_RESULT_EVENT) for e in span.events):
        return True
    system = _text(span.attributes, *_Traceloop.DB_SYSTEM)
    operation = _text(span.attributes, *_Traceloop.DB_OPERATION)
    return (
        system is not None
        and system.lower() in _VECTOR_DBS
        and operation is not None
        and operation.lower() in _VECTOR_QUERY_OPERATIONS
    )


# ---------------------------------------------------------------- value readers


def _text(attributes: Attributes, *keys: str) -> str | None:
    for key in keys:
        value = attributes.get(key)
        if isinstance(value, str) and value.strip():
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
    return None


def _number(value: AttrValue) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


def _count(attributes: Attributes, *keys: str) -> int | None:
    for key in keys:
        number = _number(attributes.get(key))
        if number is not None and number >= 0 and number.is_integer():
            return int(number)
    return None


def _parse_json(value: AttrValue) -> Any:
    """A JSON (or Python-literal, as some instrumentations `str()` dicts) string parsed; else the value."""
    if not isinstance(value, str):
        return value
    stripped = value.strip()
    if not stripped or stripped[0] not in "{[":
        return value
    try:
        return json.loads(stripped)
    except ValueError:
        pass
    if len(stripped) <= _LITERAL_LIMIT:
        try:
            return ast.literal_eval(stripped)
        except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
            pass
    return value


def _json_safe(value: Any) -> JsonValue:
    return json.loads(json.dumps(value, default=str))  # type: ignore[no-any-return]


def _string_list(value: AttrValue) -> tuple[str, ...]:
    parsed = _parse_json(value)
    if isinstance(parsed, str):
        return (parsed,) if parsed else ()
    if isinstance(parsed, list):
        return tuple(
            str(item) for item in parsed if isinstance(item, str | int) and not isinstance(item, bool)
        )
    return ()


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value != 0
    return isinstance(value, str) and value.strip().lower() in _TRUE_STRINGS


def _indexed(attributes: Attributes, prefix: str) -> list[dict[str, AttrValue]]:
    """The objects of a flattened list (`prefix.N.rest`), in index order; a structured list also works."""
    structured = attributes.get(prefix)
    if isinstance(structured, list):
        return [item for item in structured if isinstance(item, dict)]
    dotted = prefix + "."
    items: dict[int, dict[str, AttrValue]] = {}
    for key, value in attributes.items():
        if key.startswith(dotted):
            index, _, rest = key[len(dotted) :].partition(".")
            if index.isdigit() and rest:
                items.setdefault(int(index), {})[rest] = value
    return [items[i] for i in sorted(items)]


# ---------------------------------------------------------------- text of messages and payloads


def _message_text(message: dict[str, Any]) -> str | None:
    content = message.get("content", message.get(MessageAttributes.MESSAGE_CONTENT))
    if isinstance(content, str) and content.strip():
        return content
    parts = content if isinstance(content, list) else message.get("parts")
    texts: list[str] = []
    if isinstance(parts, list):
        for part in parts:
            if isinstance(part, dict):
                text = part.get("text", part.get("content"))
                if isinstance(text, str):
                    texts.append(text)
    contents = _indexed(message, MessageAttributes.MESSAGE_CONTENTS)
    texts.extend(
        text
        for item in contents
        if isinstance(text := item.get(MessageContentAttributes.MESSAGE_CONTENT_TEXT), str)
    )
    joined = "\n".join(t for t in texts if t.strip())
    return joined or None


def _role(message: dict[str, Any]) -> str:
    role = message.get("role", message.get(MessageAttributes.MESSAGE_ROLE))
    return role.lower() if isinstance(role, str) else ""


def _pick_message(messages: Sequence[dict[str, Any]], role: str) -> str | None:
    """Text of the last message with `role` ('user' for a question), or of the first for answers."""
    if role == "user":
        for message in reversed(messages):
            if _role(message) in ("user", "human"):
                return _message_text(message)
        return None
    for message in messages:
        if _role(message) in ("", "assistant", "ai", "model"):
            text = _message_text(message)
            if text:
                return text
    return None


def _find_text(
    obj: Any, keys: tuple[str, ...], containers: tuple[str, ...], role: str, depth: int = 0
) -> str | None:
    """The question (role 'user') or answer (role 'assistant') inside a parsed payload."""
    if isinstance(obj, str):
        return obj if obj.strip() else None
    if depth > 4:
        return None
    if isinstance(obj, list):
        messages = [
            m for m in obj if isinstance(m, dict) and ("role" in m or MessageAttributes.MESSAGE_ROLE in m)
        ]
        if messages:
            return _pick_message(messages, role)
        for item in obj:
            found = _find_text(item, keys, containers, role, depth + 1)
            if found:
                return found
        return None
    if isinstance(obj, dict):
        if "role" in obj and ("content" in obj or "parts" in obj):
            return _pick_message([obj], role)
        for key in keys + containers:
            if key in obj:
                found = _find_text(obj[key], keys, containers, role, depth + 1)
                if found:
                    return found
    return None


def _payload_text(value: AttrValue, role: str, *, is_json: bool = False) -> str | None:
    """The question or answer in a payload; `is_json` also unquotes a JSON string ('"text"')."""
    keys, containers = (
        (_QUERY_KEYS, _QUERY_CONTAINERS) if role == "user" else (_ANSWER_KEYS, _ANSWER_CONTAINERS)
    )
    if is_json and isinstance(value, str) and value.strip().startswith('"'):
        with contextlib.suppress(ValueError):
            value = json.loads(value)
    return _find_text(_parse_json(value), keys, containers, role)


def _io_text(attributes: Attributes, value_key: str, mime_key: str, role: str) -> str | None:
    """`input.value` / `output.value`: plain text as sent when the mime type says so, else parsed."""
    value = attributes.get(value_key)
    if isinstance(value, str) and attributes.get(mime_key) == OpenInferenceMimeTypeValues.TEXT.value:
        return value if value.strip() else None
    is_json = attributes.get(mime_key) == OpenInferenceMimeTypeValues.JSON.value
    return _payload_text(value, role, is_json=is_json)


def _messages(span: Span, direction: Literal["input", "output"]) -> list[dict[str, Any]]:
    attributes = span.attributes
    if direction == "input":
        oi_key, genai_key, prefix = (
            SpanAttributes.LLM_INPUT_MESSAGES,
            _GenAI.INPUT_MESSAGES,
            _Traceloop.PROMPT_PREFIX,
        )
    else:
        oi_key, genai_key, prefix = (
            SpanAttributes.LLM_OUTPUT_MESSAGES,
            _GenAI.OUTPUT_MESSAGES,
            _Traceloop.COMPLETION_PREFIX,
        )
    found: list[dict[str, Any]] = [
        {k.removeprefix("message."): v for k, v in m.items()} for m in _indexed(attributes, oi_key)
    ]
    if found:
        return found
    parsed = _parse_json(attributes.get(genai_key))
    if isinstance(parsed, list) and parsed:
        return [m for m in parsed if isinstance(m, dict)]
    found = _indexed(attributes, prefix)
    if found:
        return found
    for event in span.events:
        for key in (genai_key, _GenAI.PROMPT if direction == "input" else _GenAI.COMPLETION):
            parsed = _parse_json(event.attributes.get(key))
            if isinstance(parsed, list) and parsed:
                return [m for m in parsed if isinstance(m, dict)]
        wanted = _GenAI.EVENT_USER_MESSAGE if direction == "input" else _GenAI.EVENT_CHOICE
        if event.name == wanted:
            message = _parse_json(event.attributes.get("message", event.attributes.get("content")))
            if isinstance(message, dict):
                found.append(message)
            elif isinstance(message, str):
                found.append({"role": "user" if direction == "input" else "assistant", "content": message})
    return found


def _span_question(span: Span) -> str | None:
    attributes = span.attributes
    text = _pick_message(_messages(span, "input"), "user")
    if text:
        return text
    prompts = _indexed(attributes, SpanAttributes.LLM_PROMPTS)
    if prompts and isinstance(prompts[-1].get("prompt.text"), str):
        return str(prompts[-1]["prompt.text"])
    text = _io_text(attributes, SpanAttributes.INPUT_VALUE, SpanAttributes.INPUT_MIME_TYPE, "user")
    for key in (_Traceloop.ENTITY_INPUT, _GenAI.RETRIEVAL_QUERY_TEXT):
        text = text or _payload_text(attributes.get(key), "user", is_json=key == _Traceloop.ENTITY_INPUT)
    return text


def _span_answer(span: Span) -> str | None:
    attributes = span.attributes
    text = _pick_message(_messages(span, "output"), "assistant")
    if text:
        return text
    choices = _indexed(attributes, SpanAttributes.LLM_CHOICES)
    if choices and isinstance(choices[0].get("completion.text"), str):
        return str(choices[0]["completion.text"])
    text = _io_text(attributes, SpanAttributes.OUTPUT_VALUE, SpanAttributes.OUTPUT_MIME_TYPE, "assistant")
    return text or _payload_text(attributes.get(_Traceloop.ENTITY_OUTPUT), "assistant", is_json=True)


# ---------------------------------------------------------------- documents


def _doc_id(raw_id: AttrValue, content: str | None, rank: int) -> str:
    if isinstance(raw_id, str) and raw_id:
        return raw_id
    if isinstance(raw_id, int) and not isinstance(raw_id, bool):
        return str(raw_id)
    if content:
        # Stable across redeliveries, so a chunk without an id still joins with its judgments.
        return "sha256:" + hashlib.sha256(content.encode()).hexdigest()[:16]
    return f"#{rank}"


def _metadata(value: AttrValue) -> dict[str, JsonValue] | None:
    parsed = _parse_json(value)
    if isinstance(parsed, dict) and parsed:
        safe = _json_safe(parsed)
        return safe if isinstance(safe, dict) else None
    return None


def _chunks(docs: Iterable[dict[str, AttrValue]]) -> list[Chunk]:
    chunks: list[Chunk] = []
    for rank, doc in enumerate(docs):
        doc = {k.removeprefix(_DOC_PREFIX): v for k, v in doc.items()}
        content = doc.get(_DOC_CONTENT, doc.get("text"))
        content = content if isinstance(content, str) else None
        chunks.append(
            Chunk(
                id=_doc_id(doc.get(_DOC_ID), content, rank),
                rank=rank,
                score=_number(doc.get(_DOC_SCORE)),
                content=content,
                metadata=_metadata(doc.get(_DOC_METADATA)),
            )
        )
    return chunks


def _event_documents(span: Span) -> list[dict[str, AttrValue]]:
    """OpenLLMetry vector-DB result events as documents; a distance stands in for a missing score."""
    docs: list[dict[str, AttrValue]] = []
    for event in span.events:
        if event.name == _Traceloop.QUERY_RESULT_EVENT:
            prefix = _Traceloop.QUERY_RESULT_EVENT + "."
        elif event.name == _Traceloop.SEARCH_RESULT_EVENT:
            prefix = _Traceloop.SEARCH_RESULT_EVENT + "."
            if _number(event.attributes.get("db.search.query.id")) not in (None, 0.0):
                continue  # multi-vector search: only the first query's hits answer this request
        else:
            continue
        a = event.attributes
        score = a.get(prefix + "score")
        metadata = _parse_json(a.get(prefix + "metadata", a.get(prefix + "entity")))
        if score is None and a.get(prefix + "distance") is not None:
            score = a.get(prefix + "distance")
            metadata = {**(metadata if isinstance(metadata, dict) else {}), "ragmon.score_kind": "distance"}
        docs.append(
            {
                _DOC_ID: a.get(prefix + "id", a.get("id")),
                _DOC_SCORE: score,
                _DOC_CONTENT: a.get(prefix + "document"),
                _DOC_METADATA: json.dumps(_json_safe(metadata)) if isinstance(metadata, dict) else None,
            }
        )
    return docs


def _retrieved(span: Span) -> list[Chunk]:
    docs = _indexed(span.attributes, SpanAttributes.RETRIEVAL_DOCUMENTS)
    if not docs:
        parsed = _parse_json(span.attributes.get(_GenAI.RETRIEVAL_DOCUMENTS))
        docs = [d for d in parsed if isinstance(d, dict)] if isinstance(parsed, list) else []
    if not docs:
        docs = _event_documents(span)
    return _chunks(docs)


# ---------------------------------------------------------------- the trace


@dataclass(slots=True)
class _Call:
    model: str
    kind: Literal["llm", "embedding", "reranker"]
    input_tokens: int
    output_tokens: int
    cost: float | None
    source: CostSource


class _Tree:
    """Parent links of one trace, for the nesting rules (cycles and missing parents tolerated)."""

    def __init__(self, spans: Sequence[Span]) -> None:
        self._by_id = {s.span_id: s for s in spans}

    def ancestors(self, span: Span) -> Iterable[Span]:
        seen = {span.span_id}
        parent = self._by_id.get(span.parent_span_id or "")
        while parent is not None and parent.span_id not in seen:
            seen.add(parent.span_id)
            yield parent
            parent = self._by_id.get(parent.parent_span_id or "")


def _span_call(span: Span, stage: Stage, prices: PriceTable) -> _Call | None:
    kind = _USAGE_KINDS.get(stage)
    if kind is None:
        return None
    a = span.attributes
    input_tokens = _count(
        a, SpanAttributes.LLM_TOKEN_COUNT_PROMPT, _GenAI.USAGE_INPUT_TOKENS, _GenAI.USAGE_PROMPT_TOKENS
    )
    output_tokens = _count(
        a,
        SpanAttributes.LLM_TOKEN_COUNT_COMPLETION,
        _GenAI.USAGE_OUTPUT_TOKENS,
        _GenAI.USAGE_COMPLETION_TOKENS,
    )
    total = _count(a, SpanAttributes.LLM_TOKEN_COUNT_TOTAL, _Traceloop.USAGE_TOTAL_TOKENS)
    split_known = input_tokens is not None or kind == "embedding" or output_tokens is not None
    if input_tokens is None and total is not None:
        input_tokens = max(total - (output_tokens or 0), 0)
    app_cost = _number(a.get(SpanAttributes.LLM_COST_TOTAL))
    if app_cost is None:
        parts = [
            _number(a.get(k)) for k in (SpanAttributes.LLM_COST_PROMPT, SpanAttributes.LLM_COST_COMPLETION)
        ]
        known = [p for p in parts if p is not None]
        app_cost = sum(known) if known else None
    has_usage = input_tokens is not None or output_tokens is not None or app_cost is not None
    model_keys = {
        "llm": (SpanAttributes.LLM_MODEL_NAME, _GenAI.RESPONSE_MODEL, _GenAI.REQUEST_MODEL),
        "embedding": (SpanAttributes.EMBEDDING_MODEL_NAME, _GenAI.RESPONSE_MODEL, _GenAI.REQUEST_MODEL),
        "reranker": (RerankerAttributes.RERANKER_MODEL_NAME, _GenAI.RESPONSE_MODEL, _GenAI.REQUEST_MODEL),
    }[kind]
    model = _text(
        a, *model_keys, SpanAttributes.LLM_RESPONSE_MODEL_NAME, SpanAttributes.LLM_REQUEST_MODEL_NAME
    )
    if not has_usage and (kind != "llm" or model is None):
        return None
    tokens_in, tokens_out = input_tokens or 0, output_tokens or 0
    cost: float | None
    source: CostSource
    if app_cost is not None and app_cost >= 0:
        cost, source = float(app_cost), "app"
    elif model is not None and (input_tokens is not None or output_tokens is not None) and split_known:
        cost = prices.cost(model, tokens_in, tokens_out)
        source = "price_table" if cost is not None else "unpriced"
    else:
        cost, source = None, "unpriced"
    return _Call(model or "unknown", kind, tokens_in, tokens_out, cost, source)


def _usage(calls: Iterable[_Call]) -> tuple[ModelUsage, ...]:
    grouped: dict[tuple[str, str], list[_Call]] = {}
    for call in calls:
        grouped.setdefault((call.model, call.kind), []).append(call)
    usage: list[ModelUsage] = []
    for (model, _), group in grouped.items():
        sources = {c.source for c in group}
        if "unpriced" in sources:
            cost: float | None = None
            source: CostSource = "unpriced"
        else:
            cost = sum(c.cost or 0.0 for c in group)
            source = "app" if sources == {"app"} else "price_table"
        usage.append(
            ModelUsage(
                model=model,
                kind=group[0].kind,
                input_tokens=sum(c.input_tokens for c in group),
                output_tokens=sum(c.output_tokens for c in group),
                cost_usd=cost,
                cost_source=source,
            )
        )
    return tuple(usage)


def _to_datetime(ns: int) -> datetime:
    return _EPOCH + timedelta(microseconds=ns // 1000)


def _first(spans: Iterable[Span], reader: Any) -> Any:
    for span in spans:
        value = reader(span)
        if value is not None:
            return value
    return None


def _ttft(ordered: Sequence[Span], answer_llm: Span | None) -> float | None:
    ms = _first(ordered, lambda s: _number(s.attributes.get(RagmonAttributes.TTFT_MS)))
    if ms is not None and ms >= 0:
        return float(ms) / 1000
    if answer_llm is None:
        return None
    seconds = _number(answer_llm.attributes.get(_GenAI.TIME_TO_FIRST_CHUNK))
    if seconds is not None and seconds >= 0:
        return seconds
    for event in answer_llm.events:
        if (
            event.name in (_FIRST_TOKEN_EVENT, _Traceloop.COMPLETION_CHUNK_EVENT)
            and event.time_ns >= answer_llm.start_ns
        ):
            return (event.time_ns - answer_llm.start_ns) / 1e9
    return None


def _query_embedding(
    embedding_spans: Sequence[Span], retrievers: Sequence[Span], query: str | None
) -> QueryEmbedding | None:
    candidates: list[tuple[str | None, str | None, tuple[float, ...]]] = []
    for span in embedding_spans:
        model = embedding_model_of(span.attributes)
        for item in _indexed(span.attributes, SpanAttributes.EMBEDDING_EMBEDDINGS):
            numbers = _vector(item.get(EmbeddingAttributes.EMBEDDING_VECTOR))
            text = item.get(EmbeddingAttributes.EMBEDDING_TEXT)
            if numbers is not None:
                candidates.append((model, text if isinstance(text, str) else None, numbers))
    if query is not None:
        wanted = query.strip()
        for model, text, numbers in candidates:
            if text is not None and text.strip() == wanted:
                return QueryEmbedding(model=model, vector=numbers)
    if candidates:
        model, _, numbers = candidates[0]
        return QueryEmbedding(model=model, vector=numbers)
    for span in retrievers:
        for event in span.events:
            if event.name == _Traceloop.QUERY_EMBEDDINGS_EVENT:
                event_vector = _vector(event.attributes.get(_Traceloop.QUERY_EMBEDDINGS_VECTOR))
                if event_vector is not None:
                    return QueryEmbedding(model=None, vector=event_vector)
    return None


def _vector(value: AttrValue) -> tuple[float, ...] | None:
    if not isinstance(value, list) or not value:
        return None
    numbers = [_number(v) for v in value]
    return tuple(n for n in numbers if n is not None) if None not in numbers else None


def _metadata_map(ordered: Sequence[Span]) -> dict[str, Any]:
    """`metadata` JSON objects and OpenLLMetry association properties, merged; earlier spans win."""
    merged: dict[str, Any] = {}
    for span in reversed(ordered):
        parsed = _parse_json(span.attributes.get(SpanAttributes.METADATA))
        if isinstance(parsed, dict):
            merged.update(parsed)
        for key, value in span.attributes.items():
            if key.startswith(_Traceloop.ASSOCIATION_PREFIX):
                merged[key[len(_Traceloop.ASSOCIATION_PREFIX) :]] = value
    return merged


def _tags(ordered: Sequence[Span]) -> dict[str, str]:
    """Tag markers: `regenerate` -> {'regenerate': ''}, `intent:x` -> {'intent': 'x'}; earlier spans win."""
    found: dict[str, str] = {}
    for span in reversed(ordered):
        for tag in _string_list(span.attributes.get(SpanAttributes.TAG_TAGS)):
            name, _, value = tag.partition(":")
            found[name.strip().lower()] = value.strip()
    return found


def _meta_text(meta: dict[str, Any], *keys: str) -> str | None:
    for key in keys:
        value = meta.get(key)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
    return None


def _filter_text(value: AttrValue) -> str | None:
    if isinstance(value, str):
        return value or None
    if isinstance(value, dict | list):
        return json.dumps(_json_safe(value), sort_keys=True)
    return None


def _app_name(resource: Attributes) -> str:
    """`service.name`; Phoenix's project name when the SDK default (`unknown_service...`) was left."""
    service = resource.get(_SERVICE_NAME)
    if isinstance(service, str) and service and not service.startswith(_SDK_DEFAULT_SERVICE):
        return service
    project = resource.get(ResourceAttributes.PROJECT_NAME)
    return project if isinstance(project, str) and project else "unknown"


def _dedupe(chunks: Iterable[Chunk]) -> tuple[Chunk, ...]:
    seen: set[str] = set()
    kept: list[Chunk] = []
    for chunk in chunks:
        if chunk.id not in seen:
            seen.add(chunk.id)
            kept.append(chunk.model_copy(update={"rank": len(kept)}))
    return tuple(kept)


def build_trace(
    spans: Sequence[Span], *, partial: bool, prices: PriceTable, now: datetime | None = None
) -> RagTrace:
    """One `RagTrace` from the spans of one trace (any order; duplicates by span id are ignored).

    Deterministic: the same spans give the same trace, whatever their order or
    how often they were delivered. `now` (default: the current time) only
    bounds the start time: a trace whose spans start more than five minutes in
    the future of `now` (a client clock far ahead) is dated `now`, so it lands
    in the windows and retention of the moment it arrived. Raises ValueError
    for an empty sequence or spans of different traces.
    """
    if not spans:
        raise ValueError("build_trace needs at least one span")
    trace_ids = {s.trace_id for s in spans}
    if len(trace_ids) != 1:
        raise ValueError(f"spans of {len(trace_ids)} traces given; build_trace takes one trace")
    unique: dict[str, Span] = {}
    for span in spans:
        unique.setdefault(span.span_id, span)
    by_start = sorted(unique.values(), key=lambda s: (s.start_ns, s.span_id))
    roots = [s for s in by_start if s.is_root]
    root = roots[0] if roots else None
    ordered = ([root] if root else []) + [s for s in by_start if s is not root]
    tree = _Tree(by_start)
    stages = {s.span_id: span_stage(s) for s in by_start}

    def outermost(stage: Stage) -> list[Span]:
        return [
            s
            for s in by_start
            if stages[s.span_id] == stage and all(stages[a.span_id] != stage for a in tree.ancestors(s))
        ]

    # usage: a span counts unless a same-stage span below it reports usage
    calls = {s.span_id: _span_call(s, stages[s.span_id], prices) for s in by_start}
    shadowed: set[str] = set()
    for span in by_start:
        call = calls[span.span_id]
        if call is not None and (call.input_tokens or call.output_tokens or call.cost is not None):
            shadowed.update(
                a.span_id for a in tree.ancestors(span) if stages[a.span_id] == stages[span.span_id]
            )
    usage = _usage(c for sid, c in calls.items() if c is not None and sid not in shadowed)

    llms = [s for s in by_start if stages[s.span_id] == "llm"]
    retrievers = [s for s in by_start if stages[s.span_id] == "retriever"]
    rerankers = [s for s in by_start if stages[s.span_id] == "reranker"]
    embeddings = [s for s in by_start if stages[s.span_id] == "embedding"]

    # the question and the answer
    query = _span_question(root) if root else None
    if query is None:
        query = _first(retrievers, _span_question)
    if query is None:
        query = _first(rerankers, lambda s: _text(s.attributes, RerankerAttributes.RERANKER_QUERY))
    if query is None:
        query = _first(
            embeddings,
            lambda s: next(
                (
                    str(i[EmbeddingAttributes.EMBEDDING_TEXT])
                    for i in _indexed(s.attributes, SpanAttributes.EMBEDDING_EMBEDDINGS)
                    if isinstance(i.get(EmbeddingAttributes.EMBEDDING_TEXT), str)
                ),
                None,
            ),
        )
    if query is None:
        query = _first(llms, _span_question)
    answer_llm = max(llms, key=lambda s: (s.end_ns, s.start_ns), default=None)
    answer = _span_answer(root) if root else None
    if answer is None:
        answer = _first(sorted(llms, key=lambda s: (s.end_ns, s.start_ns), reverse=True), _span_answer)

    # retrieval
    chunk_lists = {s.span_id: _retrieved(s) for s in retrievers}
    used = [
        s
        for s in retrievers
        if chunk_lists[s.span_id]
        and not any(
            stages[a.span_id] == "retriever" and chunk_lists.get(a.span_id) for a in tree.ancestors(s)
        )
    ]
    first_retriever = used[0] if used else (retrievers[0] if retrievers else None)
    meta = _metadata_map(ordered)
    tags = _tags(ordered)
    k = _first(retrievers, lambda s: _count(s.attributes, *_Traceloop.TOP_K))
    if k is None and isinstance(meta.get("k", meta.get("top_k")), int):
        k = meta.get("k", meta.get("top_k"))
    retrieval = Retrieval(
        retriever=first_retriever.name if first_retriever else None,
        k=k,
        chunks=_dedupe(c for s in used for c in chunk_lists[s.span_id]),
        filter=_first(ordered, lambda s: _filter_text(s.attributes.get(RagmonAttributes.RETRIEVAL_FILTER)))
        or _first(retrievers, lambda s: _filter_text(_text(s.attributes, *_Traceloop.FILTERS))),
        excluded_ids=_first(
            ordered, lambda s: _string_list(s.attributes.get(RagmonAttributes.RETRIEVAL_EXCLUDED_IDS)) or None
        )
        or (),
        reranker_input=tuple(
            _chunks(_indexed(rerankers[0].attributes, RerankerAttributes.RERANKER_INPUT_DOCUMENTS))
            if rerankers
            else ()
        ),
        reranker_output=tuple(
            _chunks(_indexed(rerankers[-1].attributes, RerankerAttributes.RERANKER_OUTPUT_DOCUMENTS))
            if rerankers
            else ()
        ),
    )

    # timings
    def stage_seconds(stage: Stage) -> float | None:
        spans_of_stage = outermost(stage)
        return sum(s.duration_s for s in spans_of_stage) if spans_of_stage else None

    start_ns = by_start[0].start_ns
    total_s = root.duration_s if root else max(0, max(s.end_ns for s in by_start) - start_ns) / 1e9
    timings = Timings(
        total_s=total_s,
        embedding_s=stage_seconds("embedding"),
        retrieval_s=stage_seconds("retriever"),
        rerank_s=stage_seconds("reranker"),
        generation_s=stage_seconds("llm"),
        ttft_s=_ttft(ordered, answer_llm),
    )

    # identity and signals
    resource = (root or by_start[0]).resource
    app = _app_name(resource)
    release = (
        _first(ordered, lambda s: _text(s.attributes, RagmonAttributes.RELEASE))
        or _meta_text(meta, "release")
        or tags.get("release")
        or _text(resource, _SERVICE_VERSION)
    )
    intent = (
        _first(ordered, lambda s: _text(s.attributes, RagmonAttributes.INTENT))
        or _meta_text(meta, "intent", "route")
        or tags.get("intent")
        or tags.get("route")
    )
    regeneration = (
        any(_flag(s.attributes.get(RagmonAttributes.REGENERATION)) for s in ordered)
        or _flag(meta.get("regenerate", meta.get("regeneration")))
        or "regenerate" in tags
        or "regeneration" in tags
    )
    user = _first(ordered, lambda s: _text(s.attributes, SpanAttributes.USER_ID, _ENDUSER_ID)) or _meta_text(
        meta, "user_id"
    )
    start_time = _to_datetime(start_ns)
    reference = now if now is not None else datetime.now(UTC)
    if reference.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    if start_time > reference + _MAX_CLOCK_SKEW:
        start_time = reference.astimezone(UTC)

    return RagTrace(
        trace_id=by_start[0].trace_id,
        tenant=by_start[0].tenant,
        app=app,
        release=release,
        intent=intent or None,
        session_id=_first(
            ordered, lambda s: _text(s.attributes, SpanAttributes.SESSION_ID, _GenAI.CONVERSATION_ID)
        )
        or _meta_text(meta, "session_id"),
        user_hash=hashlib.sha256(user.encode()).hexdigest() if user else None,
        start_time=start_time,
        query=query,
        query_embedding=_query_embedding(embeddings, retrievers, query),
        retrieval=retrieval,
        answer=answer,
        cited_chunk_ids=_first(
            ordered, lambda s: _string_list(s.attributes.get(RagmonAttributes.CITED_CHUNK_IDS)) or None
        )
        or (),
        timings=timings,
        usage=usage,
        is_regeneration=regeneration,
        regeneration_source="attribute" if regeneration else None,
        probe_run_id=_first(ordered, lambda s: _text(s.attributes, RagmonAttributes.PROBE_RUN_ID))
        or _meta_text(meta, "probe_run_id"),
        probe_question_id=_first(ordered, lambda s: _text(s.attributes, RagmonAttributes.PROBE_QUESTION_ID))
        or _meta_text(meta, "probe_question_id"),
        partial=partial,
        span_count=len(by_start),
    )
