"""`PhoenixForwarder`: a tee that sends the OTLP requests ragmon accepted on to Arize Phoenix.

    receiver ──accepted──▶ offer(body) ──▶ bounded buffer ──▶ senders ──POST /v1/traces──▶ Phoenix

Guarantees:

* `offer` never waits and never raises: a slow or down Phoenix cannot slow or
  break ragmon's ingest. It is called after ragmon accepted the request, so a
  request ragmon refused (and the client will retry) is not sent twice.
* The buffer is bounded by requests and by bytes (`phoenix.forward_buffer_*`,
  in-flight requests included). A request that does not fit is dropped and
  counted in `ragmon_phoenix_forward_dropped_total{reason="buffer_full"}`,
  and a warning is logged at most once a minute; ragmon itself keeps the spans.
* Protobuf bodies go out byte for byte with their `Content-Encoding`. Phoenix
  accepts only protobuf, so an OTLP/JSON body is re-encoded as protobuf (same
  spans, same ids) off the ingest path; the gRPC receiver offers the request
  message serialized.
* Each request is retried with jittered exponential backoff (honouring
  `Retry-After`) while Phoenix times out, is unreachable or answers
  408/429/5xx, for up to `phoenix.forward_retry_s` (a time budget, not an
  attempt count: a Phoenix restart of a minute must not cost the requests
  sent in its first second); then it is dropped (`retries_exhausted`). What
  waits meanwhile is bounded by the buffer, whose overflow is the other drop.
  Any other 4xx drops it at once (`rejected`). Every failed try is counted in
  `ragmon_phoenix_forward_failures_total{reason}`.
* `stop()` gives the buffer `phoenix.drain_s` to drain, then counts what is
  left as dropped (`shutdown`). Safe before `start()` and twice.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import json
import logging
import random
import time
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Any

import httpx
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from service.config import PhoenixConfig
from service.lifecycle import cancel_task
from service.metrics import Metrics
from service.phoenix.client import (
    RETRYABLE,
    backoff_s,
    http_client,
    reason_of_error,
    reason_of_status,
    retry_after_s,
)

__all__ = ["PhoenixForwarder", "otlp_json_to_protobuf"]

log = logging.getLogger(__name__)

PROTOBUF = "application/x-protobuf"
_WARN_EVERY_S = 60.0
_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def otlp_json_to_protobuf(body: bytes, content_encoding: str = "") -> bytes:
    """An OTLP/JSON `ExportTraceServiceRequest` body (optionally gzip/deflate) → the same request as protobuf.

    OTLP/JSON writes trace and span ids as hex where the protobuf JSON mapping
    expects base64, so ids are converted before parsing. Raises ValueError when
    the body is not such a request.
    """
    encoding = content_encoding.strip().lower()
    try:
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        document = json.loads(body)
    except (OSError, zlib.error, ValueError) as exc:
        raise ValueError(f"not an OTLP/JSON body: {exc}") from exc

    def fix_ids(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in _ID_FIELDS and isinstance(value, str) and value:
                    # already base64, or invalid: then the parser decides
                    with contextlib.suppress(ValueError):
                        node[key] = base64.b64encode(bytes.fromhex(value)).decode()
                else:
                    fix_ids(value)
        elif isinstance(node, list):
            for item in node:
                fix_ids(item)

    fix_ids(document)
    request = trace_service_pb2.ExportTraceServiceRequest()
    try:
        json_format.ParseDict(document, request, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise ValueError(f"not an OTLP/JSON trace request: {exc}") from exc
    encoded: bytes = request.SerializeToString()
    return encoded


@dataclass(slots=True)
class _Request:
    body: bytes
    content_type: str
    content_encoding: str


class PhoenixForwarder:
    """The tee to Phoenix (see the module docstring). Disabled (offers are ignored) without an endpoint."""

    def __init__(self, config: PhoenixConfig, metrics: Metrics, *, rng: random.Random | None = None) -> None:
        self.config = config
        self.metrics = metrics
        self.enabled = config.forwarding
        self._rng = rng or random.Random()
        self._buffer: deque[_Request] = deque()
        self._pending_requests = 0  # buffered + in flight
        self._pending_bytes = 0
        self._ready = asyncio.Event()
        self._senders: list[asyncio.Task[None]] = []
        self._client: httpx.AsyncClient | None = None
        self._dropped_since_warning = 0
        self._last_warning = 0.0
        state = metrics.state
        state.add(
            "ragmon_phoenix_forward_buffer_requests",
            "OTLP requests waiting for Phoenix or in flight",
            lambda: self._pending_requests,
        )
        state.add(
            "ragmon_phoenix_forward_buffer_bytes",
            "bytes waiting for Phoenix or in flight",
            lambda: self._pending_bytes,
        )
        state.add(
            "ragmon_phoenix_forward_buffer_fill_ratio",
            "tee buffer use (0-1) of its request or byte bound",
            lambda: self.fill_ratio,
        )

    @property
    def pending(self) -> int:
        """Requests buffered or in flight."""
        return self._pending_requests

    @property
    def fill_ratio(self) -> float:
        return max(
            self._pending_requests / self.config.forward_buffer_requests,
            self._pending_bytes / self.config.forward_buffer_bytes,
        )

    def offer(self, body: bytes, content_type: str, content_encoding: str = "") -> bool:
        """Queue one accepted OTLP request for Phoenix; False when disabled or dropped. Never waits."""
        if not self.enabled:
            return False
        size = len(body)
        if (
            self._pending_requests + 1 > self.config.forward_buffer_requests
            or self._pending_bytes + size > self.config.forward_buffer_bytes
        ):
            self._drop("buffer_full")
            return False
        self._launch()
        self._buffer.append(_Request(body, content_type, content_encoding.strip().lower()))
        self._pending_requests += 1
        self._pending_bytes += size
        self._ready.set()
        return True

    def _drop(self, reason: str, count: int = 1) -> None:
        self.metrics.phoenix_forward_dropped.labels(reason=reason).inc(count)
        self._dropped_since_warning += count
        now = time.monotonic()
        if now - self._last_warning >= _WARN_EVERY_S:
            log.warning(
                "phoenix tee: %d OTLP request(s) not delivered to Phoenix (latest reason: %s); "
                "ragmon kept every span, see ragmon_phoenix_forward_dropped_total",
                self._dropped_since_warning,
                reason,
            )
            self._dropped_since_warning = 0
            self._last_warning = now

    def _done(self, request: _Request) -> None:
        self._pending_requests -= 1
        self._pending_bytes -= len(request.body)

    async def _send(self, request: _Request) -> None:
        """Deliver one request with retries; counts the outcome. Cancellation counts it as `shutdown`."""
        if self._client is None:
            raise RuntimeError("forwarder not started")
        body, headers = request.body, {"content-type": PROTOBUF}
        if request.content_type != PROTOBUF:
            try:
                body = await asyncio.to_thread(otlp_json_to_protobuf, body, request.content_encoding)
            except ValueError:
                self._drop("rejected")
                return
        elif request.content_encoding not in ("", "identity"):
            headers["content-encoding"] = request.content_encoding
        failures = 0
        give_up_at = time.monotonic() + self.config.forward_retry_s
        while True:
            asked: float | None = None
            try:
                response = await self._client.post("/v1/traces", content=body, headers=headers)
            except httpx.HTTPError as exc:
                reason = reason_of_error(exc)
            else:
                if response.is_success:
                    self.metrics.phoenix_forwarded.inc()
                    self.metrics.phoenix_forwarded_bytes.inc(len(request.body))
                    self.metrics.phoenix_forward_last_success.set(time.time())
                    return
                reason = reason_of_status(response.status_code)
                asked = retry_after_s(response.headers)
            self.metrics.phoenix_forward_failures.labels(reason=reason).inc()
            if reason not in RETRYABLE or reason == "not_found":
                self._drop("rejected")
                return
            failures += 1
            delay = backoff_s(self.config, failures, asked, self._rng)
            if time.monotonic() + delay > give_up_at:
                self._drop("retries_exhausted")
                return
            await asyncio.sleep(delay)

    async def _sender(self) -> None:
        while True:
            if not self._buffer:
                self._ready.clear()
                await self._ready.wait()
                continue
            request = self._buffer.popleft()
            try:
                await self._send(request)
            except asyncio.CancelledError:
                self._drop("shutdown")
                raise
            except Exception:
                log.exception("phoenix tee: unexpected error; request dropped")
                self._drop("rejected")
            finally:
                self._done(request)

    def _launch(self) -> None:
        if not self._senders:
            self._client = http_client(self.config, self.config.forward_concurrency)
            loop = asyncio.get_running_loop()
            self._senders = [
                loop.create_task(self._sender(), name=f"phoenix-tee-{n}")
                for n in range(self.config.forward_concurrency)
            ]

    async def start(self) -> None:
        """Start the senders (a no-op when disabled or started; `offer` starts them too)."""
        if self.enabled:
            self._launch()

    async def drain(self, timeout_s: float) -> bool:
        """Wait until every offered request was delivered or dropped; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self._pending_requests:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    async def stop(self) -> None:
        """Drain for up to `phoenix.drain_s`, then count what is left as dropped (`shutdown`). Safe twice."""
        if self._senders:
            await self.drain(self.config.drain_s)
            for task in self._senders:
                await cancel_task(task)
            self._senders = []
        if self._buffer:
            left = len(self._buffer)
            while self._buffer:
                self._done(self._buffer.popleft())
            self._drop("shutdown", left)
        if self._client is not None:
            with contextlib.suppress(httpx.HTTPError):
                await self._client.aclose()
            self._client = None
