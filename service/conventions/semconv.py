"""Semantic-convention mapping: the decoded spans of one trace -> one `RagTrace`.

`build_trace` reads OpenInference, OpenTelemetry GenAI and OpenLLMetry spans
side by side, plus ragmon's own `ragmon.*` attributes; `attributes.py`
lists the names, `content.py` reads messages, payloads, documents and
vectors out of one span. This module decides what the trace is: which stage
each span is, which span's value wins, and how stages roll up.

Precedence: the root span's value wins over other spans'. The OpenInference
`metadata` attribute (a JSON object string) may carry the same facts as
`intent` (or `route`), `release`, `regenerate`, `probe_run_id` and
`probe_question_id`; `tag.tags` may carry `regenerate`, `intent:<x>`,
`route:<x>` and `release:<x>`. Explicit `ragmon.*` attributes win over
metadata, metadata over tags, and `ragmon.release`/metadata/tag over the
resource's `service.version`.

The app is the resource's `service.name`; when the SDK default
(`unknown_service:...`) was left in place, Phoenix's `openinference.project.name`
(what `phoenix.otel.register(project_name=...)` sets), else "unknown".

Where each field comes from, first source first (the README has the same, per library):

  =================  ==========================================================================
  field              sources, in order
  =================  ==========================================================================
  stage of a span    OpenInference span kind; GenAI `gen_ai.operation.name` (`retrieval`,
                     `retrieve`, OpenLLMetry's `vector_db_retrieve`, `chat`, `embeddings`, ...);
                     `llm.request.type`; a vector-DB query; `traceloop.span.kind`; a model name
  kind of trace      request: a retriever, reranker or LLM span; embedding: embedding spans and
                     none of those; other: nothing RAG; a question or answer alone makes a request
  query              root span's question (messages, `input.value`, `traceloop.entity.input`,
                     `gen_ai.retrieval.query.text`); a retriever's; the reranker query; the first
                     embedded text; an LLM span's last user message (also from GenAI log events)
  answer             root span's answer; the latest-ending LLM span's (output messages, also from
                     `gen_ai.choice` / `...operation.details` log events, `output.value`,
                     `traceloop.entity.output`)
  documents          of the outermost retriever span that has any (ids and scores it lacks from
                     a retriever span nested in it, by content, else by position): OpenInference
                     `retrieval.documents`; GenAI `gen_ai.retrieval.documents`; vector-DB result
                     events; payload documents (`output.value`, `traceloop.entity.output`,
                     `gen_ai.task.output`: LangChain `{"documents": [...]}`)
  chunk id           the document's id; for OpenInference documents without one, the id of the
                     payload document at the same position with the same content; the metadata's
                     `id`, `doc_id`, `document_id`, `chunk_id`; a LangChain document with the same
                     content serialised anywhere in the trace; `sha256:` of the content
  k                  a retriever's `gen_ai.request.top_k`, `gen_ai.retrieval.top_k`,
                     `db.vector.query.top_k` or vector-DB keys; metadata `k` / `top_k`
  TTFT               `ragmon.ttft_ms`; `gen_ai.response.time_to_first_chunk`,
                     `gen_ai.client.operation.time_to_first_chunk` (Pydantic AI),
                     `gen_ai.server.time_to_first_token` on a streamed call (OpenLIT) or a
                     first-token event on the latest-ending LLM span that has one
  generation time    outermost LLM spans, each until its last streaming event if that is later
  =================  ==========================================================================

Stage roll-ups avoid double counting when instrumentations nest (a LangChain
LLM span around the OpenAI SDK's LLM span): a stage's time sums only the
outermost spans of that stage, and token usage is taken from a span only when
no span of the same stage below it reports usage.

`attribute_kind`, `embedding_model_of` and `RagmonAttributes` live in
`attributes.py` and are re-exported here for the decoder and for apps.
`joined_spans.py` joins log events to their spans (and gives parent chains and
the revision), `retrieved_chunks.py` merges nested retrievers' documents, names
content-hash chunks by the trace's LangChain documents and drops duplicates.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from operator import attrgetter
from typing import Any, TypeVar

from openinference.semconv.resource import ResourceAttributes
from openinference.semconv.trace import (
    RerankerAttributes,
    SpanAttributes,
)

from service.conventions.attribute_values import (
    filter_text,
    first_count,
    first_text,
    flag,
    number,
    parse_json,
    string_list,
    vector,
)
from service.conventions.attributes import (
    SDK_DEFAULT_SERVICE,
    AttributeKind,
    GenAIAttributes,
    OpenLITAttributes,
    PydanticAIAttributes,
    RagmonAttributes,
    TraceloopAttributes,
    attribute_kind,
    embedding_model_of,
)
from service.conventions.content import CONTENT_ID_PREFIX, SpanContent, ranked
from service.conventions.joined_spans import ancestors_of, revision_of, with_log_events
from service.conventions.pricing import PriceTable
from service.conventions.retrieved_chunks import dedupe, merged_with_nested, named_by_trace
from service.conventions.spans import Attributes, LogEvent, Span
from service.conventions.stage import Stage, span_stage
from service.conventions.usage import Call, span_call, usage_rows
from service.conventions.user_hash import user_hash
from service.model import QueryEmbedding, RagTrace, TraceKind

__all__ = [
    "AttributeKind",
    "RagmonAttributes",
    "Stage",
    "attribute_kind",
    "build_trace",
    "embedding_model_of",
    "span_stage",
]

_T = TypeVar("_T")

# openinference-instrumentation-openai (and -llama-index) on streaming calls; OpenLLMetry's chunk event
_FIRST_TOKEN_EVENTS = ("First Token Stream Event", TraceloopAttributes.COMPLETION_CHUNK_EVENT)
_SERVICE_NAME = "service.name"
_SERVICE_VERSION = "service.version"
_ENDUSER_ID = "enduser.id"
_MAX_CLOCK_SKEW = timedelta(minutes=5)
_BY_START = attrgetter("start_ns", "span_id")
_BY_END = attrgetter("end_ns", "start_ns")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# Every attribute read from any span of the trace (identity, signals, ragmon's own); a span with
# none of them is skipped by those readers at once.
_TRACE_KEYS = frozenset(
    {
        *(value for name, value in vars(RagmonAttributes).items() if name.isupper()),
        SpanAttributes.USER_ID,
        _ENDUSER_ID,
        SpanAttributes.SESSION_ID,
        GenAIAttributes.CONVERSATION_ID,
        SpanAttributes.METADATA,
        SpanAttributes.TAG_TAGS,
    }
)
_ASSOCIATION_KEY = re.compile(re.escape(TraceloopAttributes.ASSOCIATION_PREFIX)).match


# ---------------------------------------------------------------- trace-wide readers


def _first(spans: Iterable[_T], reader: Callable[[_T], Any]) -> Any:
    for span in spans:
        value = reader(span)
        if value is not None:
            return value
    return None


def _first_text(spans: Iterable[Span], *keys: str) -> str | None:
    for span in spans:
        value = first_text(span.attributes, *keys)
        if value is not None:
            return value
    return None


def _first_string_list(spans: Iterable[Span], key: str) -> tuple[str, ...]:
    for span in spans:
        value = span.attributes.get(key)
        if value is not None:
            found = string_list(value)
            if found:
                return found
    return ()


def _first_token_s(span: Span) -> float | None:
    """Seconds from the span's start to its first streamed token, as the span records it."""
    attributes = span.attributes
    for key in (GenAIAttributes.TIME_TO_FIRST_CHUNK, PydanticAIAttributes.TIME_TO_FIRST_CHUNK):
        seconds = number(attributes.get(key))
        if seconds is not None and seconds >= 0:
            return seconds
    # OpenLIT writes this on every call: only a streamed one had a first token before its last
    if flag(attributes.get(OpenLITAttributes.REQUEST_STREAM)):
        seconds = number(attributes.get(OpenLITAttributes.SERVER_TIME_TO_FIRST_TOKEN))
        if seconds is not None and seconds >= 0:
            return seconds
    for event in span.events:
        if event.name in _FIRST_TOKEN_EVENTS and event.time_ns >= span.start_ns:
            return (event.time_ns - span.start_ns) / 1e9
    return None


