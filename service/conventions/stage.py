"""`span_stage`: which RAG stage a span is, by the first convention that says so.

OpenInference's span kind wins; then GenAI's operation name, OpenLLMetry's
request type, a vector-database query (result events, or a known vector
database with a query operation), OpenLLMetry's span kind, and last a model
name, which makes an LLM call. Anything else is "other".
"""

from __future__ import annotations

from typing import Literal

from openinference.semconv.trace import OpenInferenceSpanKindValues, SpanAttributes

from service.conventions.attribute_values import first_text
from service.conventions.attributes import GenAIAttributes, TraceloopAttributes
from service.conventions.spans import Span

__all__ = ["Stage", "span_stage"]

Stage = Literal["llm", "embedding", "retriever", "reranker", "chain", "tool", "other"]

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
    "retrieve": "retriever",
    "vector_db_retrieve": "retriever",  # OpenLLMetry's LangChain retriever spans
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
_RESULT_EVENTS = (TraceloopAttributes.QUERY_RESULT_EVENT, TraceloopAttributes.SEARCH_RESULT_EVENT)


def span_stage(span: Span) -> Stage:
    """Which RAG stage a span is, by the first convention that says so."""
    attributes = span.attributes
    kind = attributes.get(SpanAttributes.OPENINFERENCE_SPAN_KIND)
    if isinstance(kind, str) and kind.upper() in _OPENINFERENCE_STAGES:
        return _OPENINFERENCE_STAGES[kind.upper()]
    for key, table in (
        (GenAIAttributes.OPERATION_NAME, _GENAI_STAGES),
        (TraceloopAttributes.REQUEST_TYPE, _REQUEST_TYPE_STAGES),
    ):
        value = attributes.get(key)
        if isinstance(value, str) and value.lower() in table:
            return table[value.lower()]
    if _is_vector_query(span):
        return "retriever"
    value = attributes.get(TraceloopAttributes.SPAN_KIND)
    if isinstance(value, str) and value.lower() in _TRACELOOP_STAGES:
        return _TRACELOOP_STAGES[value.lower()]
    if first_text(attributes, GenAIAttributes.REQUEST_MODEL, SpanAttributes.LLM_MODEL_NAME):
        return "llm"
    return "other"


def _is_vector_query(span: Span) -> bool:
    if any(e.name in _RESULT_EVENTS for e in span.events):
        return True
    system = first_text(span.attributes, *TraceloopAttributes.DB_SYSTEM)
    operation = first_text(span.attributes, *TraceloopAttributes.DB_OPERATION)
    return (
        system is not None
        and system.lower() in _VECTOR_DBS
        and operation is not None
        and operation.lower() in _VECTOR_QUERY_OPERATIONS
    )
