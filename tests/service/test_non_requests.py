"""Tests of how a trace is classified (`RagTrace.kind`) and of service/non_requests.py: work that is not a
user request (index building, batch embedding, health checks) is counted apart and never monitored."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from openinference.semconv.trace import EmbeddingAttributes, OpenInferenceSpanKindValues, SpanAttributes
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from service.conventions.pricing import PriceTable
from service.conventions.semconv import build_trace
from service.conventions.spans import Span
from tests.live_server import LiveServer, live_server

KIND = SpanAttributes.OPENINFERENCE_SPAN_KIND
TRACE = "0af7651916cd43dd8448eb211c80319c"


def _span(span_id: str, parent: str | None, attributes: dict, name: str = "s") -> Span:
    return Span(TRACE, span_id, parent, name, 1_000, 2_000, attributes, resource={"service.name": "kb"})


def _kind(*spans: Span) -> str:
    return build_trace(spans, partial=False, prices=PriceTable.default()).kind


@pytest.mark.parametrize(
    ("spans", "kind"),
    [
        # LlamaIndex building an index: a chain around batch embedding calls
        (
            [
                _span(
                    "a" * 16, None, {KIND: "CHAIN", SpanAttributes.INPUT_VALUE: "chunk one of the handbook"}
                ),
                _span(
                    "b" * 16, "a" * 16, {KIND: "EMBEDDING", "embedding.model_name": "text-embedding-3-small"}
                ),
            ],
            "embedding",
        ),
        # OTel GenAI: a batch embedding job
        ([_span("c" * 16, None, {"gen_ai.operation.name": "embeddings"})], "embedding"),
        # a health check: no RAG stage, no question and answer
        ([_span("d" * 16, None, {"http.route": "/healthz"})], "other"),
        # any retrieval, reranking or generation is a request
        ([_span("e" * 16, None, {KIND: "RETRIEVER"})], "request"),
        ([_span("e" * 16, None, {"gen_ai.operation.name": "chat"})], "request"),
        ([_span("e" * 16, None, {KIND: "RERANKER"})], "request"),
        # an app that instruments only its top-level function, with its question (and answer)
        (
            [_span("f" * 16, None, {KIND: "CHAIN", "input.value": "Where is it?", "output.value": "Here."})],
            "request",
        ),
        ([_span("f" * 16, None, {KIND: "CHAIN", "input.value": "Where is it?"})], "request"),
        # a question embedded for retrieval by an uninstrumented store, then generation: a request
        (
            [
                _span("a" * 16, None, {KIND: "CHAIN", "input.value": "Where is it?"}),
                _span("b" * 16, "a" * 16, {KIND: "EMBEDDING"}),
                _span("c" * 16, "a" * 16, {KIND: "LLM", "output.value": "Here."}),
            ],
            "request",
        ),
    ],
)
def test_a_trace_is_a_request_only_when_it_retrieves_reranks_or_generates(
    spans: list[Span], kind: str
) -> None:
    assert _kind(*spans) == kind


def _index_build(provider: TracerProvider, n: int) -> str:
    """What LlamaIndex records when it embeds a corpus in-process: one trace, batch embedding calls."""
    tracer = provider.get_tracer("llama_index")
    with tracer.start_as_current_span("VectorStoreIndex.build_index_from_nodes") as root:
        root.set_attribute(KIND, OpenInferenceSpanKindValues.CHAIN.value)
        for i in range(n):
            with tracer.start_as_current_span("OpenAIEmbedding.get_text_embedding_batch") as span:
                span.set_attribute(KIND, OpenInferenceSpanKindValues.EMBEDDING.value)
                span.set_attribute(SpanAttributes.EMBEDDING_MODEL_NAME, "text-embedding-3-small")
                prefix = f"{SpanAttributes.EMBEDDING_EMBEDDINGS}.0."
                span.set_attribute(prefix + EmbeddingAttributes.EMBEDDING_TEXT, f"Handbook chapter {i}")
                span.set_attribute(prefix + EmbeddingAttributes.EMBEDDING_VECTOR, [0.1 * i, 0.2, 0.3])
                span.set_attribute(SpanAttributes.LLM_TOKEN_COUNT_PROMPT, 1000)
        return f"{root.get_span_context().trace_id:032x}"


def _question(provider: TracerProvider) -> str:
    tracer = provider.get_tracer("llama_index")
    with tracer.start_as_current_span("RetrieverQueryEngine.query") as root:
        root.set_attribute(KIND, OpenInferenceSpanKindValues.CHAIN.value)
        root.set_attribute(SpanAttributes.INPUT_VALUE, "What is the refund window?")
        with tracer.start_as_current_span("retrieve") as span:
            span.set_attribute(KIND, OpenInferenceSpanKindValues.RETRIEVER.value)
            span.set_attribute("retrieval.documents.0.document.id", "refunds")
        with tracer.start_as_current_span("llm") as span:
            span.set_attribute(KIND, OpenInferenceSpanKindValues.LLM.value)
            span.set_attribute(SpanAttributes.LLM_MODEL_NAME, "gpt-4o-mini")
            span.set_attribute(SpanAttributes.OUTPUT_VALUE, "30 days.")
        root.set_attribute(SpanAttributes.OUTPUT_VALUE, "30 days.")
        return f"{root.get_span_context().trace_id:032x}"


@pytest.fixture(params=[False, True], ids=["count-only", "keep"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveServer]:
    with live_server(
        tmp_path, assembler={"grace_s": 0.05}, store={"keep_non_requests": request.param}
    ) as live:
        yield live


def _rows(live: LiveServer, table: str) -> list[tuple]:
    with live.pipeline.store.engine.connect() as conn:
        return list(conn.execute(sa.text(f"SELECT trace_id FROM {table} ORDER BY trace_id")))


def test_an_index_build_is_counted_apart_and_never_monitored(server: LiveServer) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "kb-bot"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{server.url}/v1/traces")))
    build_id = _index_build(provider, 3)
    request_ids = [_question(provider) for _ in range(2)]
    provider.shutdown()
    deadline = time.monotonic() + 15
    while server.metric("ragmon_traces_total", app="kb-bot") < 2 and time.monotonic() < deadline:
        server.flush()
        time.sleep(0.05)
    server.flush()
    assert server.metric("ragmon_traces_total", app="kb-bot") == 2
    assert server.metric("ragmon_non_request_traces_total", app="kb-bot", kind="embedding") == 1
    assert server.metric("ragmon_non_request_cost_usd_total", app="kb-bot", kind="embedding") > 0
    # its 3,000 embedding tokens are in no request metric; the two requests price nothing of theirs
    assert (
        server.metric("ragmon_tokens_total", app="kb-bot", model="text-embedding-3-small", kind="input") == 0
    )
    assert server.metric("ragmon_trace_cost_usd_count", app="kb-bot") == 0
    stored = {row[0] for row in _rows(server, "traces")}
    assert stored == set(request_ids)
    kept = [row[0] for row in _rows(server, "non_request_traces")]
    assert kept == ([build_id] if server.config.store.keep_non_requests else [])
    with server.client() as client:
        assert client.get(f"/api/v1/traces/{build_id}").status_code == 404
    queued = {row[0] for row in _rows(server, "judge_queue")}
    assert build_id not in queued and queued <= set(request_ids)
    drift = server.pipeline.drift_sink
    assert drift is not None and drift.held == 2  # one query observation per request, none for the build