def _ttft(ordered: Sequence[Span], llms_by_end: Sequence[Span]) -> float | None:
    """ragmon's own attribute, else the answering LLM span's first token, else that of the latest LLM
    span that records one (LlamaIndex records it on a span nested in the answering one)."""
    ms = _first(ordered, lambda s: number(s.attributes.get(RagmonAttributes.TTFT_MS)))
    if ms is not None and ms >= 0:
        return float(ms) / 1000
    seconds: float | None = _first(llms_by_end, _first_token_s)
    return seconds


def _streamed_end_ns(span: Span, below: Iterable[Span]) -> int:
    """When an LLM call really ended: its span's end, or later when it (or an LLM span below it)
    recorded a streaming event after that end: LlamaIndex ends a streaming call's span when the
    stream is handed out, and its first-token event comes after."""
    end = span.end_ns
    for s in (span, *below):
        for event in s.events:
            end = max(end, event.time_ns)
    return end


def _query_embedding(
    embeddings: Sequence[SpanContent], retrievers: Sequence[Span], query: str | None
) -> QueryEmbedding | None:
    """The vector embedded from the query's text, else the first one.

    Built with `model_construct`, which skips validation: that is safe because
    `vector` only returns tuples of finite, exact floats and `embedding_model_of`
    only a non-empty string or None, exactly what validation would produce, and
    it saves checking every float of the vector a second time.
    """
    candidates: list[tuple[str | None, str | None, tuple[float, ...]]] = []
    for content in embeddings:
        model = embedding_model_of(content.attributes)
        for text, numbers in content.embedded_texts():
            if numbers is not None:
                candidates.append((model, text, numbers))
    if query is not None:
        wanted = query.strip()
        for model, text, numbers in candidates:
            if text is not None and text.strip() == wanted:
                return QueryEmbedding.model_construct(model=model, vector=numbers)
    if candidates:
        model, _, numbers = candidates[0]
        return QueryEmbedding.model_construct(model=model, vector=numbers)
    for span in retrievers:
        for event in span.events:
            if event.name == TraceloopAttributes.QUERY_EMBEDDINGS_EVENT:
                event_vector = vector(event.attributes.get(TraceloopAttributes.QUERY_EMBEDDINGS_VECTOR))
                if event_vector is not None:
                    return QueryEmbedding.model_construct(model=None, vector=event_vector)
    return None


