"""`/metrics` of every ragmon process (`ragmon serve` and `ragmon worker`): one answer for both.

* **The scrape token.** With `metrics.scrape_token` set, a scrape without
  `Authorization: Bearer <token>` gets 401 (counted as an `unauthenticated`
  rejection), on ingest and on every worker alike: the workers' series are the
  same tenants' data.
* **Off the event loop.** The scrape-time gauges ask the database (judge queue,
  review queue) and rendering thousands of series is not free; on the loop,
  either would hold up a worker's consume loop or ingest's requests for the
  length of a round trip, or of a connect timeout while the database is down.
* **`name[]`.** `/metrics?name[]=ragmon_traces_total&name[]=...` answers only
  those samples, as prometheus-client's own exposition does (`restricted_registry`),
  and reads only the scrape-time gauges named: a poller that watches one
  counter several times a second (bench/scale, a readiness script) does not
  pay for a full scrape each time.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Iterable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric
from pydantic import SecretStr
from starlette.requests import Request
from starlette.responses import Response

from service.metrics import Metrics

__all__ = ["scrape_response"]


class _Named:
    """What a `name[]` scrape renders: the declared series' samples of those names and the
    scrape-time gauges of those names (only they are read)."""

    def __init__(self, metrics: Metrics, names: frozenset[str]) -> None:
        self._metrics = metrics
        self._names = names

    def collect(self) -> Iterable[Metric]:
        # the restricted registry knows the declared series by name; the scrape-time gauges are
        # added after their collector registered, so it never finds them: they are asked here
        yield from self._metrics.registry.restricted_registry(self._names).collect()
        yield from self._metrics.state.collect(self._names)


def _render(metrics: Metrics, names: frozenset[str]) -> bytes:
    return generate_latest(_Named(metrics, names) if names else metrics.registry)


async def scrape_response(request: Request, metrics: Metrics, token: SecretStr | None) -> Response:
    """The answer to a scrape of `metrics` (see the module doc)."""
    if token is not None:
        given = request.headers.get("authorization", "")
        expected = f"Bearer {token.get_secret_value()}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            metrics.reject("unauthenticated")
            return Response(
                "metrics need Authorization: Bearer <metrics.scrape_token>\n",
                401,
                {"WWW-Authenticate": "Bearer"},
                media_type="text/plain",
            )
    names = frozenset(request.query_params.getlist("name[]"))
    body = await asyncio.to_thread(_render, metrics, names)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
