"""Tests for `service/conventions/semconv.py`: OpenInference, GenAI and OpenLLMetry spans -> `RagTrace`."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from openinference.semconv.trace import (
    DocumentAttributes,
    EmbeddingAttributes,
    MessageAttributes,
    OpenInferenceMimeTypeValues,
    OpenInferenceSpanKindValues,
    RerankerAttributes,
    SpanAttributes,
)
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from service.conventions.attribute_values import (
    first_count,
    first_text,
    indexed,
    json_object,
    number,
    parse_json,
    vector,
)
from service.conventions.content import SpanContent
from service.conventions.pricing import PriceTable
from service.conventions.semconv import RagmonAttributes, attribute_kind, build_trace, span_stage
from service.conventions.spans import Span, SpanEvent
from service.conventions.usage import Call, span_call, usage_rows
from service.ingest.otlp_protobuf import decode_protobuf
from service.model import RagTrace

TRACE = "0af7651916cd43dd8448eb211c80319c"
T0 = 1_700_000_000_000_000_000  # ns
KIND = SpanAttributes.OPENINFERENCE_SPAN_KIND
IN_MSG = SpanAttributes.LLM_INPUT_MESSAGES
EMB = SpanAttributes.EMBEDDING_EMBEDDINGS
DOCS = SpanAttributes.RETRIEVAL_DOCUMENTS
CHAIN = OpenInferenceSpanKindValues.CHAIN.value
LLM = OpenInferenceSpanKindValues.LLM.value
RETRIEVER = OpenInferenceSpanKindValues.RETRIEVER.value
RERANKER = OpenInferenceSpanKindValues.RERANKER.value
EMBEDDING = OpenInferenceSpanKindValues.EMBEDDING.value
PRICES = PriceTable.default()
NOW = datetime(2030, 1, 1, tzinfo=UTC)


def span(
    span_id: int,
    parent: int | None,
    start_ms: float,
    end_ms: float,
    attributes: dict[str, Any] | None = None,
    *,
    name: str | None = None,
    events: list[SpanEvent] | None = None,
    resource: dict[str, Any] | None = None,
    tenant: str = "default",
) -> Span:
    return Span(
        trace_id=TRACE,
        span_id=f"{span_id:016x}",
        parent_span_id=None if parent is None else f"{parent:016x}",
        name=name or f"span-{span_id}",
        start_ns=T0 + int(start_ms * 1e6),
        end_ns=T0 + int(end_ms * 1e6),
        attributes=attributes or {},
        events=events or [],
        resource=resource if resource is not None else {"service.name": "qa-bot"},
        tenant=tenant,
    )


def event(name: str, at_ms: float, **attributes: Any) -> SpanEvent:
    return SpanEvent(name, T0 + int(at_ms * 1e6), dict(attributes))


def build(spans: list[Span], partial: bool = False, prices: PriceTable = PRICES) -> RagTrace:
    return build_trace(spans, partial=partial, prices=prices, now=NOW)


def docs(prefix: str, *items: tuple[str, float]) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    for i, (doc_id, score) in enumerate(items):
        attributes[f"{prefix}.{i}.{DocumentAttributes.DOCUMENT_ID}"] = doc_id
        attributes[f"{prefix}.{i}.{DocumentAttributes.DOCUMENT_SCORE}"] = score
        attributes[f"{prefix}.{i}.{DocumentAttributes.DOCUMENT_CONTENT}"] = f"text of {doc_id}"
    return attributes


QUESTION = "How long is the refund window?"
ANSWER = "Thirty days from delivery [doc-2]."


def openinference_rag(*, with_cost: bool = False) -> list[Span]:
    """A full RAG request as OpenInference instrumentors write it."""
    llm_attributes: dict[str, Any] = {
        KIND: LLM,
        SpanAttributes.LLM_MODEL_NAME: "gpt-4o-mini-2024-07-18",
        f"{SpanAttributes.LLM_INPUT_MESSAGES}.0.{MessageAttributes.MESSAGE_ROLE}": "system",
        f"{IN_MSG}.0.{MessageAttributes.MESSAGE_CONTENT}": "Answer from the context.",
        f"{SpanAttributes.LLM_INPUT_MESSAGES}.1.{MessageAttributes.MESSAGE_ROLE}": "user",
        f"{SpanAttributes.LLM_INPUT_MESSAGES}.1.{MessageAttributes.MESSAGE_CONTENT}": "context...\n"
        + QUESTION,
        f"{SpanAttributes.LLM_OUTPUT_MESSAGES}.0.{MessageAttributes.MESSAGE_ROLE}": "assistant",
        f"{SpanAttributes.LLM_OUTPUT_MESSAGES}.0.{MessageAttributes.MESSAGE_CONTENT}": ANSWER,
        SpanAttributes.LLM_TOKEN_COUNT_PROMPT: 1200,
        SpanAttributes.LLM_TOKEN_COUNT_COMPLETION: 80,
        SpanAttributes.LLM_TOKEN_COUNT_TOTAL: 1280,
    }
    if with_cost:
        llm_attributes[SpanAttributes.LLM_COST_TOTAL] = 0.5
    metadata = {"intent": "refunds", "release": "r-42", "probe_run_id": "run-7", "probe_question_id": "q-3"}
    return [
        span(
            1,
            None,
            0,
            2000,
            {
                KIND: CHAIN,
                SpanAttributes.INPUT_VALUE: json.dumps({"query": QUESTION, "history": []}),
                SpanAttributes.INPUT_MIME_TYPE: OpenInferenceMimeTypeValues.JSON.value,
                SpanAttributes.OUTPUT_VALUE: ANSWER,
                SpanAttributes.SESSION_ID: "sess-1",
                SpanAttributes.USER_ID: "alice@example.com",
                SpanAttributes.METADATA: json.dumps(metadata),
                SpanAttributes.TAG_TAGS: ["beta"],
            },
            name="rag",
            resource={"service.name": "qa-bot", "service.version": "1.4.0"},
        ),
        span(
            2,
            1,
            10,
            60,
            {
                KIND: EMBEDDING,
                SpanAttributes.EMBEDDING_MODEL_NAME: "text-embedding-3-small",
                f"{EMB}.0.{EmbeddingAttributes.EMBEDDING_TEXT}": "hypothetical doc",
                f"{SpanAttributes.EMBEDDING_EMBEDDINGS}.0.{EmbeddingAttributes.EMBEDDING_VECTOR}": [0.9, 0.1],
                f"{SpanAttributes.EMBEDDING_EMBEDDINGS}.1.{EmbeddingAttributes.EMBEDDING_TEXT}": QUESTION,
                f"{SpanAttributes.EMBEDDING_EMBEDDINGS}.1.{EmbeddingAttributes.EMBEDDING_VECTOR}": [0.1, 0.9],
                SpanAttributes.LLM_TOKEN_COUNT_PROMPT: 9,
                SpanAttributes.LLM_TOKEN_COUNT_TOTAL: 9,
            },
        ),
        span(
            3,
            1,
            60,
            160,
            {
                KIND: RETRIEVER,
                SpanAttributes.INPUT_VALUE: QUESTION,
                **docs(SpanAttributes.RETRIEVAL_DOCUMENTS, ("doc-1", 0.91), ("doc-2", 0.85), ("doc-3", 0.40)),
                f"{DOCS}.0.{DocumentAttributes.DOCUMENT_METADATA}": '{"page": 4}',
            },
            name="VectorStoreRetriever",
        ),
        span(
            4,
            1,
            160,
            200,
            {
                KIND: RERANKER,
                RerankerAttributes.RERANKER_QUERY: QUESTION,
                RerankerAttributes.RERANKER_MODEL_NAME: "bge-reranker",
                **docs(
                    RerankerAttributes.RERANKER_INPUT_DOCUMENTS,
                    ("doc-1", 0.91),
                    ("doc-2", 0.85),
                    ("doc-3", 0.4),
                ),
                **docs(RerankerAttributes.RERANKER_OUTPUT_DOCUMENTS, ("doc-2", 0.97), ("doc-1", 0.60)),
            },
        ),
        span(
            5,
            1,
            200,
            1900,
            llm_attributes,
            events=[event("First Token Stream Event", 450)],
        ),
    ]


# ---------------------------------------------------------------- OpenInference


def test_openinference_rag_trace_maps_every_field() -> None:
    trace = build(openinference_rag())
    assert trace.trace_id == TRACE
    assert (trace.app, trace.release, trace.tenant) == ("qa-bot", "r-42", "default")
    assert trace.intent == "refunds"
    assert trace.session_id == "sess-1"
    assert trace.user_hash == hashlib.sha256(b"alice@example.com").hexdigest()
    assert "alice@example.com" not in trace.model_dump_json()
    assert trace.start_time == datetime.fromtimestamp(T0 / 1e9, UTC)
    assert trace.query == QUESTION
    assert trace.answer == ANSWER
    assert trace.query_embedding is not None
    assert trace.query_embedding.vector == (0.1, 0.9), "the embedding whose text is the query"
    assert trace.query_embedding.model == "text-embedding-3-small"
    retrieval = trace.retrieval
    assert retrieval.retriever == "VectorStoreRetriever"
    assert [(c.id, c.rank, c.score) for c in retrieval.chunks] == [
        ("doc-1", 0, 0.91),
        ("doc-2", 1, 0.85),
        ("doc-3", 2, 0.40),
    ]
    assert retrieval.chunks[0].content == "text of doc-1"
    assert retrieval.chunks[0].metadata == {"page": 4}
    assert [c.id for c in retrieval.reranker_input] == ["doc-1", "doc-2", "doc-3"]
    assert [c.id for c in retrieval.context] == ["doc-2", "doc-1"], "the LLM saw the reranker's output"
    assert retrieval.top1_score == 0.91
    timings = trace.timings
    assert timings.total_s == pytest.approx(2.0)
    assert timings.embedding_s == pytest.approx(0.05)
    assert timings.retrieval_s == pytest.approx(0.1)
    assert timings.rerank_s == pytest.approx(0.04)
    assert timings.generation_s == pytest.approx(1.7)
    assert timings.ttft_s == pytest.approx(0.25), "First Token Stream Event - LLM span start"
    assert trace.probe_run_id == "run-7" and trace.probe_question_id == "q-3"
    assert not trace.is_regeneration and trace.regeneration_source is None
    assert trace.span_count == 5 and not trace.partial and trace.source == "otlp"


def test_price_table_cost_when_the_app_sends_none() -> None:
    trace = build(openinference_rag())
    usage = {(u.model, u.kind): u for u in trace.usage}
    llm = usage[("gpt-4o-mini-2024-07-18", "llm")]
    assert (llm.input_tokens, llm.output_tokens) == (1200, 80)
    assert llm.cost_source == "price_table"
    assert llm.cost_usd == pytest.approx(PRICES.cost("gpt-4o-mini", 1200, 80))
    embedding = usage[("text-embedding-3-small", "embedding")]
    assert (embedding.input_tokens, embedding.output_tokens) == (9, 0)
    assert embedding.cost_source == "price_table"
    assert ("bge-reranker", "reranker") not in usage, "a reranker that reports no usage adds no row"
    assert trace.cost_usd == pytest.approx((llm.cost_usd or 0) + (embedding.cost_usd or 0))


def test_app_sent_cost_wins_over_the_table() -> None:
    trace = build(openinference_rag(with_cost=True))
    (llm,) = [u for u in trace.usage if u.kind == "llm"]
    assert (llm.cost_usd, llm.cost_source) == (0.5, "app")


def test_app_sent_prompt_and_completion_costs_are_summed() -> None:
    spans = [
        span(
            1,
            None,
            0,
            10,
            {
                KIND: LLM,
                SpanAttributes.LLM_MODEL_NAME: "gpt-4o",
                SpanAttributes.LLM_TOKEN_COUNT_PROMPT: 10,
                SpanAttributes.LLM_COST_PROMPT: 0.25,
                SpanAttributes.LLM_COST_COMPLETION: 0.125,
            },
        )
    ]
    (usage,) = build(spans).usage
    assert (usage.cost_usd, usage.cost_source) == (0.375, "app")


def test_unknown_model_is_unpriced_never_guessed() -> None:
    spans = [
        span(1, None, 0, 10, {KIND: CHAIN}),
        span(
            2,
            1,
            1,
            9,
            {
                KIND: LLM,
                SpanAttributes.LLM_MODEL_NAME: "acme-llm-7b",
                SpanAttributes.LLM_TOKEN_COUNT_PROMPT: 100,
                SpanAttributes.LLM_TOKEN_COUNT_COMPLETION: 5,
            },
        ),
    ]
    trace = build(spans)
    (usage,) = trace.usage
    assert (usage.cost_usd, usage.cost_source) == (None, "unpriced")
    assert trace.unpriced_models == ("acme-llm-7b",)
    assert trace.cost_usd is None
    priced = build(spans, prices=PRICES.with_overrides({"acme-llm-7b": (1.0, 1.0)}))
    assert priced.usage[0].cost_source == "price_table"
    assert priced.cost_usd == pytest.approx(105 / 1e6)


def test_llm_call_without_token_counts_is_unknown_usage() -> None:
    # gpt-4o is in the price table: without token counts it is still not priced (at 0 or at all)
    spans = [span(1, None, 0, 10, {KIND: LLM, SpanAttributes.LLM_MODEL_NAME: "gpt-4o"})]
    trace = build(spans)
    (usage,) = trace.usage
    assert (usage.model, usage.cost_usd, usage.cost_source) == ("gpt-4o", None, "unknown_usage")
    assert trace.usage_unknown_models == ("gpt-4o",) and trace.unpriced_models == ()
    assert trace.cost_usd is None


def test_unknown_usage_keeps_a_trace_cost_unknown_beside_priced_calls() -> None:
    embedding = {
        KIND: EMBEDDING,
        SpanAttributes.EMBEDDING_MODEL_NAME: "text-embedding-3-small",
        SpanAttributes.LLM_TOKEN_COUNT_PROMPT: 1000,
    }
    llm = {KIND: LLM, SpanAttributes.LLM_MODEL_NAME: "gpt-4o-mini"}
    trace = build([span(1, None, 0, 10, {KIND: "CHAIN"}), span(2, 1, 1, 2, embedding), span(3, 1, 2, 9, llm)])
    sources = {u.model: u.cost_source for u in trace.usage}
    assert sources == {"text-embedding-3-small": "price_table", "gpt-4o-mini": "unknown_usage"}
    assert trace.cost_usd is None  # the priced embedding alone would understate it
    calls = [Call("m", "llm", 5, 1, 0.1, "price_table"), Call("m", "llm", 0, 0, None, "unknown_usage")]
    (row,) = usage_rows(calls)
    assert (row["cost_usd"], row["cost_source"]) == (None, "unknown_usage")


def test_usage_sums_calls_per_model_and_kind() -> None:
    def call(span_id: int, model: str, prompt: int, completion: int) -> Span:
        attributes = {
            KIND: LLM,
            SpanAttributes.LLM_MODEL_NAME: model,
            SpanAttributes.LLM_TOKEN_COUNT_PROMPT: prompt,
            SpanAttributes.LLM_TOKEN_COUNT_COMPLETION: completion,
        }
        return span(span_id, 1, span_id, span_id + 1, attributes)

    spans = [span(1, None, 0, 100, {KIND: CHAIN}), call(2, "gpt-4o", 100, 10), call(3, "gpt-4o", 50, 5)]
    spans.append(call(4, "gpt-4o-mini", 7, 1))
    usage = {u.model: u for u in build(spans).usage}
    assert (usage["gpt-4o"].input_tokens, usage["gpt-4o"].output_tokens) == (150, 15)
    assert usage["gpt-4o"].cost_usd == pytest.approx(PRICES.cost("gpt-4o", 150, 15))
    assert (usage["gpt-4o-mini"].input_tokens, usage["gpt-4o-mini"].output_tokens) == (7, 1)


def test_nested_instrumentation_is_counted_once() -> None:
    """LangChain's LLM span around the OpenAI SDK's LLM span: both report the same tokens."""
    tokens = {SpanAttributes.LLM_TOKEN_COUNT_PROMPT: 300, SpanAttributes.LLM_TOKEN_COUNT_COMPLETION: 20}
    spans = [
        span(1, None, 0, 1000, {KIND: CHAIN}),
        span(2, 1, 100, 900, {KIND: LLM, SpanAttributes.LLM_MODEL_NAME: "gpt-4o", **tokens}),
        span(3, 2, 110, 890, {KIND: LLM, SpanAttributes.LLM_MODEL_NAME: "gpt-4o-2024-08-06", **tokens}),
        span(4, 1, 10, 90, {KIND: RETRIEVER}),
        span(5, 4, 20, 80, {KIND: RETRIEVER}),
    ]
    trace = build(spans)
    (usage,) = trace.usage
    assert (usage.model, usage.input_tokens, usage.output_tokens) == ("gpt-4o-2024-08-06", 300, 20)
    assert trace.timings.generation_s == pytest.approx(0.8), "only the outermost LLM span is timed"
    assert trace.timings.retrieval_s == pytest.approx(0.08)


def test_query_embedding_falls_back_to_the_first_vector() -> None:
    spans = [
        span(1, None, 0, 10, {KIND: CHAIN, SpanAttributes.INPUT_VALUE: "unrelated text"}),
        span(
            2,
            1,
            1,
            2,
            {
                KIND: EMBEDDING,
                f"{SpanAttributes.EMBEDDING_EMBEDDINGS}.0.{EmbeddingAttributes.EMBEDDING_VECTOR}": [1.0, 0.0],
                f"{SpanAttributes.EMBEDDING_EMBEDDINGS}.1.{EmbeddingAttributes.EMBEDDING_VECTOR}": [0.0, 1.0],
            },
        ),
    ]
    trace = build(spans)
    assert trace.query_embedding is not None
    assert trace.query_embedding.vector == (1.0, 0.0)
    assert trace.query_embedding.model is None


def test_plain_text_mime_is_taken_as_is_and_chat_json_is_read() -> None:
    literal = '{"not": "parsed"}'
    spans = [
        span(
            1,
            None,
            0,
            10,
            {
                KIND: CHAIN,
                SpanAttributes.INPUT_VALUE: literal,
                SpanAttributes.INPUT_MIME_TYPE: OpenInferenceMimeTypeValues.TEXT.value,
                SpanAttributes.OUTPUT_VALUE: json.dumps(
                    {"choices": [{"message": {"role": "assistant", "content": "From choices."}}]}
                ),
                SpanAttributes.OUTPUT_MIME_TYPE: OpenInferenceMimeTypeValues.JSON.value,
            },
        )
    ]
    trace = build(spans)
    assert trace.query == literal
    assert trace.answer == "From choices."


def test_query_falls_back_to_the_retriever_and_answer_to_the_last_llm() -> None:
    def llm(span_id: int, start: float, end: float, text: str) -> Span:
        key = f"{SpanAttributes.LLM_OUTPUT_MESSAGES}.0.{MessageAttributes.MESSAGE_CONTENT}"
        return span(span_id, 1, start, end, {KIND: LLM, key: text})

    spans = [
        span(1, None, 0, 100, {"http.route": "/ask"}, name="POST /ask"),
        llm(2, 1, 10, "rewritten query"),
        span(3, 1, 10, 20, {KIND: RETRIEVER, SpanAttributes.INPUT_VALUE: json.dumps({"question": QUESTION})}),
        llm(4, 20, 90, ANSWER),
    ]
    trace = build(spans)
    assert trace.query == QUESTION
    assert trace.answer == ANSWER


# ---------------------------------------------------------------- ragmon attributes, metadata, tags


def test_ragmon_attributes_win_over_metadata_and_resource() -> None:
    attributes = {
        KIND: CHAIN,
        RagmonAttributes.INTENT: "billing",
        RagmonAttributes.RELEASE: "2025.10.1",
        RagmonAttributes.REGENERATION: True,
        RagmonAttributes.PROBE_RUN_ID: "probe-9",
        RagmonAttributes.PROBE_QUESTION_ID: "g-12",
        RagmonAttributes.RETRIEVAL_FILTER: "tenant = 'acme' AND lang = 'en'",
        RagmonAttributes.RETRIEVAL_EXCLUDED_IDS: json.dumps(["doc-9", "doc-10"]),
        RagmonAttributes.CITED_CHUNK_IDS: ["doc-2"],
        RagmonAttributes.TTFT_MS: 321.0,
        SpanAttributes.METADATA: json.dumps({"intent": "other", "release": "old", "probe_run_id": "x"}),
    }
    spans = [span(1, None, 0, 10, attributes, resource={"service.name": "bot", "service.version": "0.9"})]
    trace = build(spans)
    assert (trace.intent, trace.release) == ("billing", "2025.10.1")
    assert trace.is_regeneration and trace.regeneration_source == "attribute"
    assert (trace.probe_run_id, trace.probe_question_id) == ("probe-9", "g-12")
    assert trace.retrieval.filter == "tenant = 'acme' AND lang = 'en'"
    assert trace.retrieval.excluded_ids == ("doc-9", "doc-10")
    assert trace.cited_chunk_ids == ("doc-2",)
    assert trace.timings.ttft_s == pytest.approx(0.321)


def test_metadata_and_tags_carry_signals_and_service_version_is_the_last_resort() -> None:
    metadata = {"route": "faq", "regenerate": "true", "probe_question_id": 17, "user_id": "u-1"}
    spans = [
        span(
            1,
            None,
            0,
            10,
            {SpanAttributes.METADATA: json.dumps(metadata)},
            resource={"service.name": "bot", "service.version": "0.9"},
        )
    ]
    trace = build(spans)
    assert (trace.intent, trace.release) == ("faq", "0.9")
    assert trace.is_regeneration and trace.regeneration_source == "attribute"
    assert trace.probe_question_id == "17"
    assert trace.user_hash == hashlib.sha256(b"u-1").hexdigest()
    tagged = build(
        [span(1, None, 0, 10, {SpanAttributes.TAG_TAGS: ["regenerate", "intent:returns", "release:r9"]})]
    )
    assert (tagged.intent, tagged.release, tagged.is_regeneration) == ("returns", "r9", True)
    plain = build([span(1, None, 0, 10, {SpanAttributes.TAG_TAGS: ["beta"]}, resource={})])
    assert (plain.app, plain.release, plain.intent, plain.is_regeneration) == ("unknown", None, None, False)


# ---------------------------------------------------------------- OTel GenAI


def test_genai_chat_span_with_messages_in_attributes() -> None:
    input_messages = [
        {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
        {"role": "user", "parts": [{"type": "text", "content": QUESTION}]},
    ]
    output_messages = [
        {"role": "assistant", "parts": [{"type": "text", "content": ANSWER}], "finish_reason": "stop"}
    ]
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.response.model": "gpt-4o-2024-08-06",
        "gen_ai.usage.input_tokens": 400,
        "gen_ai.usage.output_tokens": 40,
        "gen_ai.input.messages": json.dumps(input_messages),
        "gen_ai.output.messages": json.dumps(output_messages),
    }
    spans = [span(1, None, 0, 500, attributes, name="chat gpt-4o")]
    assert span_stage(spans[0]) == "llm"
    trace = build(spans)
    assert (trace.query, trace.answer) == (QUESTION, ANSWER)
    (usage,) = trace.usage
    assert (usage.model, usage.input_tokens, usage.output_tokens) == ("gpt-4o-2024-08-06", 400, 40)
    assert usage.cost_usd == pytest.approx(PRICES.cost("gpt-4o", 400, 40))
    assert trace.timings.generation_s == pytest.approx(0.5)


def test_genai_older_names_and_content_events() -> None:
    attributes = {
        "gen_ai.operation.name": "text_completion",
        "gen_ai.system": "openai",
        "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.usage.prompt_tokens": 30,
        "gen_ai.usage.completion_tokens": 3,
        "gen_ai.response.time_to_first_chunk": 0.12,
    }
    events = [
        event(
            "gen_ai.content.prompt",
            1,
            **{"gen_ai.prompt": json.dumps([{"role": "user", "content": QUESTION}])},
        ),
        event(
            "gen_ai.content.completion",
            9,
            **{"gen_ai.completion": json.dumps([{"role": "assistant", "content": ANSWER}])},
        ),
    ]
    trace = build([span(1, None, 0, 10, attributes, events=events)])
    assert (trace.query, trace.answer) == (QUESTION, ANSWER)
    (usage,) = trace.usage
    assert (usage.input_tokens, usage.output_tokens, usage.cost_source) == (30, 3, "price_table")
    assert trace.timings.ttft_s == pytest.approx(0.12)


def test_genai_embeddings_and_retrieval_spans() -> None:
    documents = [{"id": "doc_123", "score": 0.95}, {"id": "doc_456", "score": 0.87}]
    spans = [
        span(1, None, 0, 100, {"gen_ai.operation.name": "invoke_agent"}),
        span(
            2,
            1,
            1,
            5,
            {
                "gen_ai.operation.name": "embeddings",
                "gen_ai.request.model": "text-embedding-3-large",
                "gen_ai.usage.input_tokens": 12,
            },
        ),
        span(
            3,
            1,
            5,
            25,
            {
                "gen_ai.operation.name": "retrieval",
                "gen_ai.retrieval.query.text": QUESTION,
                "gen_ai.retrieval.documents": json.dumps(documents),
            },
        ),
    ]
    assert [span_stage(s) for s in spans] == ["chain", "embedding", "retriever"]
    trace = build(spans)
    assert trace.query == QUESTION
    assert [(c.id, c.score) for c in trace.retrieval.chunks] == [("doc_123", 0.95), ("doc_456", 0.87)]
    (usage,) = trace.usage
    assert (usage.kind, usage.model, usage.input_tokens) == ("embedding", "text-embedding-3-large", 12)
    assert usage.cost_source == "price_table"
    assert trace.timings.embedding_s == pytest.approx(0.004)
    assert trace.timings.retrieval_s == pytest.approx(0.02)


# ---------------------------------------------------------------- OpenLLMetry


def test_openllmetry_workflow_with_chroma_events_and_openai_call() -> None:
    chroma_events = [
        event(
            "db.query.result",
            30,
            **{
                "db.query.result.id": f"c{i}",
                "db.query.result.distance": d,
                "db.query.result.document": f"chunk {i}",
                "db.query.result.metadata": json.dumps({"source": "faq.md"}),
            },
        )
        for i, d in enumerate([0.12, 0.34])
    ]
    spans = [
        span(
            1,
            None,
            0,
            1000,
            {
                "traceloop.span.kind": "workflow",
                "traceloop.entity.input": json.dumps({"args": [QUESTION], "kwargs": {}}),
                "traceloop.entity.output": json.dumps(ANSWER),
                "traceloop.association.properties.session_id": "s-77",
            },
            name="answer_question.workflow",
        ),
        span(
            2,
            1,
            10,
            40,
            {"db.system": "chroma", "db.operation": "query", "db.chroma.query.n_results": 2},
            name="chroma.query",
            events=chroma_events,
        ),
        span(
            3,
            2,
            12,
            38,
            {"db.system": "chroma", "db.operation": "_query"},
            name="chroma.query.segment._query",
        ),
        span(
            4,
            1,
            50,
            950,
            {
                "llm.request.type": "chat",
                "gen_ai.system": "openai",
                "gen_ai.request.model": "gpt-4o-mini",
                "gen_ai.prompt.0.role": "user",
                "gen_ai.prompt.0.content": "context ... " + QUESTION,
                "gen_ai.completion.0.role": "assistant",
                "gen_ai.completion.0.content": ANSWER,
                "gen_ai.usage.prompt_tokens": 500,
                "gen_ai.usage.completion_tokens": 25,
                "llm.usage.total_tokens": 525,
            },
            name="openai.chat",
            events=[event("llm.content.completion.chunk", 250), event("llm.content.completion.chunk", 260)],
        ),
    ]
    assert [span_stage(s) for s in spans] == ["chain", "retriever", "retriever", "llm"]
    trace = build(spans)
    assert (trace.query, trace.answer, trace.session_id) == (QUESTION, ANSWER, "s-77")
    chunks = trace.retrieval.chunks
    assert [(c.id, c.score, c.content) for c in chunks] == [("c0", 0.12, "chunk 0"), ("c1", 0.34, "chunk 1")]
    assert chunks[0].metadata == {"source": "faq.md", "ragmon.score_kind": "distance"}
    assert (trace.retrieval.retriever, trace.retrieval.k) == ("chroma.query", 2)
    assert trace.timings.retrieval_s == pytest.approx(0.03), "the nested segment query is not counted again"
    (usage,) = trace.usage
    assert (usage.model, usage.input_tokens, usage.output_tokens) == ("gpt-4o-mini", 500, 25)
    assert trace.timings.ttft_s == pytest.approx(0.2), "first completion chunk - LLM span start"


def test_openllmetry_pinecone_and_milvus_result_events() -> None:
    pinecone = span(
        1,
        None,
        0,
        10,
        {"db.system": "pinecone", "db.operation": "query", "pinecone.query.top_k": 2},
        events=[
            event(
                "db.query.result",
                5,
                **{
                    "db.query.result.id": "p1",
                    "db.query.result.score": 0.8,
                    "db.query.result.metadata": "{'title': 'Refunds', 'year': 2024}",
                },
            ),
            event("db.query.result", 5, **{"db.query.result.id": "p2", "db.query.result.score": 0.7}),
        ],
    )
    trace = build([pinecone])
    assert [(c.id, c.score) for c in trace.retrieval.chunks] == [("p1", 0.8), ("p2", 0.7)]
    assert trace.retrieval.chunks[0].metadata == {"title": "Refunds", "year": 2024}
    assert trace.retrieval.k == 2
    milvus = span(
        1,
        None,
        0,
        10,
        {"db.system": "milvus", "db.operation": "search"},
        events=[
            event(
                "db.search.result",
                5,
                **{"db.search.query.id": 0, "db.search.result.id": 11, "db.search.result.distance": 0.25},
            ),
            event(
                "db.search.result",
                5,
                **{"db.search.query.id": 1, "db.search.result.id": 99, "db.search.result.distance": 0.5},
            ),
        ],
    )
    chunks = build([milvus]).retrieval.chunks
    assert [(c.id, c.score) for c in chunks] == [("11", 0.25)], "only the first query's hits, ids as strings"


# ---------------------------------------------------------------- structure, determinism, edge cases


def test_partial_trace_without_root_spans_min_start_to_max_end() -> None:
    spans = [span(2, 1, 100, 300, {KIND: RETRIEVER}), span(3, 1, 250, 900, {KIND: LLM})]
    trace = build(spans, partial=True)
    assert trace.partial
    assert trace.timings.total_s == pytest.approx(0.8)
    assert trace.start_time == datetime.fromtimestamp((T0 + 100_000_000) / 1e9, UTC)


def test_order_and_duplicates_do_not_change_the_trace() -> None:
    spans = openinference_rag()
    reference = build(spans)
    rng = random.Random(7)
    for _ in range(5):
        shuffled = spans + rng.sample(spans, 3)
        rng.shuffle(shuffled)
        assert build(shuffled) == reference


def test_future_dated_trace_is_dated_now_and_tenant_is_kept() -> None:
    future = span(1, None, 0, 10, tenant="acme")
    now = datetime.fromtimestamp(T0 / 1e9, UTC) - timedelta(days=1)
    trace = build_trace([future], partial=False, prices=PRICES, now=now)
    assert trace.start_time == now
    assert trace.tenant == "acme"
    near = datetime.fromtimestamp(T0 / 1e9, UTC) - timedelta(minutes=1)
    assert build_trace([future], partial=False, prices=PRICES, now=near).start_time > near


def test_bad_calls_raise_value_error() -> None:
    with pytest.raises(ValueError, match="at least one span"):
        build_trace([], partial=False, prices=PRICES)
    other = span(2, None, 0, 1)
    other.trace_id = "1" * 32
    with pytest.raises(ValueError, match="2 traces"):
        build_trace([span(1, None, 0, 1), other], partial=False, prices=PRICES)
    with pytest.raises(ValueError, match="timezone"):
        build_trace([span(1, None, 0, 1)], partial=False, prices=PRICES, now=datetime(2030, 1, 1))


def test_chunks_without_ids_get_stable_content_ids_and_duplicates_are_merged() -> None:
    prefix = SpanAttributes.RETRIEVAL_DOCUMENTS
    spans = [
        span(1, None, 0, 100, {KIND: CHAIN}),
        span(
            2,
            1,
            0,
            10,
            {
                KIND: RETRIEVER,
                f"{prefix}.0.{DocumentAttributes.DOCUMENT_CONTENT}": "alpha",
                f"{prefix}.1.{DocumentAttributes.DOCUMENT_ID}": 7,
            },
        ),
        span(
            3,
            1,
            10,
            20,
            {
                KIND: RETRIEVER,
                f"{prefix}.0.{DocumentAttributes.DOCUMENT_CONTENT}": "alpha",
                f"{prefix}.1.{DocumentAttributes.DOCUMENT_ID}": "x",
            },
        ),
    ]
    chunks = build(spans).retrieval.chunks
    content_id = "sha256:" + hashlib.sha256(b"alpha").hexdigest()[:16]
    assert [(c.id, c.rank) for c in chunks] == [(content_id, 0), ("7", 1), ("x", 2)]


def test_attribute_kinds_cover_what_build_trace_reads_as_numbers() -> None:
    assert (
        attribute_kind(f"{SpanAttributes.RETRIEVAL_DOCUMENTS}.3.{DocumentAttributes.DOCUMENT_SCORE}")
        == "number"
    )
    assert (
        attribute_kind(
            f"{RerankerAttributes.RERANKER_OUTPUT_DOCUMENTS}.0.{DocumentAttributes.DOCUMENT_SCORE}"
        )
        == "number"
    )
    assert attribute_kind(SpanAttributes.LLM_TOKEN_COUNT_PROMPT) == "count"
    assert attribute_kind("gen_ai.usage.output_tokens") == "count"
    assert attribute_kind(SpanAttributes.LLM_COST_TOTAL) == "number"
    assert attribute_kind(RagmonAttributes.TTFT_MS) == "number"
    key = f"{SpanAttributes.EMBEDDING_EMBEDDINGS}.0.{EmbeddingAttributes.EMBEDDING_VECTOR}"
    assert attribute_kind(key) == "vector"
    assert attribute_kind(SpanAttributes.INPUT_VALUE) is None


# ---------------------------------------------------------------- through the real SDK and decoder


@pytest.fixture
def sdk() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "sdk-app", "service.version": "3.0"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def test_sdk_spans_through_the_decoder_build_the_same_trace(
    sdk: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = sdk
    tracer = provider.get_tracer("rag")
    with tracer.start_as_current_span("rag") as root:
        root.set_attribute(KIND, CHAIN)
        root.set_attribute(SpanAttributes.INPUT_VALUE, QUESTION)
        root.set_attribute(SpanAttributes.OUTPUT_VALUE, ANSWER)
        with tracer.start_as_current_span("retrieve") as retriever:
            retriever.set_attribute(KIND, RETRIEVER)
            for key, value in docs(SpanAttributes.RETRIEVAL_DOCUMENTS, ("d1", 0.9), ("d2", 0.8)).items():
                retriever.set_attribute(key, value)
        with tracer.start_as_current_span("llm") as llm:
            llm.set_attribute(KIND, LLM)
            llm.set_attribute(SpanAttributes.LLM_MODEL_NAME, "gpt-4.1-mini")
            llm.set_attribute(SpanAttributes.LLM_TOKEN_COUNT_PROMPT, 100)
            llm.set_attribute(SpanAttributes.LLM_TOKEN_COUNT_COMPLETION, 10)
            llm.add_event("First Token Stream Event")
    batch = decode_protobuf(encode_spans(exporter.get_finished_spans()).SerializeToString(), "acme")
    trace = build_trace(batch.spans, partial=False, prices=PRICES)
    sdk_root = next(s for s in exporter.get_finished_spans() if s.name == "rag")
    assert sdk_root.context is not None and trace.trace_id == f"{sdk_root.context.trace_id:032x}"
    assert (trace.app, trace.release, trace.tenant) == ("sdk-app", "3.0", "acme")
    assert (trace.query, trace.answer) == (QUESTION, ANSWER)
    assert [c.id for c in trace.retrieval.chunks] == ["d1", "d2"]
    assert trace.usage[0].cost_usd == pytest.approx(PRICES.cost("gpt-4.1-mini", 100, 10))
    assert trace.timings.ttft_s is not None and 0 <= trace.timings.ttft_s <= (trace.timings.generation_s or 0)
    assert trace.timings.total_s is not None and trace.timings.total_s >= (trace.timings.generation_s or 0)


@pytest.mark.parametrize(
    ("resource", "app"),
    [
        ({"service.name": "shop", "openinference.project.name": "proj"}, "shop"),
        ({"service.name": "unknown_service:python", "openinference.project.name": "proj"}, "proj"),
        ({"service.name": "unknown_service:python"}, "unknown"),
        ({}, "unknown"),
    ],
)
def test_app_is_service_name_else_phoenix_project(resource: dict[str, Any], app: str) -> None:
    assert build([span(1, None, 0, 1, resource=resource)]).app == app


# ---------------------------------------------------------------- the modules build_trace reads through


def test_vector_reader_takes_finite_numbers_and_refuses_the_rest() -> None:
    assert vector([0.5, -1.0]) == (0.5, -1.0)
    assert all(type(x) is float for x in vector([1, 2.5]) or ()), "integers become floats"
    assert vector(["0.5", 1.0]) == (0.5, 1.0), "numeric strings are read as numbers"
    refused_values: list[Any] = [[1.0, True], [1.0, float("nan")], [float("inf")], [1.0, "x"], [1.0, None]]
    refused_values += [[], "1.0", None]
    for refused in refused_values:
        assert vector(refused) is None, refused


def test_number_and_count_readers() -> None:
    assert (number(3), number(2.5), number(" 4 "), number(True), number("nan"), number(None)) == (
        3.0,
        2.5,
        4.0,
        None,
        None,
        None,
    )
    attributes: dict[str, Any] = {"a": -1, "b": 2.5, "c": True, "d": "7", "e": 9}
    assert first_count(attributes, "a", "b", "c", "d", "e") == 7, "negative, fractional, boolean skipped"
    assert first_text({"x": "  ", "y": 12, "z": "t"}, "x", "y", "z") == "12"


def test_json_readers_parse_only_objects_and_lists() -> None:
    assert parse_json(' {"a": [1, 2]} ') == {"a": [1, 2]}
    assert parse_json("{'a': (1, 2)}") == {"a": (1, 2)}, "a Python literal, as str(dict) writes it"
    assert parse_json('{"a": 1} trailing') == '{"a": 1} trailing', "not JSON, not a literal: left as is"
    assert parse_json("plain text") == "plain text"
    assert json_object('{"page": 4}') == {"page": 4}
    assert json_object("{'pages': (1, 2), 'at': b'x'}") == {"pages": [1, 2], "at": "b'x'"}, "made JSON-safe"
    assert json_object("[1]") is None and json_object("{}") is None and json_object(7) is None


def _random_attributes(rng: random.Random) -> dict[str, Any]:
    prefixes = ["retrieval.documents", "llm.input_messages", "gen_ai.prompt", "a.b", "x"]
    rests = ["document.id", "message.role", "content", "", "x.y"]
    indexes = ["0", "1", "2", "00", "10", "x", "²", ""]
    attributes: dict[str, Any] = {}
    for _ in range(rng.randrange(12)):
        key = ".".join(
            p
            for p in (rng.choice(prefixes), rng.choice(indexes), rng.choice(rests))
            if p or rng.random() < 0.3
        )
        attributes[key] = rng.random()
    return attributes


def test_span_content_lists_match_a_plain_scan_and_are_laid_out_per_key_sequence() -> None:
    rng = random.Random(3)
    for _ in range(300):
        attributes = _random_attributes(rng)
        first, second = (
            SpanContent(span(1, None, 0, 1, attributes)),
            SpanContent(span(2, None, 0, 1, dict(attributes))),
        )
        for prefix in ("retrieval.documents", "llm.input_messages", "gen_ai.prompt", "a.b"):
            expected = indexed(attributes, prefix)
            assert first.indexed(prefix) == expected
            assert second.indexed(prefix) == expected, "a cached layout reads the second span's own values"
    other = SpanContent(span(3, None, 0, 1, {"retrieval.documents.0.document.id": "mine"}))
    assert other.indexed("retrieval.documents") == [{"document.id": "mine"}]


def test_non_ascii_digit_in_a_list_index_is_ignored_not_fatal() -> None:
    attributes = {
        KIND: RETRIEVER,
        f"{DOCS}.².{DocumentAttributes.DOCUMENT_ID}": "d",
        **docs(DOCS, ("a", 0.5)),
    }
    assert [c.id for c in build([span(1, None, 0, 10, attributes)]).retrieval.chunks] == ["a"]


def test_usage_rows_are_unpriced_when_any_call_is() -> None:
    calls = [
        Call("m", "llm", 10, 1, 0.5, "app"),
        Call("m", "llm", 5, 1, None, "unpriced"),
        Call("e", "embedding", 3, 0, 0.25, "price_table"),
        Call("e", "embedding", 4, 0, 0.5, "app"),
    ]
    rows = {row["model"]: row for row in usage_rows(calls)}
    assert (rows["m"]["cost_usd"], rows["m"]["cost_source"], rows["m"]["input_tokens"]) == (
        None,
        "unpriced",
        15,
    )
    assert (rows["e"]["cost_usd"], rows["e"]["cost_source"]) == (0.75, "price_table")
    llm = span(
        1,
        None,
        0,
        1,
        {KIND: LLM, SpanAttributes.LLM_MODEL_NAME: "gpt-4o", SpanAttributes.LLM_COST_PROMPT: -1},
    )
    call = span_call(llm, "llm", PRICES)
    assert call is not None and (call.cost, call.source) == (None, "unpriced"), (
        "a negative app cost is not used"
    )


def test_hostile_json_strings_stay_text_instead_of_failing_the_trace() -> None:
    from service.conventions.attribute_values import json_object, parse_json

    assert json_object("{(1, 2): 'x'}") == {"(1, 2)": "x"}  # tuple keys become text, not a crash
    deep = "[" * 100_000 + "]" * 100_000
    assert parse_json(deep) == deep  # deeper than the parser recurses: kept as text
    assert json_object("{" * 100_000 + "}" * 100_000) is None


def _passages(*items: tuple[str | None, float | None, str]) -> dict[str, Any]:
    attributes: dict[str, Any] = {KIND: RETRIEVER}
    for i, (doc_id, score, content) in enumerate(items):
        prefix = f"{SpanAttributes.RETRIEVAL_DOCUMENTS}.{i}."
        attributes[prefix + DocumentAttributes.DOCUMENT_CONTENT] = content
        if doc_id is not None:
            attributes[prefix + DocumentAttributes.DOCUMENT_ID] = doc_id
        if score is not None:
            attributes[prefix + DocumentAttributes.DOCUMENT_SCORE] = score
    return attributes


def test_nested_retriever_spans_merge_ids_and_scores_into_the_outer_documents() -> None:
    # openinference-instrumentation-dspy: `Retrieve.forward` (content only) around
    # `ColBERTv2.__call__` (ids, scores and the same passages)
    inner = _passages(("7161", 21.5, "Refunds take 30 days."), ("88", 19.0, "Shipping is free over $50."))
    outer = _passages((None, None, "Refunds take 30 days."), (None, None, "Shipping is free over $50."))
    spans = [
        span(1, None, 0, 100, {KIND: CHAIN, SpanAttributes.INPUT_VALUE: "refund window?"}),
        span(2, 1, 1, 20, outer, name="Retrieve.forward"),
        span(3, 2, 2, 19, inner, name="ColBERTv2.__call__"),
    ]
    trace = build(spans)
    assert [(c.id, c.score, c.rank) for c in trace.retrieval.chunks] == [("7161", 21.5, 0), ("88", 19.0, 1)]
    assert trace.retrieval.retriever == "Retrieve.forward"


def test_nested_retriever_documents_match_by_position_when_contents_differ() -> None:
    # the outer span trimmed the passages (a long_text vs text field): same count, so by position
    inner = _passages(("a", 0.9, "Refunds take 30 days. | policy"), ("b", 0.5, "Shipping | faq"))
    outer = _passages((None, None, "Refunds take 30 days."), (None, None, "Shipping"))
    spans = [span(1, None, 0, 100, {KIND: CHAIN}), span(2, 1, 1, 20, outer), span(3, 2, 2, 19, inner)]
    chunks = build(spans).retrieval.chunks
    assert [(c.id, c.score, c.content) for c in chunks] == [
        ("a", 0.9, "Refunds take 30 days."),
        ("b", 0.5, "Shipping"),
    ]


def test_an_outer_retriever_keeps_its_own_ids_and_scores() -> None:
    inner = _passages(("inner-1", 0.1, "Refunds take 30 days."))
    outer = _passages(("outer-1", 0.8, "Refunds take 30 days."), (None, None, "unmatched passage"))
    spans = [span(1, None, 0, 100, {KIND: CHAIN}), span(2, 1, 1, 20, outer), span(3, 2, 2, 19, inner)]
    chunks = build(spans).retrieval.chunks
    assert (chunks[0].id, chunks[0].score) == ("outer-1", 0.8)
    assert chunks[1].id.startswith("sha256:") and chunks[1].score is None  # no match: as the span had it
