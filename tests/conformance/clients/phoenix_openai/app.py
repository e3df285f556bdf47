"""A framework-free RAG app on the OpenAI SDK, set up as a Phoenix user would: `phoenix.otel.register`.

`register(endpoint=..., auto_instrument=True)` finds openinference-instrumentation-openai and
instruments the SDK; the app's own request and retriever spans use OpenInference's tracer API.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import (
    DOCS,
    EMBEDDING_MODEL,
    QUESTIONS,
    TOP_K,
    InMemoryStore,
    Run,
    chat_answer,
)
from openai import OpenAI
from openinference.semconv.trace import DocumentAttributes, SpanAttributes
from phoenix.otel import register


def main() -> None:
    run = Run("phoenix_openai")
    provider = register(
        endpoint=os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] + "/v1/traces",
        project_name=run.app,
        auto_instrument=True,
        batch=True,
        verbose=False,
    )
    # phoenix's add_span_processor drops register's exporter unless told not to
    provider.add_span_processor(run.roots, replace_default_processor=False)  # type: ignore[arg-type]
    tracer = provider.get_tracer(__name__)

    client = OpenAI()
    store = InMemoryStore()
    ids, texts = [d[0] for d in DOCS], [d[1] for d in DOCS]
    vectors = client.embeddings.create(model=EMBEDDING_MODEL, input=texts)
    store.add(ids, texts, [e.embedding for e in vectors.data])
    run.end_setup()

    for question in QUESTIONS:
        with (
            run.question(question) as record,
            tracer.start_as_current_span("rag", openinference_span_kind="chain") as root,
        ):
            root.set_input(question.text)
            query_vector = (
                client.embeddings.create(model=EMBEDDING_MODEL, input=question.text).data[0].embedding
            )
            with tracer.start_as_current_span("retrieve", openinference_span_kind="retriever") as span:
                span.set_input(question.text)
                hits = store.search(query_vector, TOP_K)
                for n, (doc_id, score, content) in enumerate(hits):
                    prefix = f"{SpanAttributes.RETRIEVAL_DOCUMENTS}.{n}."
                    span.set_attribute(prefix + DocumentAttributes.DOCUMENT_ID, doc_id)
                    span.set_attribute(prefix + DocumentAttributes.DOCUMENT_SCORE, score)
                    span.set_attribute(prefix + DocumentAttributes.DOCUMENT_CONTENT, content)
            answer = chat_answer(client, question, [c for _, _, c in hits])
            root.set_output(answer)
            record.result(answer=answer, docs=hits)

    provider.shutdown()
    run.write()


if __name__ == "__main__":
    main()
