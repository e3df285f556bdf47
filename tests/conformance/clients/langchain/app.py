"""LangChain RAG app (`chain.py`), traced by openinference-instrumentation-langchain over OTLP/HTTP.

The exporter is configured from the standard OTEL_EXPORTER_OTLP_* environment.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chain import ask, build_chain
from common import QUESTIONS, Run
from openinference.instrumentation.langchain import LangChainInstrumentor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor


def main() -> None:
    run = Run("langchain")
    provider = TracerProvider(resource=Resource.create({"service.name": run.app}))
    provider.add_span_processor(run.roots)  # type: ignore[arg-type]
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    LangChainInstrumentor().instrument(tracer_provider=provider)

    chain = build_chain()
    run.end_setup()
    for question in QUESTIONS:
        with run.question(question) as record:
            ask(chain, question, record)
    provider.shutdown()
    run.write()


if __name__ == "__main__":
    main()
