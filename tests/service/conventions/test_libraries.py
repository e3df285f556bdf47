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


# --- OpenLIT 1.45 (chromadb 1.5.9, openai 2.54): GenAI spans, its own `vectordb` spans --------------


def openlit_chat(span_id: str, parent: str, *, stream: bool, ttft_s: float, end_ms: float) -> Span:
    return span(
        span_id,
        parent,
        "chat gpt-4o-mini",
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.response.model": "gpt-4o-mini",
            "gen_ai.request.stream": stream,
            "gen_ai.server.time_to_first_token": ttft_s,
            "gen_ai.usage.input_tokens": 59,
            "gen_ai.usage.output_tokens": 13,
            "gen_ai.usage.cost": 0.0,
            "gen_ai.output.messages": json.dumps(
                [
                    {
                        "role": "assistant",
                        "parts": [{"type": "text", "content": ANSWER}],
                        "finish_reason": "stop",
                    }
                ]
            ),
        },
        20,
        end_ms,
    )


def openlit_trace(*, stream: bool) -> list[Span]:
    """One request as OpenLIT sends it: the app's `openlit.start_trace` span (the answer as a plain
    string), Chroma's query (`GET`, with its top-k, no documents) around the query's embedding call,
    then the chat call."""
    root = span("a" * 16, None, "answer_question", {"gen_ai.output.messages": ANSWER}, 0, 320)
    query = span(
        "b" * 16,
        "a" * 16,
        "GET conformance",
        {
            "gen_ai.operation.name": "vectordb",
            "db.system.name": "chroma",
            "db.operation.name": "GET",
            "db.query.text": f"texts=[{QUESTION!r}]",
            "db.collection.name": "conformance",
            "db.vector.query.top_k": 2,
            "db.response.returned_rows": 2,
        },
        1,
        8,
    )
    embedding = span(
        "c" * 16,
        "b" * 16,
        "embeddings text-embedding-3-small",
        {
            "gen_ai.operation.name": "embeddings",
            "gen_ai.request.model": "text-embedding-3-small",
            "gen_ai.request.stream": False,
            "gen_ai.server.time_to_first_token": 0.0027,
            "gen_ai.usage.input_tokens": 9,
            "gen_ai.input.messages": json.dumps(
                [{"role": "user", "parts": [{"type": "text", "content": QUESTION}]}]
            ),
        },
        2,
        5,
    )
    return [
        root,
        query,
        embedding,
        openlit_chat("d" * 16, "a" * 16, stream=stream, ttft_s=0.1536, end_ms=300),
    ]


def test_openlit_chroma_query_is_the_retrieval_with_its_k() -> None:
    trace = build(*openlit_trace(stream=False))
    assert trace.kind == "request"
    assert (trace.retrieval.retriever, trace.retrieval.k) == ("GET conformance", 2)
    assert trace.timings.retrieval_s is not None and abs(trace.timings.retrieval_s - 0.007) < 1e-9
    assert trace.retrieval.chunks == ()  # OpenLIT sends none of the documents
    # the query is the text the query embedding was made from (the chat's user message is the prompt)
    assert trace.query == QUESTION


def test_openlit_collection_add_and_get_are_not_retrievals() -> None:
    add = span(
        "a" * 16,
        None,
        "INSERT conformance",
        {"gen_ai.operation.name": "vectordb", "db.system.name": "chroma", "db.operation.name": "INSERT"},
    )
    embed = span(
        "b" * 16,
        "a" * 16,
        "embeddings text-embedding-3-small",
        {"gen_ai.operation.name": "embeddings", "gen_ai.usage.input_tokens": 89},
    )
    assert build(add, embed).kind == "embedding"  # index building, not a request
    get = span(
        "a" * 16,
        None,
        "GET conformance",  # collection.get(ids=...): the same operation name, no top-k
        {"gen_ai.operation.name": "vectordb", "db.system.name": "chroma", "db.operation.name": "GET"},
    )
    assert build(get).kind == "other"


