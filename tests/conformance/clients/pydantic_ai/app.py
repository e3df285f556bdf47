"""A RAG app on Pydantic AI, traced by its own OpenTelemetry instrumentation (no Logfire).

`Agent.instrument_all()` and `Embedder.instrument_all()` (the default settings) make agents and
embedders write GenAI spans to the global
tracer provider, which the app sets up with the OTLP exporter. The model is an OpenAI-compatible
chat endpoint (`openai-chat:`, OPENAI_BASE_URL); the embedder is `openai:` on the same endpoint.
Pydantic AI has no retriever, so the app searches its own in-memory store and records the search
as a GenAI retrieval span (`gen_ai.operation.name=retrieval`, `gen_ai.retrieval.*`), as the
openai_v2 client does. The second question streams (`agent.run_stream`).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import (
    CHAT_MODEL,
    DOCS,
    EMBEDDING_MODEL,
    QUESTIONS,
    SYSTEM_PROMPT,
    TOP_K,
    InMemoryStore,
    Run,
    user_prompt,
)
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind
from pydantic_ai import Agent, Embedder


async def main() -> None:
    run = Run("pydantic_ai")
    provider = TracerProvider(resource=Resource.create({"service.name": run.app}))
    provider.add_span_processor(run.roots)  # type: ignore[arg-type]
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    tracer = trace.get_tracer("conformance.pydantic_ai")

    Agent.instrument_all()  # default settings: the global tracer provider, GenAI conventions
    Embedder.instrument_all()
    agent = Agent(f"openai-chat:{CHAT_MODEL}", instructions=SYSTEM_PROMPT)
    embedder = Embedder(f"openai:{EMBEDDING_MODEL}")
    store = InMemoryStore()
    texts = [d[1] for d in DOCS]
    indexed = await embedder.embed_documents(texts)
    store.add([d[0] for d in DOCS], texts, [list(v) for v in indexed.embeddings])
    run.end_setup()

    for question in QUESTIONS:
        with run.question(question) as record, tracer.start_as_current_span("answer_question"):
            query_vector = list((await embedder.embed_query(question.text)).embeddings[0])
            with tracer.start_as_current_span("retrieval in-memory", kind=SpanKind.CLIENT) as span:
                hits = store.search(query_vector, TOP_K)
                span.set_attributes(
                    {
                        "gen_ai.operation.name": "retrieval",
                        "gen_ai.data_source.id": "in-memory",
                        "gen_ai.request.top_k": TOP_K,
                        "gen_ai.retrieval.query.text": question.text,
                        "gen_ai.retrieval.documents": json.dumps(
                            [{"id": i, "score": s, "content": c} for i, s, c in hits]
                        ),
                    }
                )
            prompt = user_prompt(question.text, [c for _, _, c in hits])
            if question.stream:
                answer = ""
                async with agent.run_stream(prompt) as result:
                    async for delta in result.stream_text(delta=True):
                        answer += delta
            else:
                answer = (await agent.run(prompt)).output
            record.result(answer=answer, docs=hits)

    provider.shutdown()
    run.write()


if __name__ == "__main__":
    asyncio.run(main())
