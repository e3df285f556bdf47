"""`DurableAcks`: embedded mode's durable acknowledgement, the write-ahead log and its ledger together.

A receiver's request is logged (`log`) before it is answered; the keys it
brought are held in the ledger at its log seq. The assembler, the request
filter and the bus delivery tell this object what was taken for a version of
a trace and what reached an end (`taken`, `done`), a checkpoint every
`wal.checkpoint_s` deletes the log segments below the watermark, and `start`
hands every record a crash left back to the pipeline (`replay`) before the
receivers open. See wal.py and ledger.py for the guarantees of each half.

A trace open for long (an agent at work, an LLM call streaming for minutes)
would keep every segment from its first request on: the watermark is the
oldest request still held. So a checkpoint also logs again, as one record,
the buffered spans of each trace still open `wal.relog_after_s` after its
oldest logged request (`open_items` reads them from the span assembler) and
holds the trace at that record instead: a crash then replays that record,
and the older segments can go. Reading the trace's holds and its spans
happens at one moment of the event loop, so they describe the same spans.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path

from service.config import WalConfig
from service.conventions.spans import AnySpan
from service.errors import RetryableError
from service.ingest import span_records
from service.ingest.ledger import AckLedger, Key
from service.ingest.wal import LoggedRequest, RequestKind, WriteAheadLog
from service.lifecycle import cancel_task
from service.metrics import Metrics

__all__ = ["DurableAcks"]

log = logging.getLogger(__name__)

Replay = Callable[[LoggedRequest], Awaitable[None]]
_NO_LIMIT = 1 << 62  # one record carries a whole open trace


class DurableAcks:
    """The log in `directory` and what of it is not stored yet."""

    def __init__(
        self,
        config: WalConfig,
        directory: Path,
        metrics: Metrics,
        retry_after_s: float,
        store_sync: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        # makes what the store committed survive power loss; run before the log lets go of it
        self.store_sync = store_sync
        self._synced_below = 0
        self.metrics = metrics
        self.wal = WriteAheadLog(
            directory,
            segment_bytes=config.segment_bytes,
            segment_max_age_s=config.segment_max_age_s,
            max_bytes=config.max_bytes,
            fsync=config.fsync,
            retry_after_s=retry_after_s,
        )
        self.ledger = AckLedger()
        # the buffered spans of an open trace, for logging them again (set by the pipeline)
        self.open_items: Callable[[Key], Sequence[AnySpan] | None] | None = None
        self._seq_at: deque[tuple[float, int]] = deque()  # (monotonic time, next seq) per checkpoint
        self._checkpoints: asyncio.Task[None] | None = None
        self._fsyncs_counted = 0
        metrics.state.add("ragmon_wal_bytes", "bytes in the write-ahead log", lambda: self.wal.size_bytes)
        metrics.state.add("ragmon_wal_segments", "write-ahead log segment files", lambda: self.wal.segments)
        metrics.state.add(
            "ragmon_wal_unstored_records",
            "traces and feedback events acknowledged and not yet stored (held in the write-ahead log)",
            lambda: len(self.ledger),
        )

    async def log(self, request: LoggedRequest, keys: Iterable[Key]) -> None:
        """Append and fsync `request`, then hold its keys; raises `WalFull` / `WalUnavailable` (503)."""
        seq = await self.wal.append(request)
        self.ledger.hold(keys, seq)

    def hold(self, keys: Iterable[Key], seq: int) -> None:
        """Hold the keys of a replayed record at its old seq."""
        self.ledger.hold(keys, seq)

    def taken(self, keys: Iterable[Key]) -> None:
        self.ledger.taken(keys)

    def done(self, keys: Iterable[Key]) -> None:
        self.ledger.done(keys)

    async def start(self, replay: Replay) -> int:
        """Read what a crash left and hand each record to `replay` in order; then start checkpoints.
        Returns the records replayed. A record `replay` raises for is logged and skipped: it was
        accepted once, and a bug must not keep every later record from the store."""
        records = await asyncio.to_thread(self.wal.open)
        for record in records:
            try:
                await replay(record)
            except Exception:
                log.exception(
                    "could not replay write-ahead log record %d (%s); skipped", record.seq, record.kind
                )
                continue
            self.metrics.wal_replayed.labels(kind=record.kind).inc()
        if records:
            log.warning("replayed %d acknowledged requests from the write-ahead log", len(records))
        if self._checkpoints is None:
            self._checkpoints = asyncio.create_task(self._checkpoint_loop(), name="wal-checkpoints")
        return len(records)

    def checkpoint(self) -> int:
        """Delete the segments every record of which is stored (and synced to disk by the store);
        returns how many went."""
        watermark = self.ledger.watermark(self.wal.next_seq)
        if self._needs_sync(watermark):
            self._sync_store(watermark)
        return self._release(watermark)

    async def _checkpoint(self) -> int:
        """`checkpoint`, with the store's fsync in a thread: it may take milliseconds, which on the
        event loop would hold every request. The watermark is read before the sync, so only what was
        stored before it is let go."""
        watermark = self.ledger.watermark(self.wal.next_seq)
        if self._needs_sync(watermark):
            await asyncio.to_thread(self._sync_store, watermark)
        return self._release(watermark)

    def _needs_sync(self, watermark: int) -> bool:
        return self.store_sync is not None and watermark > self._synced_below

    def _sync_store(self, watermark: int) -> None:
        assert self.store_sync is not None
        self.store_sync()
        self._synced_below = watermark

    def _release(self, watermark: int) -> int:
        fsyncs = self.wal.fsyncs
        self.metrics.wal_fsyncs.inc(fsyncs - self._fsyncs_counted)
        self._fsyncs_counted = fsyncs
        return self.wal.release_below(watermark)

    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.checkpoint_s)
            try:
                await self.relog_open(time.monotonic())
                await self._checkpoint()
            except (OSError, RetryableError):
                log.exception("write-ahead log checkpoint failed; retrying")

    async def relog_open(self, now: float) -> int:
        """Log again the spans of traces still open `relog_after_s` after their oldest logged request;
        returns how many traces were. See the module docstring."""
        self._seq_at.append((now, self.wal.next_seq))
        before = now - self.config.relog_after_s
        threshold = -1
        while self._seq_at and self._seq_at[0][0] <= before:
            threshold = self._seq_at.popleft()[1]  # every request below it is older than that
        if threshold < 0 or self.open_items is None:
            return 0
        self._seq_at.appendleft((before, threshold))
        relogged = 0
        for key in self.ledger.open_below(threshold):
            # at one moment of the loop: the requests not taken yet and the spans they brought
            old, items = self.ledger.open_holds(key), self.open_items(key)
            if not old or not items:
                continue
            seqs = []
            for record in span_records.encode(items, _NO_LIMIT):
                kind: RequestKind = (
                    "otlp_logs" if dict(record.headers)["ragmon-kind"] == b"logs" else "otlp_traces"
                )
                request = LoggedRequest(
                    kind, items[0].tenant, record.value, media_type="application/x-protobuf", receiver="relog"
                )
                # also when the log is full: this record is what lets its older segments go
                seqs.append(await self.wal.append(request, over_max=True))
            if self.ledger.rehold(key, old, seqs):
                relogged += 1
        if relogged:
            self.metrics.wal_relogged.inc(relogged)
        return relogged

    async def stop(self) -> None:
        """After the pipeline drained: a last checkpoint, then close the log. Safe twice."""
        await cancel_task(self._checkpoints)
        self._checkpoints = None
        await self.wal.close()
        self.checkpoint()
