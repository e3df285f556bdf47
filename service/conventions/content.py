"""What one span carries: chat messages, the question and the answer, documents, embedded texts.

Everything here reads attribute values an app sent (through the readers of
`attribute_values.py`), so nothing here raises for a value of the wrong shape:
a reader returns None (or an empty result) and the caller falls back to the
next convention.

`SpanContent` wraps one span. Its flattened lists (`prefix.N.rest`, such as
`retrieval.documents.0.document.id`) are laid out once per attribute-key
sequence, not once per span: an instrumentation writes the same keys for every
span of a kind, so a span costs one cache lookup, and the first span of a kind
one pass over its keys.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterable, Sequence
from operator import methodcaller
from typing import Any, Literal, TypedDict

from openinference.semconv.trace import (
    DocumentAttributes,
    EmbeddingAttributes,
    MessageAttributes,
    MessageContentAttributes,
    OpenInferenceMimeTypeValues,
    SpanAttributes,
)
from pydantic import JsonValue

from service.conventions.attribute_values import indexed, json_object, json_safe, number, parse_json, vector
from service.conventions.attributes import GenAIAttributes, PydanticAIAttributes, TraceloopAttributes
from service.conventions.spans import Attributes, AttrValue, Span

__all__ = [
    "CONTENT_ID_PREFIX",
    "ChunkFields",
    "SpanContent",
    "content_id",
    "has_documents",
    "langchain_document",
    "ranked",
]

_QUERY_KEYS = ("query", "question", "input", "user_input", "q", "prompt", "text", "content", "messages")
_QUERY_CONTAINERS = ("inputs", "kwargs", "args")
_ANSWER_KEYS = ("answer", "output", "result", "response", "text", "content", "choices", "message", "messages")
_ANSWER_CONTAINERS = ("outputs", "generations")
_TEXT_MIME = OpenInferenceMimeTypeValues.TEXT.value
_JSON_MIME = OpenInferenceMimeTypeValues.JSON.value

# the longest vector read out of a JSON payload: the decoder's limit for vector attributes
# (`service/ingest/otlp.py` MAX_VECTOR_LENGTH), which never sees inside a JSON string
_MAX_JSON_VECTOR_LENGTH = 65_536

_DOC_PREFIX = "document."
_DOC_ID = DocumentAttributes.DOCUMENT_ID.removeprefix(_DOC_PREFIX)
_DOC_SCORE = DocumentAttributes.DOCUMENT_SCORE.removeprefix(_DOC_PREFIX)
_DOC_CONTENT = DocumentAttributes.DOCUMENT_CONTENT.removeprefix(_DOC_PREFIX)
_DOC_METADATA = DocumentAttributes.DOCUMENT_METADATA.removeprefix(_DOC_PREFIX)
_strip_doc_prefix = methodcaller("removeprefix", _DOC_PREFIX)

# ---------------------------------------------------------------- messages and payloads


def _message_text(message: dict[str, Any]) -> str | None:
    content = message.get("content", message.get(MessageAttributes.MESSAGE_CONTENT))
    if isinstance(content, str) and content.strip():
        return content
    parts = content if isinstance(content, list) else message.get("parts")
    texts: list[str] = []
    if isinstance(parts, list):
        for part in parts:
            if isinstance(part, dict):
                part_text = part.get("text", part.get("content"))
                if isinstance(part_text, str):
                    texts.append(part_text)
    texts.extend(
        item_text
        for item in indexed(message, MessageAttributes.MESSAGE_CONTENTS)
        if isinstance(item_text := item.get(MessageContentAttributes.MESSAGE_CONTENT_TEXT), str)
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
        # OpenLLMetry writes "unknown" where the LangChain message had no role it maps
        if _role(message) in ("", "assistant", "ai", "model", "unknown"):
            found = _message_text(message)
            if found:
                return found
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
    return _find_text(parse_json(value), keys, containers, role)


def _io_text(attributes: Attributes, value_key: str, mime_key: str, role: str) -> str | None:
    """`input.value` / `output.value`: plain text as sent when the mime type says so, else parsed."""
    value = attributes.get(value_key)
    mime = attributes.get(mime_key)
    if isinstance(value, str) and mime == _TEXT_MIME:
        return value if value.strip() else None
    return _payload_text(value, role, is_json=mime == _JSON_MIME)


# ---------------------------------------------------------------- documents


class ChunkFields(TypedDict):
    """A document read from a span: the fields of a `Chunk` but its rank, which its list gives it."""

    id: str
    score: float | None
    content: str | None
    metadata: dict[str, JsonValue] | None


# the id of a document that came with none: a hash of its content
CONTENT_ID_PREFIX = "sha256:"
# where a document without an id of its own may name it in its metadata, in order
_METADATA_ID_KEYS = ("id", "doc_id", "document_id", "chunk_id")
# where a document without a score of its own may carry it in its metadata, in order: LangChain's
# docs put a retriever's scores there (`metadata["score"]`, as LangChain.js apps send them), its
# rerankers (Cohere, FlashRank) `relevance_score`
_METADATA_SCORE_KEYS = ("score", "relevance_score")


def content_id(content: str) -> str:
    """The id of a document that came with none: `sha256:` and 16 hex digits of its content's hash."""
    return CONTENT_ID_PREFIX + hashlib.sha256(content.encode()).hexdigest()[:16]


