"""Traces and feedback for the distributed tests: distinct, valid records with known ids."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from time import time_ns
from typing import Any

from service.model import Feedback, RagTrace, Timings


def trace_ids(n: int) -> list[str]:
    return [uuid.uuid4().hex for _ in range(n)]


def traces(n: int, app: str = "shop") -> list[RagTrace]:
    now = datetime.now(UTC)
    return [
        RagTrace(
            trace_id=trace_id,
            app=app,
            start_time=now,
            query=f"question {i}",
            answer=f"answer {i}",
            timings=Timings(total_s=0.1 + i % 7 / 10),
            source="json",
        )
        for i, trace_id in enumerate(trace_ids(n))
    ]


def feedback_for(batch: list[RagTrace], kind: str = "up") -> list[Feedback]:
    now = datetime.now(UTC)
    return [
        Feedback(event_id=uuid.uuid4().hex, trace_id=t.trace_id, app=t.app, kind=kind, time=now)
        for t in batch
    ]


def json_traces(n: int, app: str = "shop") -> list[dict[str, Any]]:
    """`TraceIn` records for the JSON ingest API."""
    return [
        {"trace_id": trace_id, "app": app, "query": f"question {i}", "answer": f"answer {i}"}
        for i, trace_id in enumerate(trace_ids(n))
    ]


def otlp_body(ids: list[str], part: str = "all", app: str = "shop") -> bytes:
    """An OTLP/HTTP protobuf traces body: one OpenInference RAG trace (root, retriever, LLM) per id.

    `part`: "all" spans, only the "root" span, or only the "children" (a trace whose services
    export to different ingest replicas)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    def kv(key: str, value: str | float) -> KeyValue:
        if isinstance(value, str):
            return KeyValue(key=key, value=AnyValue(string_value=value))
        return KeyValue(key=key, value=AnyValue(double_value=value))

    now = time_ns()
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.append(kv("service.name", app))
    scope = resource_spans.scope_spans.add()
    for n, trace_id in enumerate(ids):
        raw_trace = bytes.fromhex(trace_id)
        root_id = (n * 4 + 1).to_bytes(8, "big")
        if part in ("all", "root"):
            root = scope.spans.add(
                trace_id=raw_trace,
                span_id=root_id,
                name="rag",
                start_time_unix_nano=now,
                end_time_unix_nano=now + 9,
            )
            root.attributes.extend(
                [
                    kv("openinference.span.kind", "CHAIN"),
                    kv("input.value", f"q {n}"),
                    kv("output.value", f"a {n}"),
                ]
            )
        if part in ("all", "children"):
            retrieve = scope.spans.add(
                trace_id=raw_trace,
                span_id=(n * 4 + 2).to_bytes(8, "big"),
                parent_span_id=root_id,
                name="retrieve",
                start_time_unix_nano=now + 1,
                end_time_unix_nano=now + 3,
            )
            retrieve.attributes.extend(
                [
                    kv("openinference.span.kind", "RETRIEVER"),
                    kv("retrieval.documents.0.document.id", "doc-a"),
                    kv("retrieval.documents.0.document.score", 0.9),
                    kv("retrieval.documents.0.document.content", "Refunds are possible within 30 days."),
                ]
            )
            generate = scope.spans.add(
                trace_id=raw_trace,
                span_id=(n * 4 + 3).to_bytes(8, "big"),
                parent_span_id=root_id,
                name="generate",
                start_time_unix_nano=now + 4,
                end_time_unix_nano=now + 8,
            )
            generate.attributes.extend([kv("openinference.span.kind", "LLM"), kv("output.value", f"a {n}")])
    body: bytes = request.SerializeToString()
    return body
