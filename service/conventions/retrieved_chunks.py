"""The chunks a trace retrieved, put together from the retriever spans `semconv.build_trace` uses.

`merged_with_nested` gives the outermost retriever span's documents the ids and scores a retriever
span nested in it has; `named_by_trace` gives a chunk that has only a content-hash id the id a
LangChain document with the same content carries elsewhere in the trace; `dedupe` keeps the first
chunk of each id.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from openinference.semconv.trace import SpanAttributes

from service.conventions.attribute_values import parse_json
from service.conventions.attributes import TraceloopAttributes
from service.conventions.content import CONTENT_ID_PREFIX, ChunkFields, has_documents, langchain_document
from service.conventions.spans import Span

__all__ = ["dedupe", "merged_with_nested", "named_by_trace"]


def dedupe(documents: Iterable[ChunkFields]) -> list[ChunkFields]:
    seen: set[str] = set()
    kept: list[ChunkFields] = []
    for doc in documents:
        if doc["id"] not in seen:
            seen.add(doc["id"])
            kept.append(doc)
    return kept


# payload attributes that may carry serialised LangChain documents with their ids
_DOCUMENT_PAYLOADS = (
    TraceloopAttributes.ENTITY_OUTPUT,
    TraceloopAttributes.ENTITY_INPUT,
    SpanAttributes.OUTPUT_VALUE,
    SpanAttributes.INPUT_VALUE,
)
_MAX_PAYLOAD_DEPTH = 8


def _documents_in(value: Any, found: dict[str, str], depth: int = 0) -> None:
    """content -> id of every LangChain document with an id inside a parsed payload."""
    if depth > _MAX_PAYLOAD_DEPTH:
        return
    if isinstance(value, list):
        for item in value:
            _documents_in(item, found, depth + 1)
    elif isinstance(value, dict):
        doc = langchain_document(value)
        if doc is not None:
            doc_id, content = doc.get("id"), doc.get("content")
            if isinstance(doc_id, str) and doc_id and isinstance(content, str):
                found.setdefault(content, doc_id)
            return
        for item in value.values():
            _documents_in(item, found, depth + 1)


def named_by_trace(chunks: list[ChunkFields], spans: Sequence[Span]) -> list[ChunkFields]:
    """Chunks that only have a content-hash id, given the id a LangChain document with the same
    content carries elsewhere in the trace: OpenLLMetry's retriever span drops `Document.id`, while
    the chain spans around it serialise whole documents."""
    found: dict[str, str] = {}
    for span in spans:
        for key in _DOCUMENT_PAYLOADS:
            value = span.attributes.get(key)
            if isinstance(value, str) and '"id"' in value and has_documents(value):
                _documents_in(parse_json(value), found)
    if not found:
        return chunks
    return [
        {**doc, "id": found[doc["content"]]}
        if doc["id"].startswith(CONTENT_ID_PREFIX) and doc["content"] in found
        else doc
        for doc in chunks
    ]


def merged_with_nested(outer: list[ChunkFields], inner: list[list[ChunkFields]]) -> list[ChunkFields]:
    """The outer retriever's documents, each with the id and score a nested retriever span gave it.

    DSPy's `Retrieve.forward` span carries only the passages, the `ColBERTv2.__call__` span inside
    it their ids and scores. A document is matched by content, else by position when the nested
    list is as long; what the outer span has itself wins.
    """
    if not inner:
        return outer
    by_content: dict[str, ChunkFields] = {}
    for docs in inner:
        for doc in docs:
            if doc["content"] is not None:
                by_content.setdefault(doc["content"], doc)
    same_length = next((docs for docs in inner if len(docs) == len(outer)), None)
    merged: list[ChunkFields] = []
    for position, doc in enumerate(outer):
        match = None if doc["content"] is None else by_content.get(doc["content"])
        if match is None and same_length is not None:
            match = same_length[position]
        if match is None:
            merged.append(doc)
            continue
        has_id = not doc["id"].startswith(CONTENT_ID_PREFIX)
        merged.append(
            {
                "id": doc["id"] if has_id or match["id"].startswith(CONTENT_ID_PREFIX) else match["id"],
                "score": doc["score"] if doc["score"] is not None else match["score"],
                "content": doc["content"] if doc["content"] is not None else match["content"],
                "metadata": doc["metadata"] if doc["metadata"] is not None else match["metadata"],
            }
        )
    return merged