def has_documents(payload: str) -> bool:
    """Whether a payload may hold LangChain documents (Python's or LangChain.js's field name): a
    cheap test before parsing it."""
    return "page_content" in payload or "pageContent" in payload


def _given_id(raw_id: Any) -> str | None:
    if isinstance(raw_id, str) and raw_id:
        return raw_id
    if isinstance(raw_id, int) and not isinstance(raw_id, bool):
        return str(raw_id)
    return None


def _doc_id(raw_id: AttrValue, content: str | None, rank: int, metadata: dict[str, Any] | None) -> str:
    found = _given_id(raw_id)
    if found is not None:
        return found
    for key in _METADATA_ID_KEYS if metadata else ():
        found = _given_id(metadata.get(key))  # type: ignore[union-attr]
        if found is not None:
            return found
    if content:
        # Stable across redeliveries, so a chunk without an id still joins with its judgments.
        return content_id(content)
    return f"#{rank}"


def _doc_score(raw_score: AttrValue, metadata: dict[str, Any] | None) -> float | None:
    score = number(raw_score)
    if score is not None or not metadata:
        return score
    for key in _METADATA_SCORE_KEYS:
        score = number(metadata.get(key))
        if score is not None:
            return score
    return None


def _documents(docs: Iterable[dict[str, AttrValue]]) -> list[ChunkFields]:
    fields: list[ChunkFields] = []
    for rank, raw in enumerate(docs):
        # `document.id` and `id` are the same field; as in any dict, the later key wins
        doc = dict(zip(map(_strip_doc_prefix, raw), raw.values(), strict=True))
        content = doc.get(_DOC_CONTENT, doc.get("text"))
        content = content if isinstance(content, str) else None
        metadata = json_object(doc.get(_DOC_METADATA))
        fields.append(
            {
                "id": _doc_id(doc.get(_DOC_ID), content, rank, metadata),
                "score": _doc_score(doc.get(_DOC_SCORE), metadata),
                "content": content,
                "metadata": metadata,
            }
        )
    return fields


def _payload_documents(value: AttrValue) -> list[dict[str, AttrValue]]:
    """Documents in a retriever's JSON output: `{"documents": [...]}` (OpenInference LangChain's
    `output.value`, OpenLLMetry's `traceloop.entity.output`) or a bare list, each a LangChain
    `Document` (`page_content`, or LangChain.js's `pageContent`, `metadata`, maybe `id`), also in its
    serialised form (`kwargs`)."""
    parsed = parse_json(value)
    if isinstance(parsed, dict):
        parsed = parsed.get("documents")
    if not isinstance(parsed, list):
        return []
    docs: list[dict[str, AttrValue]] = []
    for item in parsed:
        doc = langchain_document(item)
        if doc is None:
            return []  # not a document list: a payload of some other shape
        docs.append(doc)
    return docs


def langchain_document(item: Any) -> dict[str, AttrValue] | None:
    """A LangChain `Document` (plain or serialised with `lc`/`kwargs`; Python's `page_content` or
    LangChain.js's `pageContent`) as document fields; else None."""
    if not isinstance(item, dict):
        return None
    kwargs = item.get("kwargs")
    if isinstance(kwargs, dict) and ("page_content" in kwargs or "pageContent" in kwargs):
        item = kwargs
    content = item.get("page_content", item.get("pageContent"))
    if not isinstance(content, str):
        return None
    metadata = item.get("metadata")
    return {
        _DOC_ID: item.get("id"),
        _DOC_SCORE: item.get("score"),
        _DOC_CONTENT: content,
        _DOC_METADATA: json.dumps(json_safe(metadata)) if isinstance(metadata, dict) and metadata else None,
    }


