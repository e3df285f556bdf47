"""`span_stage`: which RAG stage a span is, by the first convention that says so.

OpenInference's span kind wins; then GenAI's operation name, OpenLLMetry's
request type, a vector-database query (result events, or a span of a known
vector database, or one OpenLIT calls `vectordb`, with a query operation or a
vector query's top-k: OpenLIT names Chroma's `query` `GET`, as it names `get`,
and only the query has a top-k), OpenLLMetry's span kind, and last a model
name, which makes an LLM call. Anything else is "other".
"""

from __future__ import annotations

from typing import Literal

from openinference.semconv.trace import OpenInferenceSpanKindValues, SpanAttributes

from service.conventions.attribute_values import first_count, first_text
from service.conventions.attributes import GenAIAttributes, OpenLITAttributes, TraceloopAttributes
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
    attributes = span.attributes
    system = first_text(attributes, *TraceloopAttributes.DB_SYSTEM)
    if system is None or system.lower() not in _VECTOR_DBS:
        operation_name = attributes.get(GenAIAttributes.OPERATION_NAME)
        if not (isinstance(operation_name, str) and operation_name.lower() == OpenLITAttributes.VECTOR_DB):
            return False
    operation = first_text(attributes, *TraceloopAttributes.DB_OPERATION)
    if operation is not None and operation.lower() in _VECTOR_QUERY_OPERATIONS:
        return True
    return first_count(attributes, *TraceloopAttributes.VECTOR_QUERY_TOP_K) is not None