def test_openlit_server_ttft_is_read_on_a_streamed_call_only() -> None:
    streamed = build(*openlit_trace(stream=True)).timings
    assert streamed.ttft_s == 0.1536
    # on a call that did not stream, OpenLIT writes the whole call's time under the same name
    assert build(*openlit_trace(stream=False)).timings.ttft_s is None


# --- Pydantic AI 2.78 (its default instrumentation, no Logfire) ---------------------------------------


def pydantic_ai_trace() -> list[Span]:
    root = span("a" * 16, None, "answer_question", {}, 0, 303)
    embedding = span(
        "b" * 16,
        "a" * 16,
        "embeddings text-embedding-3-small",
        {
            "gen_ai.operation.name": "embeddings",
            "gen_ai.request.model": "text-embedding-3-small",
            "input_type": "query",
            "inputs_count": "1",
            "inputs": json.dumps([QUESTION]),
            "gen_ai.usage.input_tokens": 10,
            "gen_ai.response.model": "text-embedding-3-small",
            "operation.cost": 2e-07,
            "embeddings": json.dumps([[0.25, 0.0, -0.5, 0.0]]),
        },
        1,
        4,
    )
    chat = span(
        "d" * 16,
        "c" * 16,
        "chat gpt-4o-mini",
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.usage.input_tokens": 59,
            "gen_ai.usage.output_tokens": 13,
            "gen_ai.client.operation.time_to_first_chunk": 0.17187363000005007,
            "gen_ai.output.messages": json.dumps(
                [
                    {
                        "role": "assistant",
                        "parts": [{"type": "text", "content": ANSWER}],
                        "finish_reason": "stop",
                    }
                ]
            ),
        },
        6,
        300,
    )
    agent = span(
        "c" * 16,
        "a" * 16,
        "invoke_agent agent",
        {"gen_ai.operation.name": "invoke_agent", "gen_ai.aggregated_usage.input_tokens": "59"},
        5,
        301,
    )
    return [root, embedding, agent, chat]


def test_pydantic_ai_time_to_first_chunk_is_the_ttft() -> None:
    trace = build(*pydantic_ai_trace())
    assert trace.timings.ttft_s == 0.17187363000005007
    assert trace.answer == ANSWER


def test_pydantic_ai_query_embedding_comes_from_its_inputs_and_embeddings() -> None:
    trace = build(*pydantic_ai_trace())
    assert trace.query == QUESTION
    assert trace.query_embedding is not None
    assert (trace.query_embedding.model, trace.query_embedding.vector) == (
        "text-embedding-3-small",
        (0.25, 0.0, -0.5, 0.0),
    )
    # a corpus' vectors (input_type "document") are never read
    root, embedding, agent, chat = pydantic_ai_trace()
    embedding.attributes["input_type"] = "document"
    assert build(root, embedding, agent, chat).query_embedding is None


# --- LangChain.js (@langchain/core 1.4, @arizeai/openinference-instrumentation-langchain 4.1.1) ------


def langchain_js_retriever(docs: list[tuple[str, float, str]]) -> Span:
    """A retriever that keeps scores as LangChain's docs show (`metadata.score`); the instrumentation
    lists contents and metadata, the ids only in output.value, as LangChain.js serialises documents
    (`pageContent`)."""
    attributes: dict = {
        "openinference.span.kind": "RETRIEVER",
        "input.value": QUESTION,
        "input.mime_type": "text/plain",
        "output.value": json.dumps(
            {"documents": [{"pageContent": c, "metadata": {"score": s}, "id": i} for i, s, c in docs]}
        ),
        "output.mime_type": "application/json",
        "metadata": "{}",
    }
    for n, (_, score, content) in enumerate(docs):
        attributes[f"retrieval.documents.{n}.document.content"] = content
        attributes[f"retrieval.documents.{n}.document.metadata"] = json.dumps({"score": score})
    return span("b" * 16, "a" * 16, "ScoredRetriever", attributes)


