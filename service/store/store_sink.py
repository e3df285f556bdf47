"""`StoreSink`: the pipeline stage that stores traces and feedback, then fans the new ones out.

The sinks after the store (metrics, judge queue, review intake, drift windows)
see each trace once however often the bus redelivers it: the store says which
records were new, and a `fanout_outbox` row written with each new record is
cleared only once its fan-out returned, so a crash or a failing sink between
the two leaves it for the sweep (service/outbox.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from service.consumer import FeedbackConsumer, TraceConsumer
from service.corrections import Counted, TraceUpdate, UpdateConsumer
from service.model import Feedback, RagTrace
from service.store.rows import storable_text
from service.store.trace_store import Store, StoredTraces

__all__ = ["StoreSink"]

log = logging.getLogger(__name__)

_R = TypeVar("_R")


class StoreSink:
    """The pipeline sink that writes traces and feedback to a `Store`.

    Implements `TraceConsumer` and `FeedbackConsumer`. Inserts run in a worker
    thread so the event loop never blocks on the database. Returning means
    the whole batch is durable in the store; errors are those of `Store`
    (`StoreUnavailable` is retryable; redelivery is harmless).

    `store_traces` returns the trace ids that were new. When `new_traces` is
    given, `consume_traces` hands it just the new traces (first occurrence in
    the batch), so a downstream counter sees each trace once however often the
    bus redelivers it; `new_feedback` gets the new feedback events likewise.
    That hand-off happens after the commit: if it fails, a
    redelivery will not repeat it (at most once downstream). The sink does not
    own the store: `stop` leaves it open.

    A trace stored before is replaced by a fuller version of it (a higher
    revision: its late spans arrived); `updated_traces` then gets the version
    with what was counted for the trace before (`TraceUpdate`), once per
    update, so the sinks correct their counts instead of counting it again
    (service/corrections.py, service/store/trace_updates.py).

    `dead_letter` is the bus's dead-letter handler (`MemoryBus(dead_letters=...)`):
    it keeps records the sink refused for good in the store's `dead_letters`.
    """

    def __init__(
        self,
        store: Store,
        *,
        new_traces: TraceConsumer | None = None,
        new_feedback: FeedbackConsumer | None = None,
        updated_traces: UpdateConsumer | None = None,
    ) -> None:
        self.store = store
        self.new_traces = new_traces
        self.new_feedback = new_feedback
        self.updated_traces = updated_traces
        self._in_flight = 0
        self._fanning: set[tuple[str, str, str]] = set()  # (kind, tenant, id) being fanned out now
        self._idle = asyncio.Event()
        self._idle.set()

    async def start(self) -> None:
        """Nothing to start: the store connects lazily. Present for the pipeline's lifecycle."""

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Wait up to `timeout_s` for inserts in flight to finish. Safe twice and before start."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            pass

    async def _in_thread(self, call: Callable[[Sequence[Any]], _R], batch: Sequence[Any]) -> _R:
        self._in_flight += 1
        self._idle.clear()
        try:
            return await asyncio.to_thread(call, batch)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    async def store_traces(self, batch: Sequence[RagTrace]) -> list[str]:
        """Insert the batch; return the ids of traces not stored before."""
        return (await self.store_versions(batch)).new

    async def store_versions(self, batch: Sequence[RagTrace]) -> StoredTraces:
        """Insert the batch, replacing stored traces by fuller versions (`Store.store_traces`)."""
        outbox = self.new_traces is not None
        return await self._in_thread(lambda b: self.store.store_traces(b, outbox=outbox), batch)

    async def store_feedback(self, batch: Sequence[Feedback]) -> list[str]:
        """Insert the batch; return the event ids not stored before."""
        outbox = self.new_feedback is not None
        return await self._in_thread(lambda b: self.store.insert_feedback(b, outbox=outbox), batch)

    async def dead_letter(self, records: Sequence[RagTrace | Feedback], error: Exception) -> None:
        """Keep records refused for good, with the error, in the store's `dead_letters`; raises
        `StoreUnavailable` (retryable) when the store cannot take them now."""
        text = f"{type(error).__name__}: {error}"
        await self._in_thread(lambda batch: self.store.insert_dead_letters(batch, text), records)

    async def consume_traces(self, batch: Sequence[RagTrace]) -> None:
        stored = await self.store_versions(batch)
        if self.new_traces is None:
            return
        new_ids = set(stored.new)
        if stored.updated:
            updated = set(stored.updated)
            versions: dict[tuple[str, str], RagTrace] = {}
            for trace in batch:
                key = (storable_text(trace.tenant), trace.trace_id)
                if key in updated and (key not in versions or trace.revision > versions[key].revision):
                    versions[key] = trace
            await self.fan_out_updates(list(versions.values()))
        keys = {(t.tenant, t.trace_id) for t in batch}
        if len(new_ids) < len(keys):  # stored before: its fan-out may not have finished (a replay)
            unfinished = await self._in_thread(lambda k: self.store.outboxed("trace", k), list(keys))
            new_ids.update(i for _, i in unfinished)
        new: list[RagTrace] = []
        for trace in batch:
            if trace.trace_id in new_ids:
                new_ids.discard(trace.trace_id)
                new.append(trace)
        done = await self._fan_out(
            "trace",
            new,
            [(t.tenant, t.trace_id) for t in new],
            self.new_traces.consume_traces,
            finish=lambda fanned: self.store.finish_new(fanned),
        )
        if done and new and self.new_feedback is not None:
            # feedback that came before its trace joins now, counted and reviewed under the trace's app
            waiting = await self._in_thread(
                self.store.waiting_feedback, [(t.tenant, t.trace_id) for t in new]
            )
            await self._fan_out(
                "feedback",
                waiting,
                [(f.tenant, f.event_id) for f in waiting],
                self.new_feedback.consume_feedback,
            )

    async def consume_feedback(self, batch: Sequence[Feedback]) -> None:
        new_ids = set(await self.store_feedback(batch))
        if self.new_feedback is None:
            return
        keys = {(f.tenant, f.event_id) for f in batch}
        if len(new_ids) < len(keys):
            unfinished = await self._in_thread(lambda k: self.store.outboxed("feedback", k), list(keys))
            new_ids.update(i for _, i in unfinished)
        new: list[Feedback] = []
        for event in batch:
            if event.event_id in new_ids:
                new_ids.discard(event.event_id)
                new.append(event)
        # feedback whose trace is not stored yet waits in the outbox: the trace's fan-out takes it along
        # when it comes, the sweep counts it as an orphan if it never does (service/outbox.py)
        stored = await self._in_thread(self.store.stored_traces, [(f.tenant, f.trace_id) for f in new])
        joined = [f for f in new if (f.tenant, f.trace_id) in stored]
        await self._fan_out(
            "feedback", joined, [(f.tenant, f.event_id) for f in joined], self.new_feedback.consume_feedback
        )

    async def fan_out_updates(self, versions: Sequence[RagTrace]) -> bool:
        """Hand the sinks these stored versions as updates (`TraceUpdate`), each with what was counted
        for its trace before, then record what is counted now; False when a sink failed (the outbox
        rows stay for the sweep). A trace whose first fan-out is still pending, or that another lane
        is fanning out now, is left to the outbox sweep: it runs them one after the other."""
        if self.updated_traces is None or not versions:
            return True
        mine = [t for t in versions if ("trace", t.tenant, t.trace_id) not in self._fanning]
        claimed = {("trace", t.tenant, t.trace_id) for t in mine}
        if not mine:
            return True
        self._fanning |= claimed
        try:
            keys = [(storable_text(t.tenant), t.trace_id) for t in mine]
            states = await self._in_thread(self.store.fanout_state, keys)
            todo: list[tuple[TraceUpdate, datetime]] = []
            for trace, key in zip(mine, keys, strict=True):
                state = states.get(key)
                if state is None or state.update_queued_at is None or state.new_pending:
                    continue
                if state.counted is None:
                    log.error("update of trace %s has no counted baseline; counting it as stored", key[1])
                    state_counted = Counted.of(trace)
                else:
                    state_counted = state.counted
                todo.append((TraceUpdate(trace, state_counted), state.update_queued_at))
            if not todo:
                return True
            try:
                await self.updated_traces.consume_updates([u for u, _ in todo])
            except Exception:
                log.exception("fan-out of %d updated traces failed; the outbox sweep will retry", len(todo))
                return False
            done = [
                ((storable_text(u.trace.tenant), u.trace.trace_id), queued_at, u.after.to_json())
                for u, queued_at in todo
            ]
            await self._in_thread(self.store.finish_updates, done)
            return True
        finally:
            self._fanning -= claimed

    async def _fan_out(
        self,
        kind: str,
        records: Sequence[Any],
        keys: list[tuple[str, str]],
        consume: Callable[[Any], Awaitable[None]],
        finish: Callable[[Sequence[Any]], None] | None = None,
    ) -> bool:
        """Hand new records on, then forget their outbox rows; False when a sink failed. The records
        are stored already, so a failing sink does not fail the delivery: its outbox rows stay, and
        the sweep (service/outbox.py) runs the fan-out again later.

        Exactly once: the trace and feedback lanes may both reach one feedback event (it came before
        its trace), so a record is fanned out only while this sink is not already fanning it out,
        and only if its outbox row is still there (no lane finished it before)."""
        mine = [(r, k) for r, k in zip(records, keys, strict=True) if (kind, *k) not in self._fanning]
        if not mine:
            return True
        claimed = {(kind, *k) for _, k in mine}
        self._fanning |= claimed
        try:
            unfinished = await self._in_thread(lambda k: self.store.outboxed(kind, k), [k for _, k in mine])
            todo = [(r, k) for r, k in mine if (storable_text(k[0]), k[1]) in unfinished]
            if not todo:
                return True
            try:
                await consume([r for r, _ in todo])
            except Exception:
                log.exception(
                    "fan-out of %d stored %s records failed; the outbox sweep will retry", len(todo), kind
                )
                return False
            if finish is not None:
                await self._in_thread(finish, [r for r, _ in todo])
            else:
                await self._in_thread(lambda k: self.store.clear_outbox(kind, k), [k for _, k in todo])
            return True
        finally:
            self._fanning -= claimed
