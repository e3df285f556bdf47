"""LlamaIndex RAG app: a VectorStoreIndex (in-memory SimpleVectorStore) and its query engine.

Traced by openinference-instrumentation-llama-index over OTLP/HTTP. Building the index embeds the
six documents; that is set-up, not a user request, so a monitor must not store it as one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import CHAT_MODEL, DOCS, EMBEDDING_MODEL, QUESTIONS, TOP_K, Run
from llama_index.core import PromptTemplate, Settings, VectorStoreIndex
from llama_index.core.schema import TextNode
from llama_index.embeddings.openai import OpenAIEmbedding
from llama_index.llms.openai import OpenAI
from openinference.instrumentation.llama_index import LlamaIndexInstrumentor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

QA_TEMPLATE = PromptTemplate("Context:\n{context_str}\n\nQuestion: {query_str}")


def main() -> None:
    run = Run("llamaindex")
    provider = TracerProvider(resource=Resource.create({"service.name": run.app}))
    provider.add_span_processor(run.roots)  # type: ignore[arg-type]
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    LlamaIndexInstrumentor().instrument(tracer_provider=provider)

    # llama-index reads OPENAI_API_BASE, not the SDK's OPENAI_BASE_URL
    base_url = os.environ["OPENAI_BASE_URL"]
    # stream_options: usage in the last chunk; llama-index drops it from non-streaming calls itself
    Settings.llm = OpenAI(
        model=CHAT_MODEL,
        temperature=0,
        api_base=base_url,
        additional_kwargs={"stream_options": {"include_usage": True}},
    )
    Settings.embed_model = OpenAIEmbedding(model=EMBEDDING_MODEL, api_base=base_url)
    index = VectorStoreIndex([TextNode(id_=doc_id, text=text) for doc_id, text in DOCS])
    engines = {
        stream: index.as_query_engine(similarity_top_k=TOP_K, text_qa_template=QA_TEMPLATE, streaming=stream)
        for stream in (False, True)
    }
    run.end_setup()

    for question in QUESTIONS:
        with run.question(question) as record:
            response = engines[question.stream].query(question.text)
            answer = "".join(response.response_gen) if question.stream else str(response.response)
            docs = [(n.node.node_id, n.score, n.node.get_content()) for n in response.source_nodes]
            record.result(answer=answer, docs=docs)

    provider.shutdown()
    run.write()


if __name__ == "__main__":
    main()
