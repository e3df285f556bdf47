"""The uvicorn server ragmon's HTTP port runs on, with a deadline for request headers.

uvicorn times out idle keep-alive connections and (through `BodyLimitMiddleware`) ragmon times out
slow bodies, but nothing bounds how long a client may take to send its request *headers*: a client
that opens a connection and trickles a header byte every few seconds (slowloris) holds the
connection forever, and a few hundred of them hold the server. `header_deadline_protocol` wraps
uvicorn's HTTP protocol class: from the moment a connection opens, and again after each response,
the next request's headers must be complete within `server.header_timeout_s`, else the connection
is closed and counted (`ragmon_ingest_rejected_total{reason="header_timeout"}`). A request whose
headers arrived is never cut by it (its body has its own deadline).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import uvicorn
from fastapi import FastAPI

from service.config import RagmonConfig

__all__ = ["header_deadline_protocol", "uvicorn_config"]


def _default_protocol() -> type[asyncio.Protocol]:
    """The class uvicorn's `http="auto"` picks: httptools when installed, else h11."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is an optional speed-up of uvicorn
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol
    return HttpToolsProtocol


def header_deadline_protocol(
    timeout_s: float, on_timeout: Callable[[], None], base: type[asyncio.Protocol] | None = None
) -> type[asyncio.Protocol]:
    """`base` (uvicorn's own HTTP protocol by default) closing connections whose request headers are
    not complete `timeout_s` after the connection opened or the previous response ended."""
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    parent: Any = base or _default_protocol()

    class HeaderDeadlineProtocol(parent):  # type: ignore[misc]
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self._arm_header_deadline()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_deadline()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._request_in_progress():
                self._disarm_header_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_header_deadline()

        def _request_in_progress(self) -> bool:
            # uvicorn makes a cycle when a request's headers are complete; it is done with the response
            return self.cycle is not None and not self.cycle.response_complete

        def _arm_header_deadline(self) -> None:
            self._disarm_header_deadline()
            self._header_timer = self.loop.call_later(timeout_s, self._header_deadline_passed)

        def _disarm_header_deadline(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_deadline_passed(self) -> None:
            self._header_timer = None
            if self._request_in_progress() or self.transport.is_closing():
                return
            on_timeout()
            self.transport.close()

    return HeaderDeadlineProtocol


def uvicorn_config(app: FastAPI, config: RagmonConfig, **options: Any) -> uvicorn.Config:
    """The uvicorn configuration of ragmon's HTTP port for `app` (made by `create_app(config)`)."""
    metrics = app.state.metrics
    protocol = header_deadline_protocol(
        config.server.header_timeout_s, lambda: metrics.reject("header_timeout")
    )
    return uvicorn.Config(app, host=config.server.host, port=config.server.port, http=protocol, **options)