def _first_embedded_text(content: SpanContent) -> str | None:
    return next((text for text, _ in content.embedded_texts() if text is not None), None)


def _metadata_map(ordered: Sequence[Span]) -> dict[str, Any]:
    """`metadata` JSON objects and OpenLLMetry association properties, merged; earlier spans win."""
    start = len(TraceloopAttributes.ASSOCIATION_PREFIX)
    merged: dict[str, Any] = {}
    for span in reversed(ordered):
        attributes = span.attributes
        value = attributes.get(SpanAttributes.METADATA)
        if value is not None:
            parsed = parse_json(value)
            if isinstance(parsed, dict):
                merged.update(parsed)
        for key in filter(_ASSOCIATION_KEY, attributes):  # a native scan: most spans have none
            merged[key[start:]] = attributes[key]
    return merged


def _tags(ordered: Sequence[Span]) -> dict[str, str]:
    """Tag markers: `regenerate` -> {'regenerate': ''}, `intent:x` -> {'intent': 'x'}; earlier spans win."""
    found: dict[str, str] = {}
    for span in reversed(ordered):
        value = span.attributes.get(SpanAttributes.TAG_TAGS)
        if value is None:
            continue
        for tag in string_list(value):
            name, _, tag_value = tag.partition(":")
            found[name.strip().lower()] = tag_value.strip()
    return found


def _meta_text(meta: dict[str, Any], *keys: str) -> str | None:
    for key in keys:
        value = meta.get(key)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
    return None


def _app_name(resource: Attributes) -> str:
    """`service.name`; Phoenix's project name when the SDK default (`unknown_service...`) was left."""
    service = resource.get(_SERVICE_NAME)
    if isinstance(service, str) and service and not service.startswith(SDK_DEFAULT_SERVICE):
        return service
    project = resource.get(ResourceAttributes.PROJECT_NAME)
    return project if isinstance(project, str) and project else "unknown"


def _kind(of_stage: dict[Stage, list[Span]], query: str | None, answer: str | None) -> TraceKind:
    """Whether a trace is a user's request (see `TraceKind`).

    A request retrieves, reranks or generates. A trace that does none of that
    is not one: with embedding calls it is index building or batch embedding
    (LlamaIndex embeds the corpus in-process), else other work such as a
    health check. One exception: a trace without embedding calls that records a
    question or an answer (an app that instruments only its top-level
    function) is a request.
    """
    if of_stage.get("retriever") or of_stage.get("reranker") or of_stage.get("llm"):
        return "request"
    if of_stage.get("embedding"):
        return "embedding"
    return "request" if query is not None or answer is not None else "other"


# ---------------------------------------------------------------- the trace