def _with_payload_ids(docs: list[dict[str, AttrValue]], payload: list[dict[str, AttrValue]]) -> None:
    """Fill ids (and metadata) the attribute list lacks from the same span's payload documents, by
    position, where the contents agree (OpenInference LangChain sends ids only in `output.value`)."""
    for doc, extra in zip(docs, payload, strict=False):
        fields = {_strip_doc_prefix(k): v for k, v in doc.items()}
        if _given_id(fields.get(_DOC_ID)) is not None:
            continue
        if fields.get(_DOC_CONTENT) not in (None, extra.get(_DOC_CONTENT)):
            continue
        doc[_DOC_ID] = extra.get(_DOC_ID)
        if fields.get(_DOC_METADATA) is None and extra.get(_DOC_METADATA) is not None:
            doc[_DOC_METADATA] = extra[_DOC_METADATA]


def ranked(docs: Iterable[ChunkFields]) -> list[dict[str, Any]]:
    """`Chunk` fields of documents ranked in the order given, ready for validation."""
    return [{**doc, "rank": rank} for rank, doc in enumerate(docs)]


def _event_documents(span: Span) -> list[dict[str, AttrValue]]:
    """OpenLLMetry vector-DB result events as documents; a distance stands in for a missing score."""
    docs: list[dict[str, AttrValue]] = []
    for event in span.events:
        if event.name == TraceloopAttributes.QUERY_RESULT_EVENT:
            prefix = TraceloopAttributes.QUERY_RESULT_EVENT + "."
        elif event.name == TraceloopAttributes.SEARCH_RESULT_EVENT:
            prefix = TraceloopAttributes.SEARCH_RESULT_EVENT + "."
            if number(event.attributes.get("db.search.query.id")) not in (None, 0.0):
                continue  # multi-vector search: only the first query's hits answer this request
        else:
            continue
        a = event.attributes
        score = a.get(prefix + "score")
        metadata = parse_json(a.get(prefix + "metadata", a.get(prefix + "entity")))
        if score is None and a.get(prefix + "distance") is not None:
            score = a.get(prefix + "distance")
            metadata = {**(metadata if isinstance(metadata, dict) else {}), "ragmon.score_kind": "distance"}
        docs.append(
            {
                _DOC_ID: a.get(prefix + "id", a.get("id")),
                _DOC_SCORE: score,
                _DOC_CONTENT: a.get(prefix + "document"),
                _DOC_METADATA: json.dumps(json_safe(metadata)) if isinstance(metadata, dict) else None,
            }
        )
    return docs


# ---------------------------------------------------------------- one span

# How the flattened lists of a span are laid out depends only on its attribute keys, and an
# instrumentation writes the same keys, in the same order, for every span of a kind. So the layout
# is worked out once per key sequence and kept; bounded, since keys come from outside, by starting
# over when full. A layout maps a list prefix to its items in index order, each item as the keys
# to read and the field names to read them into.
_Layout = dict[str, list[tuple[tuple[str, ...], tuple[str, ...]]]]
_LAYOUTS: dict[tuple[str, ...], _Layout] = {}
_LAYOUTS_LIMIT = 2048


def _layout(keys: tuple[str, ...]) -> _Layout:
    """Every `a.b.N.rest` key grouped under its two-segment prefix `a.b`, then by N, in key order.

    For a prefix of two segments these are exactly the keys `indexed` takes, and
    every list ragmon reads from span attributes has such a prefix.
    """
    grouped: dict[str, dict[int, tuple[list[str], list[str]]]] = {}
    for key in keys:
        parts = key.split(".", 3)
        if len(parts) == 4 and parts[3] and parts[2].isdecimal():
            item = grouped.setdefault(parts[0] + "." + parts[1], {}).setdefault(int(parts[2]), ([], []))
            item[0].append(key)
            item[1].append(parts[3])
    layout = {
        prefix: [(tuple(items[i][0]), tuple(items[i][1])) for i in sorted(items)]
        for prefix, items in grouped.items()
    }
    if len(_LAYOUTS) >= _LAYOUTS_LIMIT:
        _LAYOUTS.clear()
    _LAYOUTS[keys] = layout
    return layout


