"""The HTTP side of talking to Arize Phoenix: one bounded client, why a call failed, and how long to wait.

Shared by the span tee (`service/phoenix/forward.py`) and the annotation
writer (`service/phoenix/annotations.py`). Every call has the configured
timeouts; failures map to the closed set `PHOENIX_FAILURE_REASONS` of
`service/metric_areas.py`. 408, 429 and 5xx, timeouts and connection errors are
worth a retry; any other 4xx is not (the same request fails the same way).
"""

from __future__ import annotations

import random

import httpx

from service.config import PhoenixConfig
from service.judge.retry_after import retry_after_seconds

__all__ = ["RETRYABLE", "backoff_s", "http_client", "reason_of_error", "reason_of_status", "retry_after_s"]

RETRYABLE = frozenset({"timeout", "connection_error", "rate_limited", "server_error", "not_found"})
"""Failure reasons after which the same call may succeed later (`not_found`: a span not inserted yet)."""


def http_client(config: PhoenixConfig, max_connections: int) -> httpx.AsyncClient:
    """An `httpx.AsyncClient` for `config.endpoint` with the configured timeouts, pool size and API key.

    Raises ValueError when no endpoint is configured. The caller closes it.
    """
    if config.endpoint is None:
        raise ValueError("phoenix.endpoint is not set")
    headers = {}
    if config.api_key is not None:
        headers["authorization"] = f"Bearer {config.api_key.get_secret_value()}"
    return httpx.AsyncClient(
        base_url=config.endpoint.rstrip("/"),
        headers=headers,
        timeout=httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
    )


def reason_of_status(status: int) -> str:
    """The failure reason of an HTTP status that is not a success."""
    if status == 408:
        return "timeout"
    if status == 429:
        return "rate_limited"
    if status >= 500:
        return "server_error"
    if status == 404:
        return "not_found"
    return "rejected"


def reason_of_error(exc: httpx.HTTPError) -> str:
    """The failure reason of a transport error (no HTTP answer at all)."""
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.HTTPStatusError):
        return reason_of_status(exc.response.status_code)
    if isinstance(exc, httpx.TransportError):
        return "connection_error"
    return "rejected"


def retry_after_s(headers: httpx.Headers) -> float | None:
    """The delay the server asked for in `Retry-After` (seconds or an HTTP date), if any."""
    return retry_after_seconds(headers.get("retry-after"))


def backoff_s(config: PhoenixConfig, failures: int, asked_s: float | None, rng: random.Random) -> float:
    """Full-jitter exponential delay after `failures` failed calls, never shorter than the server asked."""
    if failures < 1:
        raise ValueError("failures must be >= 1")
    cap = min(config.backoff_max_s, config.backoff_base_s * 2 ** (failures - 1))
    delay = rng.uniform(0, cap)
    if asked_s is not None:
        delay = max(delay, min(asked_s, config.backoff_max_s))
    return delay
