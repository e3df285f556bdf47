"""`SpanExpiry`: closes the late window of flushed traces, and observes what waited for it.

Every `every_s` it clears the spans the archive kept for traces first flushed
more than `assembler.late_window_s` ago (`SpanArchive.expire`; a span of
theirs that comes later still is dropped as too late). A trace that is still
partial then can no longer be completed: its per-trace totals (its duration
and its cost), which a partial version does not observe
(service/corrections.py), are observed now, and what was counted for it
(`trace_counted`) is let go of.

Each expired trace is claimed by the update that clears its row, so several
processes sweeping one store (sinks workers) observe each trace once.
"""

from __future__ import annotations

import asyncio
import logging

from service.corrections import count_expired
from service.lifecycle import cancel_task
from service.metrics import Metrics
from service.store.span_archive import SpanArchive
from service.store.trace_store import Store

__all__ = ["SpanExpiry"]

log = logging.getLogger(__name__)
_BATCH = 500


class SpanExpiry:
    """The periodic end of traces' late windows (see the module docstring)."""

    def __init__(
        self, archive: SpanArchive, store: Store, metrics: Metrics, *, every_s: float = 30.0
    ) -> None:
        self.archive = archive
        self.store = store
        self.metrics = metrics
        self.every_s = every_s
        self._task: asyncio.Task[None] | None = None

    def expire(self) -> int:
        """One pass (blocking): returns how many traces' windows closed."""
        total = 0
        while True:
            keys = self.archive.expire(_BATCH)
            if keys:
                partial = self.store.stored_partial(keys)
                counted = self.store.fanout_state([(t.tenant, t.trace_id) for t in partial])
                count_expired(
                    self.metrics,
                    [(t.tenant, t, counted[(t.tenant, t.trace_id)].counted) for t in partial],
                )
                self.store.forget_counted(keys)
            total += len(keys)
            if len(keys) < _BATCH:
                return total

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.expire)
            except Exception:
                log.exception("closing the late window of flushed traces failed; retrying")
            await asyncio.sleep(self.every_s)

    async def start(self) -> None:
        """Sweep now and then every `every_s`. Safe twice."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="span-expiry")

    async def stop(self) -> None:
        await cancel_task(self._task)
        self._task = None
