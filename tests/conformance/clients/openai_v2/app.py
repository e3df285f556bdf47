"""A framework-free RAG app on the OpenAI SDK, traced by the OTel contrib openai-v2 instrumentation.

The instrumentation records the chat and embeddings calls as GenAI spans; with
OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true the messages go out as log records
(events), so the app sets up a logs exporter too. The app's own request and retrieval spans use
the GenAI conventions for retrieval (`gen_ai.operation.name=retrieval`, `gen_ai.retrieval.*`).
OTEL_EXPORTER_OTLP_PROTOCOL picks OTLP/HTTP (http/protobuf) or OTLP/gRPC (grpc).
"""

from __future__ import annotations

import json
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
from opentelemetry._logs import set_logger_provider
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind

if os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") == "grpc":
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
else:
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter


def main() -> None:
    run = Run("openai_v2")
    resource = Resource.create({"service.name": run.app})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(run.roots)  # type: ignore[arg-type]
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    logs = LoggerProvider(resource=resource)
    logs.add_log_record_processor(BatchLogRecordProcessor(OTLPLogExporter()))
    set_logger_provider(logs)
    OpenAIInstrumentor().instrument(tracer_provider=provider, logger_provider=logs)
    tracer = provider.get_tracer("conformance.openai_v2")

    client = OpenAI()
    store = InMemoryStore()
    ids, texts = [d[0] for d in DOCS], [d[1] for d in DOCS]
    vectors = client.embeddings.create(model=EMBEDDING_MODEL, input=texts, encoding_format="float")
    store.add(ids, texts, [e.embedding for e in vectors.data])
    run.end_setup()

    for question in QUESTIONS:
        with run.question(question) as record, tracer.start_as_current_span("answer_question"):
            query_vector = (
                client.embeddings.create(model=EMBEDDING_MODEL, input=question.text, encoding_format="float")
                .data[0]
                .embedding
            )
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
            answer = chat_answer(client, question, [c for _, _, c in hits])
            record.result(answer=answer, docs=hits)

    # log records first: they carry the answer, and a monitor can only join them to a trace it
    # has not yet closed
    logs.shutdown()
    provider.shutdown()
    run.write()


if __name__ == "__main__":
    main()
