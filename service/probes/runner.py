"""`ProbeRunner`: sends every golden question to the app's endpoint as tagged probe traffic.

Each question is one request in the documented shape (`service/probes/tagging.py`):

    POST <endpoint>   x-ragmon-probe-run: <run id>   x-ragmon-probe-question: <question id>
    {"question": "<text>", "probe": {"run_id": "<run id>", "question_id": "<question id>"}}

plus any headers the user gave (an API key of the app, say). The app
answers as it answers users; its instrumentation tags the trace, and ragmon
scores the run from the stored traces.

Guarantees: at most `concurrency` requests in flight; each bounded by
`timeout_s`; a failed request (connection error, timeout, non-2xx) is
reported per question with its reason and never retried inside a run (a
retry would send a second trace for the same question). `send` never raises
for one question's failure.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

from service.probes.golden import GoldenQuestion, GoldenSet
from service.probes.tagging import PROBE_QUESTION_HEADER, PROBE_RUN_HEADER

__all__ = ["ProbeRunner", "ProbeSend", "new_run_id", "probe_request"]


def new_run_id(now: datetime | None = None) -> str:
    """A run id that sorts by time and does not collide: `probe-<UTC time>-<random>`."""
    now = now or datetime.now(UTC)
    return f"probe-{now:%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


def probe_request(run_id: str, question: GoldenQuestion) -> tuple[dict[str, str], dict[str, object]]:
    """(headers, JSON body) of the probe request for one question."""
    headers = {PROBE_RUN_HEADER: run_id, PROBE_QUESTION_HEADER: question.question_id}
    body: dict[str, object] = {
        "question": question.question,
        "probe": {"run_id": run_id, "question_id": question.question_id},
    }
    return headers, body


@dataclass(frozen=True)
class ProbeSend:
    """How sending one question went: HTTP status, or the error that stopped it."""

    question_id: str
    status: int | None
    error: str | None
    latency_s: float

    @property
    def ok(self) -> bool:
        return self.error is None and self.status is not None and 200 <= self.status < 300


class ProbeRunner:
    """Sends a golden set's questions to one endpoint (see the module docstring)."""

    def __init__(
        self,
        golden: GoldenSet,
        endpoint: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
        concurrency: int = 4,
    ) -> None:
        if not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"endpoint must be an http(s) URL, got {endpoint!r}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.golden = golden
        self.endpoint = endpoint
        self.headers = dict(headers or {})
        self.timeout_s = timeout_s
        self.concurrency = concurrency

    async def send(self, run_id: str) -> list[ProbeSend]:
        """Send every question once under `run_id`; results in golden-set order."""
        gate = asyncio.Semaphore(self.concurrency)
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=self.headers) as client:

            async def one(question: GoldenQuestion) -> ProbeSend:
                headers, body = probe_request(run_id, question)
                async with gate:
                    started = time.perf_counter()
                    try:
                        response = await client.post(self.endpoint, json=body, headers=headers)
                    except httpx.TimeoutException:
                        return ProbeSend(question.question_id, None, "timeout", time.perf_counter() - started)
                    except httpx.HTTPError as exc:
                        error = f"{type(exc).__name__}: {exc}"
                        return ProbeSend(question.question_id, None, error, time.perf_counter() - started)
                    latency = time.perf_counter() - started
                failure = None if response.is_success else f"HTTP {response.status_code}"
                return ProbeSend(question.question_id, response.status_code, failure, latency)

            return list(await asyncio.gather(*(one(q) for q in self.golden)))
