"""`OutboxSweep`: runs again the fan-out of stored records whose fan-out never finished.

`StoreSink` writes a `fanout_outbox` row in the same transaction as each new
trace or feedback event and deletes it once the records were handed to the
sinks after the store (review intake, judge queue, metrics, drift windows). A
crash between the two, or a sink that failed (the database restarted under
the judge queue), leaves the row. This sweep takes rows older than
`min_age_s` (so as not to race the fan-out in flight), reads their records back
from the store and hands them to the same fan-out; the rows go when it returns.
A trace a later version replaced (its late spans arrived) has a row of kind
`update` until the fan-out of that update (with what was counted for the
trace before: service/corrections.py) returned; the sweep runs it the same
way. Feedback about a trace not stored yet also waits here (`StoreSink` fans it out
with its trace when that comes); after `store.feedback_wait_s` it is counted as
an orphan (`ragmon_feedback_orphaned_total`) and waits no more: it stays stored,
but is never counted under `app="none"` nor turned into a review item.

Every sink after the store is idempotent where it writes (the judge queue and
the review queue insert by key), and the pipeline orders them so that those
come first and the in-memory counters last: a fan-out that failed half-way
counts nothing twice when it is run again. A taken row is stamped, so two
replicas sweeping one database do not take the same rows within `min_age_s`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta

from service.consumer import RecordConsumer
from service.lifecycle import cancel_task
from service.metrics import Metrics
from service.model import RagTrace
from service.store.tables import rag_trace_from_record
from service.store.trace_store import Store

__all__ = ["OutboxSweep"]

log = logging.getLogger(__name__)
_TAKE = 500  # rows a pass takes at a time (Store.take_outbox's limit)


class OutboxSweep:
    """Every `every_s`, the fan-out of records whose outbox rows are older than `min_age_s`."""

    def __init__(
        self,
        store: Store,
        fanout: RecordConsumer,
        metrics: Metrics,
        *,
        feedback_wait_s: float = 3600.0,
        every_s: float = 30.0,
        min_age_s: float = 30.0,
        updates: Callable[[Sequence[RagTrace]], Awaitable[bool]] | None = None,
    ) -> None:
        self.store = store
        self.fanout = fanout
        # the fan-out of updated traces (StoreSink.fan_out_updates: with what was counted before)
        self.updates = updates
        self.metrics = metrics
        self.feedback_wait_s = feedback_wait_s
        self.every_s = every_s
        self.min_age_s = min_age_s
        self.swept = 0  # records fanned out again, for tests and logs
        self._task: asyncio.Task[None] | None = None

    async def sweep(self, min_age_s: float | None = None, now: datetime | None = None) -> int:
        """One pass; returns the records fanned out again. Raises what the store or a sink raises
        (the rows then stay, to be taken again). Feedback whose trace is not stored keeps waiting,
        until `feedback_wait_s` after it was stored: then it counts as an orphan and its row goes."""
        age = self.min_age_s if min_age_s is None else min_age_s
        now = now or datetime.now(UTC)
        total = 0
        while True:
            taken = await asyncio.to_thread(self.store.take_outbox, now - timedelta(seconds=age))
            if not taken:
                return total
            trace_keys = [(t, r) for t, kind, r, _ in taken if kind == "trace"]
            update_keys = [(t, r) for t, kind, r, _ in taken if kind == "update"]
            queued = {(t, r): q for t, kind, r, q in taken if kind == "feedback"}
            traces = await asyncio.to_thread(self._traces, trace_keys)
            if traces:
                await self.fanout.consume_traces(traces)
                await asyncio.to_thread(self.store.finish_new, traces)
            updated = await asyncio.to_thread(self._traces, update_keys)
            if updated and self.updates is not None:
                await self.updates(updated)
            # an updated trace deleted since (retention) has nothing left to correct
            found = {(t.tenant, t.trace_id) for t in updated}
            await asyncio.to_thread(
                self.store.clear_outbox, "update", [k for k in update_keys if k not in found]
            )
            events = await asyncio.to_thread(self.store.feedback_events, list(queued))
            stored = await asyncio.to_thread(
                self.store.stored_traces, [(f.tenant, f.trace_id) for f in events]
            )
            joined = [f for f in events if (f.tenant, f.trace_id) in stored]
            if joined:
                await self.fanout.consume_feedback(joined)
            wait = timedelta(seconds=self.feedback_wait_s)
            expired = [
                f
                for f in events
                if (f.tenant, f.trace_id) not in stored and now - queued[(f.tenant, f.event_id)] >= wait
            ]
            for event in expired:
                self.metrics.feedback_orphaned.labels(kind=event.kind).inc()
            # a trace deleted since (retention) has nothing left to fan out: its row goes too
            await asyncio.to_thread(self.store.clear_outbox, "trace", trace_keys)
            known = {(f.tenant, f.event_id) for f in events}
            done = [(f.tenant, f.event_id) for f in (*joined, *expired)] + [
                k for k in queued if k not in known
            ]
            await asyncio.to_thread(self.store.clear_outbox, "feedback", done)
            total += len(traces) + len(joined) + len(updated)
            self.swept += len(traces) + len(joined) + len(updated)
            if len(taken) < _TAKE:  # the rest was taken just now, or waits for its trace
                return total

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
