"""`BodyLimitMiddleware`: refuses request bodies over the configured size or too slow, as pure ASGI
middleware.

A declared `Content-Length` over the limit is refused before any byte is
read; a body without one (chunked) is read up to the limit and refused the
moment it crosses it. A body not wholly received `timeout_s` after the
request's headers is refused with 408 (a slow upload holding a connection
and its buffer open forever: slowloris). The app only ever sees bodies within the limit (the
middleware hands it the bytes it buffered). Refusals are 413 in the caller's
encoding and counted. Decompressed sizes are capped where bodies are
decompressed (`http_receivers.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import PayloadTooLarge, PermanentError, RequestTimeout
from service.ingest.responses import error_response


class BodyLimitMiddleware:
    def __init__(
        self, app: ASGIApp, max_bytes: int, on_reject: Callable[[str], None], timeout_s: float = 30.0
    ) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.app = app
        self.max_bytes = max_bytes
        self.on_reject = on_reject
        self.timeout_s = timeout_s

    async def _refuse(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        message: str,
        error: type[PermanentError] = PayloadTooLarge,
    ) -> None:
        exc = error(message)
        self.on_reject(exc.reason)
        content_type = dict(scope["headers"]).get(b"content-type", b"").decode("latin-1")
        await error_response(exc, scope["path"], content_type)(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await self._refuse(
                    scope,
                    receive,
                    send,
                    f"request body of {int(value)} bytes is over the limit of {self.max_bytes}",
                )
                return
        chunks: list[bytes] = []
        size = 0
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                await self._refuse(
                    scope,
                    receive,
                    send,
                    f"request body not received within {self.timeout_s:g} s ({size} bytes came)",
                    RequestTimeout,
                )
                return
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(
                    scope, receive, send, f"request body is over the limit of {self.max_bytes} bytes"
                )
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
