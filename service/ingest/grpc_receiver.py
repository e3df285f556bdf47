"""`OtlpGrpcReceiver`: OTLP/gRPC `TraceService`, `LogsService` and `MetricsService` on one port (4317).

Same rules as the HTTP receiver: API key from the `authorization` (Bearer)
or `x-api-key` metadata, loopback-only when no keys exist; per-span problems
answered with `partial_success`; an undecodable request is INVALID_ARGUMENT;
a full bus is UNAVAILABLE, which OTLP exporters retry with backoff.

Logs and metrics follow the HTTP receiver's rules for them (`otlp_logs.py`,
`otlp_metrics.py`): GenAI events are kept, anything else answered and counted.

The methods are registered without a request deserializer: the handler gets the
raw protobuf bytes and decodes them in the pipeline's `IngestPool`, like the
HTTP receiver, instead of parsing on the event loop.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from service.errors import PayloadTooLarge, PermanentError, RetryableError
from service.ingest.auth import TenantResolver, key_from_headers
from service.ingest.otlp import DecodedBatch
from service.ingest.otlp_logs import DecodedLogs
from service.ingest.otlp_metrics import check_metrics_body
from service.ingest.responses import PROTOBUF
from service.ingest.target import IngestTarget
from service.ingest.wal import LoggedRequest

log = logging.getLogger(__name__)
_T = TypeVar("_T")


def _peer_host(peer: str) -> str | None:
    # grpc peers look like "ipv4:127.0.0.1:5555" or "ipv6:[::1]:5555"
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    if kind == "ipv6":
        return rest.rsplit(":", 1)[0].strip("[]")
    return None


_TRACE_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
_LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"
_METRICS_SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"


class _OtlpServices:
    """The Export method of each OTLP service: one shared path for auth and errors, one body per signal."""

    def __init__(self, pipeline: IngestTarget, resolver: TenantResolver, max_bytes: int) -> None:
        self.pipeline = pipeline
        self.resolver = resolver
        self.max_bytes = max_bytes

    async def _admit(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        """The caller's tenant, once the message is within the size limit (refusals counted)."""
        if len(request) > self.max_bytes:
            exc = PayloadTooLarge(f"message of {len(request)} bytes is over the limit of {self.max_bytes}")
            self.pipeline.metrics.reject(exc.reason)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, exc.message)
        return await self._tenant(context)

    async def _tenant(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        metadata = [(m.key, m.value) for m in context.invocation_metadata() or () if isinstance(m.value, str)]
        try:
            return self.resolver.resolve(key_from_headers(metadata), _peer_host(context.peer()))
        except PermanentError as exc:
            self.pipeline.metrics.reject(exc.reason)
            code = (
                grpc.StatusCode.UNAUTHENTICATED
                if exc.status_code == 401
                else grpc.StatusCode.PERMISSION_DENIED
            )
            await context.abort(code, exc.message)
            raise  # abort raises; this line is for the type checker

    async def _run(self, context: grpc.aio.ServicerContext[Any, Any], work: Awaitable[_T]) -> _T:
        try:
            return await work
        except PermanentError as exc:
            self.pipeline.metrics.reject(exc.reason)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
            raise
        except RetryableError as exc:
            self.pipeline.metrics.reject(exc.reason)
            await context.abort(grpc.StatusCode.UNAVAILABLE, exc.message)
            raise

    async def export_traces(
        self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        tenant = await self._admit(request, context)
        decoded = await self._run(context, self._traces(request, tenant))
        answer = trace_service_pb2.ExportTraceServiceResponse()
        if decoded.rejected_spans or decoded.error_message:
            answer.partial_success.rejected_spans = decoded.rejected_spans
            answer.partial_success.error_message = decoded.error_message
        return answer

    async def _traces(self, request: bytes, tenant: str) -> DecodedBatch:
        self.pipeline.check_room()
        # grpc has already undone any transport compression
        decoded = await self.pipeline.ingest_pool.decode(
            request, json_body=False, encoding="", tenant=tenant, limit=len(request)
        )
        self.pipeline.ingest_pool.account(decoded)
        logged = LoggedRequest("otlp_traces", tenant, request, PROTOBUF, "", "otlp_grpc")
        await self.pipeline.accept_decoded(decoded, receiver="otlp_grpc", logged=logged)
        self.pipeline.phoenix_forward.offer(request, PROTOBUF)
        return decoded

    async def export_logs(
        self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> logs_service_pb2.ExportLogsServiceResponse:
        tenant = await self._admit(request, context)
        decoded = await self._run(context, self._logs(request, tenant))
        answer = logs_service_pb2.ExportLogsServiceResponse()
        if decoded.rejected_spans or decoded.error_message:
            answer.partial_success.rejected_log_records = decoded.rejected_spans
            answer.partial_success.error_message = decoded.error_message
        return answer

    async def _logs(self, request: bytes, tenant: str) -> DecodedLogs:
        self.pipeline.check_room()
        decoded = await self.pipeline.ingest_pool.decode_logs(
            request, json_body=False, encoding="", tenant=tenant, limit=len(request)
        )
        self.pipeline.ingest_pool.account(decoded)
        self.pipeline.metrics.ignored_log_records.labels(receiver="otlp_grpc").inc(decoded.ignored)
        logged = LoggedRequest("otlp_logs", tenant, request, PROTOBUF, "", "otlp_grpc")
        await self.pipeline.accept_log_events(decoded.log_events, receiver="otlp_grpc", logged=logged)
        return decoded

    async def export_metrics(
        self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> metrics_service_pb2.ExportMetricsServiceResponse:
        await self._admit(request, context)
        await self._run(
            context,
            asyncio.to_thread(check_metrics_body, request, json_body=False, encoding="", limit=len(request)),
        )
        self.pipeline.metrics.ignored_metrics_requests.labels(receiver="otlp_grpc").inc()
        return metrics_service_pb2.ExportMetricsServiceResponse()


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
        # grpc sets SO_REUSEPORT by default: a second server on the same port would bind silently
        # and take half the connections; ragmon owns its port or refuses to start
        server = grpc.aio.server(
            # twice the limit: a message up to that reaches the handler, which refuses it counted
            # (grpc's own refusal of a larger one happens before ragmon sees it, uncounted)
            options=[("grpc.max_receive_message_length", 2 * self.max_bytes), ("grpc.so_reuseport", 0)]
        )
        services = _OtlpServices(self.pipeline, self.resolver, self.max_bytes)
        exports: list[tuple[str, Callable[..., Awaitable[Message]], type[Message]]] = [
            (_TRACE_SERVICE, services.export_traces, trace_service_pb2.ExportTraceServiceResponse),
            (_LOGS_SERVICE, services.export_logs, logs_service_pb2.ExportLogsServiceResponse),
            (_METRICS_SERVICE, services.export_metrics, metrics_service_pb2.ExportMetricsServiceResponse),
        ]
        server.add_generic_rpc_handlers(
            tuple(
                grpc.method_handlers_generic_handler(
                    name,
                    {
                        "Export": grpc.unary_unary_rpc_method_handler(
                            handler,
                            request_deserializer=None,  # raw bytes: decoded in the IngestPool
                            response_serializer=answer.SerializeToString,
                        )
                    },
                )
                for name, handler, answer in exports
            )
        )
        host = f"[{self.host}]" if ":" in self.host else self.host
        try:
            self.bound_port = server.add_insecure_port(f"{host}:{self.port}")
        except RuntimeError as exc:  # grpc's way of saying the address is taken (or not ours)
            raise OSError(errno.EADDRINUSE, f"OTLP/gRPC port {self.host}:{self.port} is in use") from exc
        await server.start()
        self._server = server
        log.info("OTLP/gRPC receiver listening on %s:%d", self.host, self.bound_port)

    async def stop(self, grace_s: float = 5.0) -> None:
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
