"""A RAG app on Chroma (in-process) and the OpenAI SDK, traced by OpenLIT's auto-instrumentation.

`openlit.init()` sets up tracing from the OTLP environment and instruments Chroma and OpenAI; the
app's own request span is `openlit.start_trace`, its answer set with `set_result`, as OpenLIT's
docs show. The collection embeds with Chroma's own `OpenAIEmbeddingFunction` pointed at the
OpenAI-compatible endpoint (Chroma's default embedding function downloads an ONNX model, which an
offline machine cannot do), so Chroma's query span has the embedding call inside it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import chromadb
import openlit
from chromadb.utils.embedding_functions import OpenAIEmbeddingFunction
from common import DOCS, EMBEDDING_MODEL, QUESTIONS, TOP_K, Run, chat_answer
from openai import OpenAI
from opentelemetry import trace

# OpenLIT fetches its model price list from the internet unless given one; this machine is offline
PRICING = Path(__file__).resolve().parent / "pricing.json"


def main() -> None:
    run = Run("openlit")
    openlit.init(
        application_name=run.app,
        environment="conformance",
        pricing_json=str(PRICING),
        disable_metrics=True,
        # the harness's own calls to the stub (common.stub_calls) go through urllib; the app makes none
        disabled_instrumentors=["urllib"],
    )
    trace.get_tracer_provider().add_span_processor(run.roots)  # type: ignore[attr-defined]

    client = OpenAI()
    chroma = chromadb.EphemeralClient()
    collection = chroma.create_collection(
        "conformance",
        embedding_function=OpenAIEmbeddingFunction(
            model_name=EMBEDDING_MODEL, api_base=os.environ["OPENAI_BASE_URL"]
        ),
        metadata={"hnsw:space": "cosine"},
    )
    collection.add(ids=[d[0] for d in DOCS], documents=[d[1] for d in DOCS])
    run.end_setup()

    for question in QUESTIONS:
        with run.question(question) as record, openlit.start_trace("answer_question") as request:
            found = collection.query(query_texts=[question.text], n_results=TOP_K)
            hits = [
                (doc_id, 1.0 - distance, text)
                for doc_id, distance, text in zip(
                    found["ids"][0], found["distances"][0], found["documents"][0], strict=True
                )
            ]
            answer = chat_answer(client, question, [c for _, _, c in hits])
            request.set_result(answer)
            record.result(answer=answer, docs=hits)

    trace.get_tracer_provider().shutdown()  # type: ignore[attr-defined]
    run.write()


if __name__ == "__main__":
    main()
