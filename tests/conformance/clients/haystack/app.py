"""Haystack 2 RAG pipeline, traced by openinference-instrumentation-haystack over OTLP/HTTP.

embedder -> InMemoryEmbeddingRetriever -> ChatPromptBuilder -> OpenAIChatGenerator, as in
Haystack's RAG tutorial. The documents are embedded (OpenAIDocumentEmbedder) before the
pipeline runs; that is set-up, not a user request.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import CHAT_MODEL, DOCS, EMBEDDING_MODEL, QUESTIONS, SYSTEM_PROMPT, TOP_K, Run
from haystack import Document, Pipeline
from haystack.components.builders import ChatPromptBuilder
from haystack.components.embedders import OpenAIDocumentEmbedder, OpenAITextEmbedder
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.components.retrievers.in_memory import InMemoryEmbeddingRetriever
from haystack.dataclasses import ChatMessage, StreamingChunk
from haystack.document_stores.in_memory import InMemoryDocumentStore
from openinference.instrumentation.haystack import HaystackInstrumentor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

TEMPLATE = [
    ChatMessage.from_system(SYSTEM_PROMPT),
    ChatMessage.from_user(
        "Context:\n{% for d in documents %}{{ d.content }}\n\n{% endfor %}Question: {{ question }}"
    ),
]


def main() -> None:
    run = Run("haystack")
    provider = TracerProvider(resource=Resource.create({"service.name": run.app}))
    provider.add_span_processor(run.roots)  # type: ignore[arg-type]
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    HaystackInstrumentor().instrument(tracer_provider=provider)

    base_url = os.environ["OPENAI_BASE_URL"]
    store = InMemoryDocumentStore(embedding_similarity_function="cosine")
    embedded = OpenAIDocumentEmbedder(model=EMBEDDING_MODEL, api_base_url=base_url).run(
        [Document(id=doc_id, content=text) for doc_id, text in DOCS]
    )
    store.write_documents(embedded["documents"])

    pipeline = Pipeline()
    pipeline.add_component("embedder", OpenAITextEmbedder(model=EMBEDDING_MODEL, api_base_url=base_url))
    pipeline.add_component("retriever", InMemoryEmbeddingRetriever(store, top_k=TOP_K))
    pipeline.add_component("prompt_builder", ChatPromptBuilder(template=TEMPLATE, required_variables="*"))
    pipeline.add_component("llm", OpenAIChatGenerator(model=CHAT_MODEL, api_base_url=base_url))
    pipeline.connect("embedder.embedding", "retriever.query_embedding")
    pipeline.connect("retriever.documents", "prompt_builder.documents")
    pipeline.connect("prompt_builder.prompt", "llm.messages")
    run.end_setup()

    for question in QUESTIONS:
        with run.question(question) as record:
            pieces: list[str] = []

            def on_chunk(chunk: StreamingChunk, pieces: list[str] = pieces) -> None:
                pieces.append(chunk.content)

            llm_args: dict[str, object] = {}
            if question.stream:
                llm_args = {
                    "streaming_callback": on_chunk,
                    "generation_kwargs": {"stream_options": {"include_usage": True}},
                }
            result = pipeline.run(
                {
                    "embedder": {"text": question.text},
                    "prompt_builder": {"question": question.text},
                    "llm": llm_args,
                },
                include_outputs_from={"retriever"},
            )
            answer = result["llm"]["replies"][0].text or ""
            if question.stream and "".join(pieces) != answer:
                raise AssertionError(f"streamed {''.join(pieces)!r}, reply {answer!r}")
            docs = [(d.id, d.score, d.content or "") for d in result["retriever"]["documents"]]
            record.result(answer=answer, docs=docs)

    provider.shutdown()
    run.write()


if __name__ == "__main__":
    main()
