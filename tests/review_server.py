"""A real ragmon with reviewers, two tenants and judged traces in its review queues (review tests)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.live_server import LiveServer, live_server

TOKENS = {
    "alice": "alice-token-0123456789",
    "bob": "bob-token-0123456789ab",
    "carol": "carol-token-0123456789",
}
API_KEYS = {"acme": "acme-key-0123456789", "beta": "beta-key-0123456789"}
HOSTILE_ANSWER = "Refunds take 30 days. <script>alert('answer')</script> <img src=x onerror=alert('img')>"
HOSTILE_CHUNK = "Refunds take 30 days. <img src=x onerror=alert('chunk')><script>alert('chunk')</script>"


def settings(**review: Any) -> dict[str, Any]:
    """Server settings: heuristic judge on every trace, alice and bob on acme, carol on beta."""
    return {
        "assembler": {"grace_s": 0.05},
        "sampler": {"rates": {"base": 1.0}},
        "judging": {"poll_s": 0.05, "estimate_every_s": 60},
        "budget": {"calls_per_minute": 100000, "usd_per_day": 1000},
        "auth": {"api_keys": {key: tenant for tenant, key in API_KEYS.items()}},
        "review": {
            "reviewers": {
                "alice": {"token": TOKENS["alice"], "tenants": ["acme"]},
                "bob": {"token": TOKENS["bob"], "tenants": ["acme"]},
                "carol": {"token": TOKENS["carol"], "tenants": ["beta"]},
            },
            "blind_rate": 1.0,
            **review,
        },
    }


def trace(n: int, answer: str, chunk: str, app: str = "shop") -> dict[str, Any]:
    return {
        "trace_id": f"{0xC0FFEE000 + n:032x}",
        "app": app,
        "query": f"How long do refunds take (question {n})?",
        "answer": answer,
        "retrieval": {"chunks": [{"id": f"policy-{n}", "score": 0.83, "content": chunk}]},
    }


def wait_until(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def send(server: LiveServer, tenant: str, records: list[dict[str, Any]]) -> None:
    """Ingest traces for a tenant and wait until each is judged and in the blind queue."""
    with server.client(headers={"x-api-key": API_KEYS[tenant]}) as client:
        response = client.post("/api/v1/traces", json={"traces": records})
        assert response.status_code == 200, response.text
    server.flush()
    reviews = server.pipeline.reviews
    wait_until(lambda: all(reviews.find(tenant, "blind", r["trace_id"]) is not None for r in records))


@contextmanager
def review_server(tmp_path: Path, extra: dict[str, Any] | None = None, **review: Any) -> Iterator[LiveServer]:
    """A live server whose acme tenant has a faithful and an unfaithful (hostile) judged trace, beta one;
    `extra` adds settings sections (merged into the review server's)."""
    with live_server(tmp_path, **{**settings(**review), **(extra or {})}) as server:
        send(
            server,
            "acme",
            [
                trace(1, "Refunds take 30 days.", "Refunds take 30 days after delivery."),
                trace(2, HOSTILE_ANSWER + " Shipping is always free on Mondays.", HOSTILE_CHUNK),
            ],
        )
        send(server, "beta", [trace(3, "Refunds take 30 days.", "Refunds take 30 days.", app="bank")])
        yield server


def signed_in(server: LiveServer, reviewer: str) -> tuple[httpx.Client, str]:
    """A client holding `reviewer`'s session cookie, and the session's CSRF token."""
    client = server.client()
    client.get("/review/login")
    login = client.cookies.get("ragmon_review_login") or ""
    response = client.post(
        "/api/v1/review/session", json={"token": TOKENS[reviewer]}, headers={"x-csrf-token": login}
    )
    assert response.status_code == 200, response.text
    csrf = client.get("/api/v1/review/session").json()["csrf"]
    return client, csrf
