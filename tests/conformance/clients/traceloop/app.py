"""The LangChain RAG app (`../langchain/chain.py`) traced by OpenLLMetry: `Traceloop.init`.

Traceloop.init instruments every library it finds (LangChain, and the OpenAI SDK underneath it)
and exports OTLP/HTTP to `api_endpoint` + /v1/traces (and metrics to /v1/metrics).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parent))
sys.path.insert(0, str(here.parent / "langchain"))

from chain import ask, build_chain  # noqa: E402
from common import QUESTIONS, Run  # noqa: E402
from opentelemetry import trace  # noqa: E402
from traceloop.sdk import Traceloop  # noqa: E402


def main() -> None:
    run = Run("traceloop")
    Traceloop.init(
        app_name=run.app,
        api_endpoint=os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"],
        telemetry_enabled=False,
    )
    provider = trace.get_tracer_provider()
    provider.add_span_processor(run.roots)  # type: ignore[attr-defined]

    chain = build_chain()
    run.end_setup()
    for question in QUESTIONS:
        with run.question(question) as record:
            ask(chain, question, record)
    provider.shutdown()  # type: ignore[attr-defined]
    run.write()


if __name__ == "__main__":
    main()
