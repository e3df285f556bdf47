"""Failure reasons and backoff of calls to Phoenix (`service/phoenix/client.py`)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest

from service.config import PhoenixConfig
from service.metric_areas import PHOENIX_FAILURE_REASONS
from service.phoenix.client import (
    RETRYABLE,
    backoff_s,
    http_client,
    reason_of_error,
    reason_of_status,
    retry_after_s,
)


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (408, "timeout"),
        (429, "rate_limited"),
        (500, "server_error"),
        (503, "server_error"),
        (404, "not_found"),
        (400, "rejected"),
        (415, "rejected"),
        (422, "rejected"),
    ],
)
def test_status_reasons_are_closed_and_only_transient_ones_retry(status: int, reason: str) -> None:
    assert reason_of_status(status) == reason
    assert reason in PHOENIX_FAILURE_REASONS
    assert (reason in RETRYABLE) == (status in (404, 408, 429) or status >= 500)


def test_transport_errors() -> None:
    request = httpx.Request("POST", "http://phoenix/v1/traces")
    assert reason_of_error(httpx.ReadTimeout("slow", request=request)) == "timeout"
    assert reason_of_error(httpx.ConnectError("refused", request=request)) == "connection_error"
    response = httpx.Response(503, request=request)
    assert (
        reason_of_error(httpx.HTTPStatusError("down", request=request, response=response)) == "server_error"
    )


def test_retry_after_in_seconds_or_as_a_date() -> None:
    assert retry_after_s(httpx.Headers({"retry-after": "7"})) == 7.0
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 25 < (retry_after_s(httpx.Headers({"retry-after": later})) or 0) <= 30
    assert retry_after_s(httpx.Headers({"retry-after": "soon"})) is None
    assert retry_after_s(httpx.Headers()) is None


def test_backoff_is_jittered_under_a_doubling_cap_and_honours_the_server() -> None:
    config = PhoenixConfig(backoff_base_s=0.5, backoff_max_s=4.0)
    rng = random.Random(7)
    for failures, cap in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (9, 4.0)]:
        delays = [backoff_s(config, failures, None, rng) for _ in range(200)]
        assert all(0 <= d <= cap for d in delays)
        assert max(delays) > cap / 2  # full jitter spreads over the whole range
    assert backoff_s(config, 1, 3.0, rng) >= 3.0
    assert backoff_s(config, 1, 60.0, rng) == 4.0  # a server's delay is capped by backoff_max_s
    with pytest.raises(ValueError):
        backoff_s(config, 0, None, rng)


async def test_client_sends_the_key_and_needs_an_endpoint() -> None:
    with pytest.raises(ValueError):
        http_client(PhoenixConfig(), 1)
    client = http_client(PhoenixConfig(endpoint="http://phoenix:6006/", api_key="s3cret"), 2)
    try:
        assert str(client.base_url) == "http://phoenix:6006"
        assert client.headers["authorization"] == "Bearer s3cret"
    finally:
        await client.aclose()
