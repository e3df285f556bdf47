"""OTLP metrics: read, checked, answered as accepted, and not stored.

ragmon computes its own metrics from traces; an app's OTLP metrics (the GenAI
client histograms, the OpenLLMetry SDK's defaults) carry nothing it uses. An
exporter that gets 404 logs an error on every export, forever, so
`/v1/metrics` and gRPC `MetricsService/Export` answer success and count the
request as ignored. The body is still checked, so a client that sends
garbage hears so (400) instead of a success.
"""

from __future__ import annotations

import json

from google.protobuf.message import DecodeError as ProtobufDecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from service.errors import DecodeError
from service.ingest.otlp_body import decompress

__all__ = ["check_metrics_body"]


def check_metrics_body(body: bytes, *, json_body: bool, encoding: str, limit: int) -> None:
    """Raise `DecodeError` (or `PayloadTooLarge`, `UnsupportedMediaType`) unless `body` is an OTLP
    metrics export request; return nothing, as nothing of it is kept."""
    plain = decompress(body, encoding, limit)
    if json_body:
        try:
            document = json.loads(plain.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise DecodeError(f"body is not valid UTF-8 (byte {exc.start}: {exc.reason})") from exc
        except (ValueError, RecursionError) as exc:
            raise DecodeError(f"body is not valid JSON: {exc}") from exc
        if not isinstance(document, dict) or not isinstance(document.get("resourceMetrics", []), list):
            raise DecodeError("body is not an OTLP metrics request: resourceMetrics must be a JSON array")
        return
    try:
        ExportMetricsServiceRequest.FromString(plain)
    except ProtobufDecodeError as exc:
        raise DecodeError(f"body is not a valid OTLP ExportMetricsServiceRequest protobuf: {exc}") from exc
