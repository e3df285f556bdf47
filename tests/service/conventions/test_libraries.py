"""Tests of service/conventions/ against span shapes real instrumentation libraries send (read off
captures of the unmodified libraries in tests/conformance): each case failed before ragmon read it.

The end-to-end versions, with the libraries themselves, are in tests/conformance; these pin the
shapes so a regression shows here even where those virtualenvs are not built."""

from __future__ import annotations

import json

from service.conventions.pricing import PriceTable
from service.conventions.semconv import build_trace
from service.conventions.spans import Span, SpanEvent
from service.model import RagTrace

TRACE = "3f2a6b1c9d8e7f60112233445566778a"
T0 = 1_764_000_000_000_000_000
MS = 1_000_000
ALPHA = "The Alpha lighthouse was built in 1871 on the northern cliff."
EPSILON = "Epsilon park has a rose garden and a pond with ducks."
QUESTION = "When was the Alpha lighthouse built?"
ANSWER = "Answer: in 1871."


def span(
    span_id: str,
    parent: str | None,
    name: str,
    attributes: dict,
    start_ms: float = 0,
    end_ms: float = 10,
    events: list[SpanEvent] | None = None,
) -> Span:
    return Span(
        trace_id=TRACE,
        span_id=span_id,
        parent_span_id=parent,
        name=name,
        start_ns=T0 + int(start_ms * MS),
        end_ns=T0 + int(end_ms * MS),
        attributes=attributes,
        events=events or [],
        resource={"service.name": "conformance"},
    )


def build(*spans: Span) -> RagTrace:
    return build_trace(spans, partial=False, prices=PriceTable.default())


def lc_document(doc_id: str, content: str, serialised: bool = False) -> dict:
    if serialised:
        return {
            "lc": 1,
            "type": "constructor",
            "id": ["langchain", "schema", "document", "Document"],
            "kwargs": {"id": doc_id, "page_content": content, "type": "Document"},
        }
    return {"id": doc_id, "metadata": {}, "page_content": content, "type": "Document"}


def test_openinference_langchain_ids_come_from_the_retrievers_output_value() -> None:
    """The retriever span lists contents only; the vector store's ids ride in output.value."""
    retriever = span(
        "b" * 16,
        "a" * 16,
        "VectorStoreRetriever",
        {
            "openinference.span.kind": "RETRIEVER",
            "input.value": QUESTION,
            "output.value": json.dumps(
                {"documents": [lc_document("doc-alpha", ALPHA), lc_document("doc-epsilon", EPSILON)]}
            ),
            "output.mime_type": "application/json",
            "retrieval.documents.0.document.content": ALPHA,
            "retrieval.documents.1.document.content": EPSILON,
        },
    )
    root = span(
        "a" * 16, None, "RunnableSequence", {"openinference.span.kind": "CHAIN", "input.value": QUESTION}
    )
    trace = build(root, retriever)
    assert [(c.id, c.content, c.rank) for c in trace.retrieval.chunks] == [
        ("doc-alpha", ALPHA, 0),
        ("doc-epsilon", EPSILON, 1),
    ]


def test_payload_ids_are_used_only_where_the_contents_agree() -> None:
    retriever = span(
        "b" * 16,
        None,
        "VectorStoreRetriever",
        {
            "openinference.span.kind": "RETRIEVER",
            "output.value": json.dumps({"documents": [lc_document("doc-other", "something else")]}),
            "retrieval.documents.0.document.content": ALPHA,
        },
    )
    (chunk,) = build(retriever).retrieval.chunks
    assert chunk.id.startswith("sha256:")


def traceloop_trace(with_ids_in_chain: bool) -> list[Span]:
    """OpenLLMetry on LangChain: a workflow, a `vector_db_retrieve` task, a chat call."""
    documents = [lc_document("doc-alpha", ALPHA, True), lc_document("doc-epsilon", EPSILON, True)]
    chain_output = {"outputs": {"context": documents if with_ids_in_chain else [], "question": QUESTION}}
    return [
        span(
            "a" * 16,
            None,
            "RunnableSequence.workflow",
            {
                "traceloop.span.kind": "workflow",
                "gen_ai.operation.name": "invoke_agent",
                "traceloop.entity.input": json.dumps({"inputs": QUESTION, "tags": [], "metadata": {}}),
                "traceloop.entity.output": json.dumps({"outputs": {"answer": ANSWER}}),
            },
            0,
            40,
        ),
        span(
            "c" * 16,
            "a" * 16,
            "execute_task RunnableParallel<context,question>",
            {"traceloop.span.kind": "task", "traceloop.entity.output": json.dumps(chain_output)},
            1,
            9,
        ),
        span(
            "b" * 16,
            "c" * 16,
            "vector_db_retrieve VectorStoreRetriever",
            {
                "gen_ai.operation.name": "vector_db_retrieve",
                "traceloop.span.kind": "task",
                "traceloop.entity.input": json.dumps({"query": QUESTION, "tags": []}),
                "traceloop.entity.output": json.dumps(
                    {
                        "documents": [
                            {"page_content": ALPHA, "metadata": {}},
                            {"page_content": EPSILON, "metadata": {}},
                        ],
                        "count": 2,
                    }
                ),
            },
            2,
            7,
        ),
        span(
            "d" * 16,
            "a" * 16,
            "ChatOpenAI.chat",
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "gpt-4o-mini",
                "gen_ai.input.messages": json.dumps(
                    [{"role": "user", "parts": [{"type": "text", "content": "Context: ..."}]}]
                ),
                "gen_ai.output.messages": json.dumps(
                    [{"role": "unknown", "parts": [{"type": "text", "content": ANSWER}]}]
                ),
                "gen_ai.usage.input_tokens": 56,
                "gen_ai.usage.output_tokens": 10,
            },
            10,
            35,
        ),
    ]