def build_trace(
    spans: Sequence[Span | LogEvent], *, partial: bool, prices: PriceTable, now: datetime | None = None
) -> RagTrace:
    """One `RagTrace` from the spans of one trace (any order; duplicates by span id are ignored),
    and the events of its spans that arrived as log records (`LogEvent`, joined by span id).

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
    for span in with_log_events(spans):
        unique.setdefault(span.span_id, span)
    by_start = sorted(unique.values(), key=_BY_START)
    root = next((s for s in by_start if not s.parent_span_id), None)
    ordered = ([root] if root else []) + [s for s in by_start if s is not root]
    stages = {s.span_id: span_stage(s) for s in by_start}
    # (span, its stage, its ancestors' stages) for every span, computed once for all nesting rules
    ancestors = {s.span_id: ancestors_of(s, unique) for s in by_start}
    # a model call's events describe that call: on a span of another stage they were misattributed
    contents = {s.span_id: SpanContent(s, model_call_events=stages[s.span_id] == "llm") for s in by_start}
    of_stage: dict[Stage, list[Span]] = {}
    for span in by_start:
        of_stage.setdefault(stages[span.span_id], []).append(span)
    llms = of_stage.get("llm", [])
    retrievers = of_stage.get("retriever", [])
    rerankers = of_stage.get("reranker", [])
    embeddings = of_stage.get("embedding", [])

    def outermost(stage: Stage) -> list[Span]:
        return [
            s
            for s in of_stage.get(stage, ())
            if all(stages[a.span_id] != stage for a in ancestors[s.span_id])
        ]

    # usage: a span counts unless a same-stage span below it reports usage
    calls: dict[str, Call] = {}
    shadowed: set[str] = set()
    for span in by_start:
        stage = stages[span.span_id]
        if stage == "llm" or stage == "embedding" or stage == "reranker":
            call = span_call(span, stage, prices)
            if call is None:
                continue
            calls[span.span_id] = call
            if call.input_tokens or call.output_tokens or call.cost is not None:
                shadowed.update(a.span_id for a in ancestors[span.span_id] if stages[a.span_id] == stage)
    usage = usage_rows(c for sid, c in calls.items() if sid not in shadowed)

    # the question and the answer
    query = contents[root.span_id].question() if root else None
    if query is None:
        query = _first(retrievers, lambda s: contents[s.span_id].question())
    if query is None:
        query = _first_text(rerankers, RerankerAttributes.RERANKER_QUERY)
    if query is None:
        query = _first(embeddings, lambda s: _first_embedded_text(contents[s.span_id]))
    if query is None:
        query = _first(llms, lambda s: contents[s.span_id].question())
    answer = contents[root.span_id].answer() if root else None
    if answer is None:
        answer = _first(
            sorted(llms, key=_BY_END, reverse=True),
            lambda s: contents[s.span_id].answer(),
        )

    # retrieval
    found = {s.span_id: contents[s.span_id].retrieved() for s in retrievers}
    used = [
        s
        for s in retrievers
        if found[s.span_id]
        and not any(stages[a.span_id] == "retriever" and found.get(a.span_id) for a in ancestors[s.span_id])
    ]
    first_retriever = used[0] if used else (retrievers[0] if retrievers else None)
    meta = _metadata_map(ordered)
    # the spans that carry any trace-wide attribute, in `ordered` order; the readers below need no other
    carriers = [s for s in ordered if not _TRACE_KEYS.isdisjoint(s.attributes)]
    tags = _tags(carriers)
    k = _first(retrievers, lambda s: first_count(s.attributes, *TraceloopAttributes.TOP_K))
    meta_k = meta.get("k", meta.get("top_k"))
    if k is None and isinstance(meta_k, int) and not isinstance(meta_k, bool) and 0 <= meta_k <= 10**12:
        k = meta_k
    nested = {
        s.span_id: [
            found[d.span_id]
            for d in retrievers
            if found[d.span_id] and any(a.span_id == s.span_id for a in ancestors[d.span_id])
        ]
        for s in used
    }
    chunks = dedupe(doc for s in used for doc in merged_with_nested(found[s.span_id], nested[s.span_id]))
    if any(doc["id"].startswith(CONTENT_ID_PREFIX) for doc in chunks):
        chunks = dedupe(named_by_trace(chunks, by_start))
    retrieval = {
        "retriever": first_retriever.name if first_retriever else None,
        "k": k,
        "chunks": ranked(chunks),
        "filter": _first(carriers, lambda s: filter_text(s.attributes.get(RagmonAttributes.RETRIEVAL_FILTER)))
        or _first(retrievers, lambda s: filter_text(first_text(s.attributes, *TraceloopAttributes.FILTERS))),
        "excluded_ids": _first_string_list(carriers, RagmonAttributes.RETRIEVAL_EXCLUDED_IDS),
        "reranker_input": ranked(
            contents[rerankers[0].span_id].documents(RerankerAttributes.RERANKER_INPUT_DOCUMENTS)
            if rerankers
            else ()
        ),
        "reranker_output": ranked(
            contents[rerankers[-1].span_id].documents(RerankerAttributes.RERANKER_OUTPUT_DOCUMENTS)
            if rerankers
            else ()
        ),
    }

    # timings
    def stage_seconds(stage: Stage) -> float | None:
        spans_of_stage = outermost(stage)
        if not spans_of_stage:
            return None
        if stage != "llm":
            return sum(s.duration_s for s in spans_of_stage)
        llm_ids = {s.span_id for s in llms}
        below: dict[str, list[Span]] = {}
        for s in llms:
            for a in ancestors[s.span_id]:
                if a.span_id in llm_ids:
                    below.setdefault(a.span_id, []).append(s)
        return sum(
            max(0, _streamed_end_ns(s, below.get(s.span_id, ())) - s.start_ns) / 1e9 for s in spans_of_stage
        )

    start_ns = by_start[0].start_ns
    total_s = root.duration_s if root else max(0, max(s.end_ns for s in by_start) - start_ns) / 1e9
    timings = {
        "total_s": total_s,
        "embedding_s": stage_seconds("embedding"),
        "retrieval_s": stage_seconds("retriever"),
        "rerank_s": stage_seconds("reranker"),
        "generation_s": stage_seconds("llm"),
        "ttft_s": _ttft(carriers, sorted(llms, key=_BY_END, reverse=True)),
    }

    # identity and signals
    resource = (root or by_start[0]).resource
    release = (
        _first_text(carriers, RagmonAttributes.RELEASE)
        or _meta_text(meta, "release")
        or tags.get("release")
        or first_text(resource, _SERVICE_VERSION)
    )
    intent = (
        _first_text(carriers, RagmonAttributes.INTENT)
        or _meta_text(meta, "intent", "route")
        or tags.get("intent")
        or tags.get("route")
    )
    regeneration = (
        any(flag(s.attributes.get(RagmonAttributes.REGENERATION)) for s in carriers)
        or flag(meta.get("regenerate", meta.get("regeneration")))
        or "regenerate" in tags
        or "regeneration" in tags
    )
    user = _first_text(carriers, SpanAttributes.USER_ID, _ENDUSER_ID) or _meta_text(meta, "user_id")
    start_time = _EPOCH + timedelta(microseconds=start_ns // 1000)
    reference = now if now is not None else datetime.now(UTC)
    if reference.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    if start_time > reference + _MAX_CLOCK_SKEW:
        start_time = reference.astimezone(UTC)

    # One validation of the whole nested record: every field, nested ones included, is checked
    # exactly as the model says, in one call instead of one per chunk, usage row and part.
    return RagTrace.model_validate(
        {
            "trace_id": by_start[0].trace_id,
            "tenant": by_start[0].tenant,
            "app": _app_name(resource),
            "release": release,
            "intent": intent or None,
            "session_id": _first_text(carriers, SpanAttributes.SESSION_ID, GenAIAttributes.CONVERSATION_ID)
            or _meta_text(meta, "session_id"),
            "user_hash": user_hash(user) if user else None,
            "start_time": start_time,
            "query": query,
            "query_embedding": _query_embedding([contents[s.span_id] for s in embeddings], retrievers, query),
            "retrieval": retrieval,
            "answer": answer,
            "cited_chunk_ids": _first_string_list(carriers, RagmonAttributes.CITED_CHUNK_IDS),
            "timings": timings,
            "usage": usage,
            "is_regeneration": regeneration,
            "regeneration_source": "attribute" if regeneration else None,
            "probe_run_id": _first_text(carriers, RagmonAttributes.PROBE_RUN_ID)
            or _meta_text(meta, "probe_run_id"),
            "probe_question_id": _first_text(carriers, RagmonAttributes.PROBE_QUESTION_ID)
            or _meta_text(meta, "probe_question_id"),
            "partial": partial,
            "span_count": len(by_start),
            "revision": revision_of(spans),
            "kind": _kind(of_stage, query, answer),
        }
    )