def test_langchain_js_scores_from_metadata_and_ids_from_output_value() -> None:
    root = span(
        "a" * 16, None, "RunnableSequence", {"openinference.span.kind": "CHAIN", "input.value": QUESTION}
    )
    retriever = langchain_js_retriever(
        [("doc-alpha", 0.6715455047720653, ALPHA), ("doc-epsilon", 0.453, EPSILON)]
    )
    trace = build(root, retriever)
    assert [(c.id, c.score, c.content) for c in trace.retrieval.chunks] == [
        ("doc-alpha", 0.6715455047720653, ALPHA),
        ("doc-epsilon", 0.453, EPSILON),
    ]
    assert trace.retrieval.top1_score == 0.6715455047720653


def test_a_score_of_its_own_wins_over_the_metadatas() -> None:
    retriever = span(
        "b" * 16,
        None,
        "retrieve",
        {
            "openinference.span.kind": "RETRIEVER",
            "retrieval.documents.0.document.id": "doc-alpha",
            "retrieval.documents.0.document.score": 0.9,
            "retrieval.documents.0.document.metadata": json.dumps({"score": 0.1}),
            "retrieval.documents.1.document.id": "doc-epsilon",
            "retrieval.documents.1.document.metadata": json.dumps({"score": "high", "relevance_score": 0.4}),
        },
    )
    assert [c.score for c in build(retriever).retrieval.chunks] == [0.9, 0.4]


# --- @arizeai/openinference-instrumentation-openai 4.2.7 on openai 6.49 (Node) ------------------------


def test_node_openai_streamed_call_without_token_counts_is_unknown_usage() -> None:
    """The Node instrumentation records no token counts on a streamed call, although the app asked for
    usage (`stream_options.include_usage`) and got it: its tokens are unknown, not 0, and its cost
    unknown, not "unpriced" (the model has a price)."""
    root = span(
        "a" * 16, None, "answer_question", {"openinference.span.kind": "CHAIN", "input.value": QUESTION}
    )
    llm = span(
        "b" * 16,
        "a" * 16,
        "OpenAI Chat Completions",
        {
            "openinference.span.kind": "LLM",
            "llm.model_name": "gpt-4o-mini",
            "llm.invocation_parameters": json.dumps(
                {"model": "gpt-4o-mini", "stream": True, "stream_options": {"include_usage": True}}
            ),
            "llm.system": "openai",
            "output.value": ANSWER,
            "output.mime_type": "text/plain",
        },
    )
    trace = build(root, llm)
    (usage,) = trace.usage
    assert (usage.input_tokens, usage.output_tokens, usage.cost_usd, usage.cost_source) == (
        None,
        None,
        None,
        "unknown_usage",
    )
    assert (trace.input_tokens, trace.output_tokens, trace.cost_usd) == (None, None, None)
    assert (trace.known_input_tokens, trace.known_output_tokens) == (0, 0)
    assert trace.unpriced_models == () and trace.usage_unknown_models == ("gpt-4o-mini",)


def test_openlit_streamed_calls_details_logged_in_the_request_span_do_not_make_its_question() -> None:
    """OpenLIT logs a streamed call's `gen_ai.client.inference.operation.details` after the chat span
    ended, so the log record names the request span around it; its user message is the prompt, not
    the question, and the request span is no model call."""
    prompt = f"Context:\n{ALPHA}\n\nQuestion: {QUESTION}"
    details = SpanEvent(
        "gen_ai.client.inference.operation.details",
        T0 + 301 * MS,
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.input.messages": [{"role": "user", "parts": [{"type": "text", "content": prompt}]}],
            "gen_ai.output.messages": [
                {"role": "assistant", "parts": [{"type": "text", "content": "other"}]}
            ],
        },
    )
    root, *rest = openlit_trace(stream=True)
    root.events.append(details)
    trace = build(root, *rest)
    assert (trace.query, trace.answer) == (QUESTION, ANSWER)