def test_openllmetry_vector_db_retrieve_is_a_retrieval_with_the_chains_document_ids() -> None:
    trace = build(*traceloop_trace(with_ids_in_chain=True))
    assert trace.kind == "request"
    assert trace.retrieval.retriever == "vector_db_retrieve VectorStoreRetriever"
    assert [(c.id, c.content) for c in trace.retrieval.chunks] == [
        ("doc-alpha", ALPHA),
        ("doc-epsilon", EPSILON),
    ]
    assert trace.timings.retrieval_s == 0.005
    assert (trace.query, trace.answer) == (QUESTION, ANSWER)


def test_openllmetry_documents_without_ids_anywhere_get_content_hashes() -> None:
    trace = build(*traceloop_trace(with_ids_in_chain=False))
    assert [c.content for c in trace.retrieval.chunks] == [ALPHA, EPSILON]
    assert all(c.id.startswith("sha256:") for c in trace.retrieval.chunks)


def test_a_document_names_its_id_in_metadata() -> None:
    retriever = span(
        "b" * 16,
        None,
        "retrieve",
        {
            "openinference.span.kind": "RETRIEVER",
            "retrieval.documents.0.document.content": ALPHA,
            "retrieval.documents.0.document.metadata": json.dumps({"doc_id": "handbook-7"}),
        },
    )
    assert [c.id for c in build(retriever).retrieval.chunks] == ["handbook-7"]


def test_genai_retrieval_span_gives_k_and_an_llm_top_k_does_not() -> None:
    retrieval = span(
        "b" * 16,
        "a" * 16,
        "retrieval in-memory",
        {
            "gen_ai.operation.name": "retrieval",
            "gen_ai.request.top_k": 2,
            "gen_ai.retrieval.query.text": QUESTION,
            "gen_ai.retrieval.documents": json.dumps([{"id": "doc-alpha", "score": 0.9, "content": ALPHA}]),
        },
    )
    chat = span("c" * 16, "a" * 16, "chat", {"gen_ai.operation.name": "chat", "gen_ai.request.top_k": 40})
    root = span("a" * 16, None, "answer_question", {})
    assert build(root, retrieval, chat).retrieval.k == 2
    assert build(root, chat).retrieval.k is None


def test_llamaindex_streamed_call_ends_at_its_first_token_event() -> None:
    """LlamaIndex ends a streaming LLM span when it hands the stream out; the first-token event,
    on the nested span, comes ~160 ms later."""
    root = span(
        "a" * 16,
        None,
        "RetrieverQueryEngine.query",
        {"openinference.span.kind": "CHAIN", "input.value": QUESTION},
        0,
        300,
    )
    outer = span("b" * 16, "a" * 16, "OpenAI.stream", {"openinference.span.kind": "LLM"}, 11.6, 13.1)
    inner = span(
        "c" * 16,
        "b" * 16,
        "OpenAI.stream_chat",
        {"openinference.span.kind": "LLM", "llm.model_name": "gpt-4o-mini", "output.value": ANSWER},
        12.3,
        13.0,
        events=[SpanEvent("First Token Stream Event", T0 + int(173.8 * MS))],
    )
    timings = build(root, outer, inner).timings
    assert timings.ttft_s is not None and abs(timings.ttft_s - 0.1615) < 1e-6
    assert timings.generation_s is not None and abs(timings.generation_s - (173.8 - 11.6) / 1000) < 1e-6


def test_a_plain_llm_call_keeps_its_span_duration() -> None:
    llm = span("b" * 16, None, "chat", {"gen_ai.operation.name": "chat"}, 0, 250)
    assert build(llm).timings.generation_s == 0.25
