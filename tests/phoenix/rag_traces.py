"""RAG traces as an OpenInference-instrumented app exports them, recorded in memory with their span ids."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format
from openinference.semconv.trace import DocumentAttributes, OpenInferenceSpanKindValues, SpanAttributes
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

KIND = SpanAttributes.OPENINFERENCE_SPAN_KIND
PROJECT = "openinference.project.name"


@dataclass(frozen=True)
class SentTrace:
    trace_id: str
    root_span_id: str
    spans: tuple[tuple[str, str, str | None], ...]  # (span id, name, parent span id)


class RagApp:
    """Records RAG requests with the OTel SDK; `request()` returns the spans as one OTLP export request."""

    def __init__(self, project: str, service: str = "shop") -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(resource=Resource({"service.name": service, PROJECT: project}))
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def rag(self, query: str, answer: str, chunk: str) -> SentTrace:
        tracer = self.provider.get_tracer("rag-app")
        with tracer.start_as_current_span("rag") as root:
            root.set_attribute(KIND, OpenInferenceSpanKindValues.CHAIN.value)
            root.set_attribute(SpanAttributes.INPUT_VALUE, query)
            with tracer.start_as_current_span("retrieve") as span:
                span.set_attribute(KIND, OpenInferenceSpanKindValues.RETRIEVER.value)
                span.set_attribute(SpanAttributes.INPUT_VALUE, query)
                prefix = f"{SpanAttributes.RETRIEVAL_DOCUMENTS}.0."
                span.set_attribute(prefix + DocumentAttributes.DOCUMENT_ID, "policy-1")
                span.set_attribute(prefix + DocumentAttributes.DOCUMENT_SCORE, 0.83)
                span.set_attribute(prefix + DocumentAttributes.DOCUMENT_CONTENT, chunk)
            with tracer.start_as_current_span("generate") as span:
                span.set_attribute(KIND, OpenInferenceSpanKindValues.LLM.value)
                span.set_attribute(SpanAttributes.LLM_MODEL_NAME, "gpt-4o-mini")
                span.set_attribute(SpanAttributes.OUTPUT_VALUE, answer)
            root.set_attribute(SpanAttributes.OUTPUT_VALUE, answer)
            trace_id = root.get_span_context().trace_id
        spans = [s for s in self.exporter.get_finished_spans() if s.context.trace_id == trace_id]
        return SentTrace(
            trace_id=f"{trace_id:032x}",
            root_span_id=f"{root.get_span_context().span_id:016x}",
            spans=tuple(
                (f"{s.context.span_id:016x}", s.name, f"{s.parent.span_id:016x}" if s.parent else None)
                for s in spans
            ),
        )

    def request(self, traces: Sequence[SentTrace]) -> ExportTraceServiceRequest:
        wanted = {int(t.trace_id, 16) for t in traces}
        finished = self.exporter.get_finished_spans()
        spans: list[ReadableSpan] = [s for s in finished if s.context and s.context.trace_id in wanted]
        return encode_spans(spans)


def otlp_json(request: ExportTraceServiceRequest) -> bytes:
    """The request as OTLP/JSON: protobuf JSON mapping with hex ids, as the OTLP spec writes them."""
    document: Any = json_format.MessageToDict(request)

    def hex_ids(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str):
                    node[key] = base64.b64decode(value).hex()
                else:
                    hex_ids(value)
        elif isinstance(node, list):
            for item in node:
                hex_ids(item)

    hex_ids(document)
    return json.dumps(document).encode()
