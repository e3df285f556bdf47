"""One RAG request's spans as OTLP protobuf, with its timing chosen by the test: a request of 40 s, 3 min
or 10 min whose spans the test sends when it likes, in as many OTLP requests as it likes.

The spans are those of an OpenInference-instrumented app (root CHAIN, RETRIEVER, LLM with token counts),
or, with `genai=True`, of an OTel GenAI instrumentation whose streamed answer comes as a `gen_ai.choice`
log record after its span (`choice_body`).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue, KeyValueList
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.trace.v1.trace_pb2 import Span

NS = 1_000_000_000
# the requests' clock: whole seconds (durations are exact), today (retention keeps what is stored)
BASE_NS = time.time_ns() // NS * NS


def _kv(key: str, value: str | int | float) -> KeyValue:
    if isinstance(value, str):
        return KeyValue(key=key, value=AnyValue(string_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(double_value=value))


@dataclass
class RagRequest:
    """A request of `duration_s`: retrieval right after it starts, then an LLM call until it ends."""

    duration_s: float
    query: str = "How long do refunds take?"
    answer: str = "Refunds take five working days."
    genai: bool = False  # the LLM span is a GenAI one, its answer a gen_ai.choice log record
    start_ns: int = BASE_NS
    trace_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def _span(self, n: int, name: str, start_s: float, end_s: float, parent: int | None) -> Span:
        return Span(
            trace_id=bytes.fromhex(self.trace_id),
            span_id=self.span_id(n),
            parent_span_id=self.span_id(parent) if parent is not None else b"",
            name=name,
            start_time_unix_nano=self.start_ns + int(start_s * NS),
            end_time_unix_nano=self.start_ns + int(end_s * NS),
        )

    @staticmethod
    def span_id(n: int) -> bytes:
        return (0x1000 + n).to_bytes(8, "big")

    @property
    def root(self) -> Span:
        span = self._span(0, "rag", 0.0, self.duration_s, None)
        span.attributes.extend([_kv("openinference.span.kind", "CHAIN"), _kv("input.value", self.query)])
        if not self.genai:
            span.attributes.append(_kv("output.value", self.answer))
        return span

    @property
    def retrieve(self) -> Span:
        span = self._span(1, "retrieve", 0.05, 0.25, 0)
        span.attributes.extend(
            [
                _kv("openinference.span.kind", "RETRIEVER"),
                _kv("input.value", self.query),
                _kv("retrieval.documents.0.document.id", "refund-policy"),
                _kv("retrieval.documents.0.document.score", 0.82),
                _kv("retrieval.documents.0.document.content", "Refunds take five working days."),
            ]
        )
        return span

    def step(self, n: int, at_s: float) -> Span:
        """A tool call of an agent at `at_s`, lasting 1 s."""
        span = self._span(10 + n, f"tool-{n}", at_s, at_s + 1.0, 0)
        span.attributes.append(_kv("openinference.span.kind", "TOOL"))
        return span

    @property
    def generate(self) -> Span:
        span = self._span(2, "generate", 0.3, self.duration_s - 0.01, 0)
        if self.genai:
            span.name = "chat gpt-4o-mini"
            span.attributes.extend(
                [
                    _kv("gen_ai.operation.name", "chat"),
                    _kv("gen_ai.system", "openai"),
                    _kv("gen_ai.request.model", "gpt-4o-mini"),
                    _kv("gen_ai.usage.input_tokens", 1000),
                    _kv("gen_ai.usage.output_tokens", 200),
                ]
            )
        else:
            span.attributes.extend(
                [
                    _kv("openinference.span.kind", "LLM"),
                    _kv("llm.model_name", "gpt-4o-mini"),
                    _kv("llm.token_count.prompt", 1000),
                    _kv("llm.token_count.completion", 200),
                    _kv("output.value", self.answer),
                ]
            )
        return span

    def choice_body(self, app: str = "shop") -> bytes:
        """The streamed answer as the GenAI instrumentation sends it: a log record of the LLM span."""
        message = KeyValueList(values=[_kv("role", "assistant"), _kv("content", self.answer)])
        body = AnyValue(
            kvlist_value=KeyValueList(
                values=[
                    KeyValue(key="index", value=AnyValue(int_value=0)),
                    KeyValue(key="message", value=AnyValue(kvlist_value=message)),
                ]
            )
        )
        record = LogRecord(
            time_unix_nano=self.start_ns + int(self.duration_s * NS) - 5,
            trace_id=bytes.fromhex(self.trace_id),
            span_id=self.span_id(2),
            event_name="gen_ai.choice",
            attributes=[_kv("gen_ai.system", "openai")],
            body=body,
        )
        request = ExportLogsServiceRequest()
        resource = request.resource_logs.add()
        resource.resource.attributes.append(_kv("service.name", app))
        resource.scope_logs.add().log_records.append(record)
        data: bytes = request.SerializeToString()
        return data


def body(*spans: Span, app: str = "shop") -> bytes:
    """An OTLP/HTTP protobuf traces body of these spans."""
    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    resource.resource.attributes.append(_kv("service.name", app))
    resource.scope_spans.add().spans.extend(spans)
    data: bytes = request.SerializeToString()
    return data
