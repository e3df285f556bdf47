"""API keys: which tenant a request belongs to, as pure ASGI middleware (and a function gRPC reuses).

With keys configured, every ingest and API request must carry one
(`Authorization: Bearer <key>` or `x-api-key: <key>`): none is 401, a key we
do not know is 403. With no keys configured (the embedded default), only
loopback clients are accepted, as tenant `default`, and the service says so
at start. Keys are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable, Iterable
from typing import Annotated

from fastapi import Depends, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from service.config import AuthConfig
from service.errors import Unauthenticated, UnknownTenant
from service.ingest.responses import error_response

DEFAULT_TENANT = "default"
# The review page and its API sign reviewers in themselves (service/review/page.py).
OPEN_PATHS = (
    "/healthz",
    "/readyz",
    "/metrics",
    "/docs",
    "/openapi.json",
    "/redoc",
    "/static/",
    "/review",
    "/api/v1/review",
)


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host == "localhost"


def key_from_headers(headers: Iterable[tuple[str, str]]) -> str | None:
    for name, value in headers:
        name = name.lower()
        if name == "authorization" and value.lower().startswith("bearer "):
            return value[7:].strip() or None
        if name in ("x-api-key", "api_key", "api-key"):
            return value.strip() or None
    return None


class TenantResolver:
    """Maps an API key (or a loopback peer when no keys exist) to a tenant, or raises."""

    def __init__(self, config: AuthConfig) -> None:
        self.config = config
        self._keys = [(k.encode(), t) for k, t in config.api_keys.items()]

    @property
    def open_to_loopback(self) -> bool:
        return not self._keys and self.config.allow_loopback_without_key

    def resolve(self, key: str | None, client_host: str | None) -> str:
        if not self._keys:
            if self.config.allow_loopback_without_key and is_loopback(client_host):
                return DEFAULT_TENANT
            raise UnknownTenant(
                "no API keys are configured, so only loopback clients are accepted; configure auth.api_keys",
                reason="forbidden",
            )
        if key is None:
            raise Unauthenticated("missing API key: send 'Authorization: Bearer <key>' or 'x-api-key'")
        candidate = key.encode()
        tenant = None
        for known, known_tenant in self._keys:
            # compare against every key so the time taken does not reveal which prefix matched
            if hmac.compare_digest(known, candidate):
                tenant = known_tenant
        if tenant is None:
            raise UnknownTenant("unknown API key", reason="bad_api_key")
        return tenant


class TenantMiddleware:
    """Puts the caller's tenant in `scope["state"]["tenant"]`, or answers 401/403 itself (counted)."""

    def __init__(self, app: ASGIApp, resolver: TenantResolver, on_reject: Callable[[str], None]) -> None:
        self.app = app
        self.resolver = resolver
        self.on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(OPEN_PATHS) or scope["path"] == "/":
            await self.app(scope, receive, send)
            return
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        client = scope.get("client")
        try:
            tenant = self.resolver.resolve(key_from_headers(headers), client[0] if client else None)
        except (Unauthenticated, UnknownTenant) as exc:
            self.on_reject(exc.reason)
            content_type = dict(headers).get("content-type")
            await error_response(exc, scope["path"], content_type)(scope, receive, send)
            return
        scope.setdefault("state", {})["tenant"] = tenant
        await self.app(scope, receive, send)


async def _tenant(request: Request) -> str:
    """The caller's tenant, set by `TenantMiddleware` (which already refused unknown callers).

    `async` though it awaits nothing: FastAPI runs a plain `def` dependency in its thread pool, a
    hop to a thread and back on every request (bench/RESULTS.md, "Session 36")."""
    tenant = request.scope.get("state", {}).get("tenant")
    if not isinstance(tenant, str):
        raise Unauthenticated("no tenant resolved for this request")
    return tenant


TenantDep = Annotated[str, Depends(_tenant)]
