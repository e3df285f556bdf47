"""`OtlpGrpcReceiver`: OTLP/gRPC `TraceService/Export` on its own port (4317 by default).

Same rules as the HTTP receiver: API key from the `authorization` (Bearer)
or `x-api-key` metadata, loopback-only when no keys exist; per-span problems
answered with `partial_success`; an undecodable request is INVALID_ARGUMENT;
a full bus is UNAVAILABLE, which OTLP exporters retry with backoff.

The method is registered without a request deserializer: the handler gets the
raw protobuf bytes and decodes them in the pipeline's `IngestPool`, like the
HTTP receiver, instead of parsing on the event loop.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from service.errors import PermanentError, RetryableError
from service.ingest.auth import TenantResolver, key_from_headers
from service.ingest.responses import PROTOBUF
from service.ingest.target import IngestTarget

log = logging.getLogger(__name__)


def _peer_host(peer: str) -> str | None:
    # grpc peers look like "ipv4:127.0.0.1:5555" or "ipv6:[::1]:5555"
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    if kind == "ipv6":
        return rest.rsplit(":", 1)[0].strip("[]")
    return None


_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


class _TraceService:
    def __init__(self, pipeline: IngestTarget, resolver: TenantResolver) -> None:
        self.pipeline = pipeline
        self.resolver = resolver

    async def export(
        self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        metrics = self.pipeline.metrics
        metadata = [(m.key, m.value) for m in context.invocation_metadata() or () if isinstance(m.value, str)]
        try:
            tenant = self.resolver.resolve(key_from_headers(metadata), _peer_host(context.peer()))
        except PermanentError as exc:
            metrics.reject(exc.reason)
            code = (
                grpc.StatusCode.UNAUTHENTICATED
                if exc.status_code == 401
                else grpc.StatusCode.PERMISSION_DENIED
            )
            await context.abort(code, exc.message)
        try:
            self.pipeline.check_room()
            # grpc has already undone any transport compression
            decoded = await self.pipeline.ingest_pool.decode(
                request, json_body=False, encoding="", tenant=tenant, limit=len(request)
            )
            for reason, count in decoded.rejections.items():
                metrics.reject(reason, count)
            await self.pipeline.accept_spans(decoded.spans, receiver="otlp_grpc")
            self.pipeline.phoenix_forward.offer(request, PROTOBUF)
        except PermanentError as exc:
            metrics.reject(exc.reason)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
        except RetryableError as exc:
            metrics.reject(exc.reason)
            await context.abort(grpc.StatusCode.UNAVAILABLE, exc.message)
        answer = trace_service_pb2.ExportTraceServiceResponse()
        if decoded.rejected_spans or decoded.error_message:
            answer.partial_success.rejected_spans = decoded.rejected_spans
            answer.partial_success.error_message = decoded.error_message
        return answer


class OtlpGrpcReceiver:
    """Owns the grpc.aio server; `start()` binds the port, `stop()` lets in-flight calls finish."""

    def __init__(
        self, pipeline: IngestTarget, resolver: TenantResolver, host: str, port: int, max_bytes: int
    ) -> None:
        self.pipeline = pipeline
        self.resolver = resolver
        self.host = host
        self.port = port
        self.max_bytes = max_bytes
        self.bound_port: int | None = None
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", self.max_bytes)])
        export = grpc.unary_unary_rpc_method_handler(
            _TraceService(self.pipeline, self.resolver).export,
            request_deserializer=None,  # raw bytes: decoded in the IngestPool
            response_serializer=trace_service_pb2.ExportTraceServiceResponse.SerializeToString,
        )
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, {"Export": export}),))
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.bound_port = server.add_insecure_port(f"{host}:{self.port}")
        await server.start()
        self._server = server
        log.info("OTLP/gRPC receiver listening on %s:%d", self.host, self.bound_port)

    async def stop(self, grace_s: float = 5.0) -> None:
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