class SpanContent:
    """The content of one span, read on demand; its flattened lists are grouped in one pass, on first use."""

    __slots__ = ("_layout", "attributes", "model_call_events", "span")

    def __init__(self, span: Span, *, model_call_events: bool = True) -> None:
        """`model_call_events`: read messages from the span's events (GenAI log events, OpenLLMetry's
        prompt events); False for a span that is not a model call, to which such an event was only
        misattributed (OpenLIT logs a streamed call's details after its span ended, in the span
        around it)."""
        self.span = span
        self.attributes = span.attributes
        self.model_call_events = model_call_events
        self._layout: _Layout | None = None

    def indexed(self, prefix: str) -> list[dict[str, AttrValue]]:
        """Same as `indexed(span.attributes, prefix)`."""
        attributes = self.attributes
        structured = attributes.get(prefix)
        if isinstance(structured, list):
            return [item for item in structured if isinstance(item, dict)]
        if prefix.count(".") != 1:
            return indexed(attributes, prefix)
        layout = self._layout
        if layout is None:
            keys = tuple(attributes)
            layout = _LAYOUTS.get(keys)
            if layout is None:
                layout = _layout(keys)
            self._layout = layout
        items = layout.get(prefix)
        if not items:
            return []
        get = attributes.__getitem__
        # a repeated field name (`0.x` and `00.x`) keeps its first place and its last value, as
        # assigning the keys one by one would
        return [dict(zip(names, map(get, keys), strict=True)) for keys, names in items]

    def messages(self, direction: Literal["input", "output"]) -> list[dict[str, Any]]:
        """Chat messages sent (`input`) or received (`output`), under the first convention that has any."""
        attributes = self.attributes
        if direction == "input":
            oi_key, genai_key, prefix = (
                SpanAttributes.LLM_INPUT_MESSAGES,
                GenAIAttributes.INPUT_MESSAGES,
                TraceloopAttributes.PROMPT_PREFIX,
            )
        else:
            oi_key, genai_key, prefix = (
                SpanAttributes.LLM_OUTPUT_MESSAGES,
                GenAIAttributes.OUTPUT_MESSAGES,
                TraceloopAttributes.COMPLETION_PREFIX,
            )
        found: list[dict[str, Any]] = [
            {k.removeprefix("message."): v for k, v in m.items()} for m in self.indexed(oi_key)
        ]
        if found:
            return found
        parsed = parse_json(attributes.get(genai_key))
        if isinstance(parsed, list) and parsed:
            return [m for m in parsed if isinstance(m, dict)]
        listed = self.indexed(prefix)
        if listed:
            return listed
        found = []
        for event in self.span.events if self.model_call_events else ():
            for key in (
                genai_key,
                GenAIAttributes.PROMPT if direction == "input" else GenAIAttributes.COMPLETION,
            ):
                parsed = parse_json(event.attributes.get(key))
                if isinstance(parsed, list) and parsed:
                    return [m for m in parsed if isinstance(m, dict)]
            wanted = (
                GenAIAttributes.EVENT_USER_MESSAGE if direction == "input" else GenAIAttributes.EVENT_CHOICE
            )
            if event.name == wanted:
                message = parse_json(event.attributes.get("message", event.attributes.get("content")))
                if isinstance(message, dict):
                    found.append(message)
                elif isinstance(message, str):
                    found.append(
                        {"role": "user" if direction == "input" else "assistant", "content": message}
                    )
        return found

    def question(self) -> str | None:
        """The user's question as this span records it."""
        attributes = self.attributes
        found = _pick_message(self.messages("input"), "user")
        if found:
            return found
        prompts = self.indexed(SpanAttributes.LLM_PROMPTS)
        if prompts and isinstance(prompts[-1].get("prompt.text"), str):
            return str(prompts[-1]["prompt.text"])
        found = _io_text(attributes, SpanAttributes.INPUT_VALUE, SpanAttributes.INPUT_MIME_TYPE, "user")
        for key in (TraceloopAttributes.ENTITY_INPUT, GenAIAttributes.RETRIEVAL_QUERY_TEXT):
            found = found or _payload_text(
                attributes.get(key), "user", is_json=key == TraceloopAttributes.ENTITY_INPUT
            )
        return found

    def answer(self) -> str | None:
        """The answer as this span records it."""
        attributes = self.attributes
        found = _pick_message(self.messages("output"), "assistant")
        if found:
            return found
        choices = self.indexed(SpanAttributes.LLM_CHOICES)
        if choices and isinstance(choices[0].get("completion.text"), str):
            return str(choices[0]["completion.text"])
        found = _io_text(
            attributes, SpanAttributes.OUTPUT_VALUE, SpanAttributes.OUTPUT_MIME_TYPE, "assistant"
        )
        return found or _payload_text(
            attributes.get(TraceloopAttributes.ENTITY_OUTPUT), "assistant", is_json=True
        )

    def documents(self, prefix: str) -> list[ChunkFields]:
        """The documents of a flattened OpenInference document list (`retrieval.documents`, ...)."""
        return _documents(self.indexed(prefix))

    def retrieved(self) -> list[ChunkFields]:
        """What a retriever span returned, by the first convention that has documents (the table in
        `semconv.py`): OpenInference's list (ids filled from the span's payload documents), GenAI's
        JSON, vector-DB result events, then the payload documents alone (OpenLLMetry)."""
        attributes = self.attributes
        docs = [dict(d) for d in self.indexed(SpanAttributes.RETRIEVAL_DOCUMENTS)]
        payload: list[dict[str, AttrValue]] | None = None
        if docs and not all(_given_id(d.get(DocumentAttributes.DOCUMENT_ID, d.get(_DOC_ID))) for d in docs):
            payload = self._payload_documents()
            _with_payload_ids(docs, payload)
        if not docs:
            parsed = parse_json(attributes.get(GenAIAttributes.RETRIEVAL_DOCUMENTS))
            docs = [d for d in parsed if isinstance(d, dict)] if isinstance(parsed, list) else []
        if not docs:
            docs = _event_documents(self.span)
        if not docs:
            docs = payload if payload is not None else self._payload_documents()
        return _documents(docs)

    def _payload_documents(self) -> list[dict[str, AttrValue]]:
        for key in (
            SpanAttributes.OUTPUT_VALUE,
            TraceloopAttributes.ENTITY_OUTPUT,
            TraceloopAttributes.TASK_OUTPUT,
        ):
            value = self.attributes.get(key)
            if isinstance(value, str) and has_documents(value):  # cheap test before parsing
                found = _payload_documents(value)
                if found:
                    return found
        return []

    def embedded_texts(self) -> list[tuple[str | None, tuple[float, ...] | None]]:
        """(text, vector) of each input of an embedding span, in order: OpenInference's
        `embedding.embeddings`, else Pydantic AI's `inputs` (with the vectors of a query's span),
        else GenAI input messages (OpenLIT; no vectors)."""
        found: list[tuple[str | None, tuple[float, ...] | None]] = [
            (
                item_text
                if isinstance(item_text := item.get(EmbeddingAttributes.EMBEDDING_TEXT), str)
                else None,
                vector(item.get(EmbeddingAttributes.EMBEDDING_VECTOR)),
            )
            for item in self.indexed(SpanAttributes.EMBEDDING_EMBEDDINGS)
        ]
        if found:
            return found
        attributes = self.attributes
        inputs = parse_json(attributes.get(PydanticAIAttributes.EMBEDDING_INPUTS))
        if isinstance(inputs, list) and inputs:
            texts = [text if isinstance(text, str) else None for text in inputs]
            return list(zip(texts, self._query_vectors(len(texts)), strict=True))
        return [(_message_text(m), None) for m in self.messages("input")]

    def _query_vectors(self, count: int) -> list[tuple[float, ...] | None]:
        """Pydantic AI's `embeddings` (a JSON list of vectors) of a query's span, one per input; only a
        query's are read (ragmon keeps the query's vector), so a corpus' are never parsed."""
        attributes = self.attributes
        if attributes.get(PydanticAIAttributes.EMBEDDING_INPUT_TYPE) != PydanticAIAttributes.QUERY_INPUT:
            return [None] * count
        parsed = parse_json(attributes.get(PydanticAIAttributes.EMBEDDING_VECTORS))
        if not isinstance(parsed, list) or len(parsed) != count:
            return [None] * count
        return [
            vector(item) if isinstance(item, list) and len(item) <= _MAX_JSON_VECTOR_LENGTH else None
            for item in parsed
        ]
