"""`RequestFilter`: only user requests go on to be monitored; other traces are counted apart.

A trace that neither retrieves, reranks nor generates is not a user request
(`RagTrace.kind`, decided in `service/conventions/semconv.py`): LlamaIndex
embedding a corpus in-process, a batch embedding job, a health check. Were it
passed on, a nightly re-index would add thousands of "requests" with a
document's text as the query: to request counts, cost per query, the query
drift window and the judge's sample. So this processor, right after assembly,
passes requests on and counts the rest in `ragmon_non_request_traces_total`
and `ragmon_non_request_cost_usd_total` (by app and kind); with
`store.keep_non_requests` it stores them in their own table too.

Traces from the JSON API are requests by construction and do not pass here.
Idempotent by trace id only in what it stores (the table's primary key); a
redelivered non-request trace is counted again, as it is not a request sink.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence

from service.consumer import TraceConsumer
from service.errors import StoreUnavailable
from service.metrics import Metrics
from service.model import RagTrace
from service.store.trace_store import Store

__all__ = ["RequestFilter"]

log = logging.getLogger(__name__)


class RequestFilter:
    """Processor: traces in (`TraceConsumer`), requests out to `next`, the rest counted (and stored)."""

    def __init__(
        self,
        next: TraceConsumer,
        metrics: Metrics,
        store: Store | None,
        on_dropped: Callable[[Iterable[tuple[str, str]]], None] | None = None,
    ) -> None:
        self.next = next
        self.metrics = metrics
        self.store = store  # None: count non-requests, store nothing
        self.on_dropped = on_dropped  # told the (tenant, trace_id) of what does not go on

    async def consume_traces(self, batch: Sequence[RagTrace]) -> None:
        requests = [t for t in batch if t.kind == "request"]
        if requests:
            await self.next.consume_traces(requests)
        if len(requests) == len(batch):
            return
        others = [t for t in batch if t.kind != "request"]
        self.metrics.count_non_requests(others)
        if self.on_dropped is not None:
            self.on_dropped((t.tenant, t.trace_id) for t in others)
        if self.store is None:
            return
        try:
            await asyncio.to_thread(self.store.insert_non_requests, others)
        except StoreUnavailable as exc:
            # not monitored data: the requests went on above; this loss is counted, not retried
            self.metrics.sink_failures.labels(sink="non_requests", kind="retryable").inc()
            log.warning("could not store %d non-request traces: %s", len(others), exc)
