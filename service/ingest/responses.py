"""Error answers in the caller's encoding: the one function every layer uses to refuse a request.

OTLP callers (`/v1/traces`, `/v1/logs`, `/v1/metrics`) get a `google.rpc.Status` (protobuf, or its JSON
form for JSON callers) as the OTLP/HTTP spec requires for 4xx/5xx answers;
everyone else gets `{"error": <reason>, "detail": <message>}`. Retryable
errors carry `Retry-After`.
"""

from __future__ import annotations

import json

from google.rpc import status_pb2
from starlette.responses import Response

from service.errors import RagmonError, http_status, retry_after_header

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
OTLP_PATHS = ("/v1/traces", "/v1/logs", "/v1/metrics")

# gRPC status codes used in google.rpc.Status bodies
_GRPC_CODES = {400: 3, 401: 16, 403: 7, 413: 8, 415: 3, 422: 3, 429: 8, 503: 14}


def media_type_of(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip().lower()


def error_response(exc: RagmonError, path: str, content_type: str | None) -> Response:
    status = http_status(exc)
    headers = retry_after_header(exc)
    if path in OTLP_PATHS:
        code = _GRPC_CODES.get(status, 2)
        if media_type_of(content_type) == PROTOBUF:
            body = status_pb2.Status(code=code, message=exc.message).SerializeToString()
            return Response(body, status, headers, PROTOBUF)
        return Response(json.dumps({"code": code, "message": exc.message}), status, headers, JSON)
    return Response(json.dumps({"error": exc.reason, "detail": exc.message}), status, headers, JSON)


def readiness_response(ok: bool, detail: str) -> Response:
    """A `/readyz` answer: 200 when ready, else 503, with what stands in the way."""
    body = {"status": "ok" if ok else "unavailable", "detail": detail}
    return Response(json.dumps(body), 200 if ok else 503, media_type=JSON)
