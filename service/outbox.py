"""`OutboxSweep`: runs again the fan-out of stored records whose fan-out never finished.

`StoreSink` writes a `fanout_outbox` row in the same transaction as each new
trace or feedback event and deletes it once the records were handed to the
sinks after the store (review intake, judge queue, metrics, drift windows). A
crash between the two, or a sink that failed (the database restarted under
the judge queue), leaves the row. This sweep takes rows older than
`min_age_s` (so as not to race the fan-out in flight), reads their records back
from the store and hands them to the same fan-out; the rows go when it returns.

Every sink after the store is idempotent where it writes (the judge queue and
the review queue insert by key), and the pipeline orders them so that those
come first and the in-memory counters last: a fan-out that failed half-way
counts nothing twice when it is run again. A taken row is stamped, so two
replicas sweeping one database do not take the same rows within `min_age_s`.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

from service.consumer import RecordConsumer
from service.judge.judging import rag_trace_from_record
from service.lifecycle import cancel_task
from service.model import RagTrace
from service.store.trace_store import Store

__all__ = ["OutboxSweep"]

log = logging.getLogger(__name__)


class OutboxSweep:
    """Every `every_s`, the fan-out of records whose outbox rows are older than `min_age_s`."""

    def __init__(
        self, store: Store, fanout: RecordConsumer, *, every_s: float = 30.0, min_age_s: float = 30.0
    ) -> None:
        self.store = store
        self.fanout = fanout
        self.every_s = every_s
        self.min_age_s = min_age_s
        self.swept = 0  # records fanned out again, for tests and logs
        self._task: asyncio.Task[None] | None = None

    async def sweep(self, min_age_s: float | None = None) -> int:
        """One pass; returns the records fanned out again. Raises what the store or a sink raises
        (the rows then stay, to be taken again)."""
        age = self.min_age_s if min_age_s is None else min_age_s
        total = 0
        while True:
            taken = await asyncio.to_thread(
                self.store.take_outbox, datetime.now(UTC) - timedelta(seconds=age)
            )
            if not taken:
                return total
            trace_keys = [(t, r) for t, kind, r in taken if kind == "trace"]
            event_keys = [(t, r) for t, kind, r in taken if kind == "feedback"]
            traces = await asyncio.to_thread(self._traces, trace_keys)
            if traces:
                await self.fanout.consume_traces(traces)
            events = await asyncio.to_thread(self.store.feedback_events, event_keys)
            if events:
                await self.fanout.consume_feedback(events)
            # a trace deleted since (retention) has nothing left to fan out: its row goes too
            await asyncio.to_thread(self.store.clear_outbox, "trace", trace_keys)
            await asyncio.to_thread(self.store.clear_outbox, "feedback", event_keys)
            total += len(traces) + len(events)
            self.swept += len(traces) + len(events)

    def _traces(self, keys: list[tuple[str, str]]) -> list[RagTrace]:
        found = []
        for tenant, trace_id in keys:
            record = self.store.get_trace(tenant, trace_id)
            if record is not None:
                found.append(rag_trace_from_record(record))
        return found

    async def _run(self) -> None:
        while True:
            try:
                swept = await self.sweep()
                if swept:
                    log.warning("ran the unfinished fan-out of %d stored records again", swept)
            except Exception:
                log.exception("fan-out outbox sweep failed; retrying in %.0fs", self.every_s)
            await asyncio.sleep(self.every_s)

    async def start(self) -> None:
        """Sweep now (what a crash left) and then every `every_s`. Safe twice."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="outbox-sweep")

    async def stop(self) -> None:
        await cancel_task(self._task)
        self._task = None
