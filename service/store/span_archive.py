"""`SpanArchive`: the spans of every flushed trace, kept so that spans arriving later complete it.

The span assembler flushes a trace when its root span has ended (plus a
grace period), when no span of it came for a while, or when it has been open
too long (service/assemble.py); an LLM call that streams for minutes, or an
agent, sends spans after that. So every flush goes through `merge` before
the trace is built: the flushed spans are added to what the table
`trace_spans` already keeps for the trace, and the trace is built from all of
them. The first flush of a trace finds nothing kept and costs one insert; a
later one finds the earlier spans, in whichever process (embedded, or any
sinks worker of the Kafka mode) and however long after (within
`late_window_s`), and the trace it builds is the whole trace again: the
store replaces the stored version with it (the version with the higher
`RagTrace.revision`, trace_store.py).

Guarantees:

* **One transaction per merge** (a batch of traces). What a merge returns for
  a trace is everything kept for it at its commit, its own spans included, so
  two merges of one trace give nested span sets, ordered by their commits: the
  one built from the later merge has the higher revision, whatever order the
  builds reach the store in. On PostgreSQL kept rows are locked (`FOR UPDATE`)
  and a row two merges insert at once is inserted by one and merged by the
  other; on SQLite the transaction holds the write lock.
* **Idempotent.** A span (or event) kept already is not kept twice
  (`SpanCodec.identity`: its wire bytes); it is reported as a duplicate. A
  redelivered batch adds nothing and builds the same trace.
* **The late window.** A trace first flushed more than `late_window_s` ago
  takes nothing more: its new spans are reported `too_late` (the caller drops
  and counts them). `expire` clears what such traces kept (a tombstone stays,
  so a span that comes later still is recognised as too late, until retention
  deletes the row with its trace).

The table holds OTLP request messages (service/ingest: `SpanCodec`), not
Python objects, so any ragmon version that reads OTLP reads it. With
redaction on it holds them redacted: ingest redacts spans as it decodes
them (service/ingest/span_redaction.py), before they reach the assembler.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from service.conventions.spans import AnySpan
from service.store.keys import keys_by_group
from service.store.row_insert import InsertNew, PlainInsert
from service.store.rows import storable_text
from service.store.tables import trace_spans
from service.store.trace_store import Store

__all__ = ["Merged", "SpanArchive", "SpanCodec"]

TraceKey = tuple[str, str]  # (tenant, trace_id)


class SpanCodec(Protocol):
    """How spans are kept: as OTLP request messages (service/ingest/span_codec.py)."""

    def encode(self, items: Sequence[AnySpan]) -> tuple[bytes, bytes]:
        """(the spans as ExportTraceServiceRequest bytes, the events as ExportLogsServiceRequest
        bytes) of one trace's items; b"" for none."""

    def decode(self, tenant: str, spans: bytes, events: bytes) -> list[AnySpan]:
        """The items kept as `encode` wrote them (concatenated)."""

    def encode_many(self, groups: Sequence[Sequence[AnySpan]]) -> list[tuple[bytes, bytes]]:
        """`encode` of several traces at once, one result per group."""

    def identity(self, item: AnySpan) -> Hashable:
        """What makes an item the same item when it comes again (its wire bytes)."""


@dataclass(frozen=True, slots=True)
class Merged:
    """A trace after a merge: everything kept for it, what this merge added late, what it dropped."""

    items: Sequence[AnySpan]  # every span and event kept for the trace now; empty when too late
    late: int  # items this merge added to a trace that had been flushed before
    duplicates: int  # items given that were kept already (or given twice): not kept again
    too_late: bool  # the trace's late window had closed: every item given is dropped
    first: bool  # nothing was kept for the trace before this merge


def _utcnow() -> datetime:
    return datetime.now(UTC)


class SpanArchive:
    """The `trace_spans` table of `store`: `merge` before building, `expire` once the window closed.

    Blocking and thread-safe, like `Store`: call it in a worker thread. `clock` gives the wall time
    (timezone-aware) the late window is measured in."""

    def __init__(
        self,
        store: Store,
        codec: SpanCodec,
        late_window_s: float,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        if not (math.isfinite(late_window_s) and late_window_s > 0):
            raise ValueError(f"late_window_s must be a positive number of seconds, got {late_window_s!r}")
        self.store = store
        self.codec = codec
        self.late_window_s = late_window_s
        self.clock = clock
        # new rows by the driver's executemany: plain on SQLite, with ON CONFLICT on PostgreSQL
        # (service/store/row_insert.py says why)
        dialect = store.engine.dialect
        self._new_rows = (
            PlainInsert(trace_spans, dialect)
            if store.dialect == "sqlite"
            else InsertNew(trace_spans, dialect, ["tenant", "trace_id"])
        )

    def merge(self, groups: Sequence[Sequence[AnySpan]]) -> list[Merged]:
        """Keep each group's items (one trace per group, in order) with what is kept for its trace, in
        one transaction; returns per group everything kept for the trace now (see the module doc)."""
        if not groups:
            return []
        now = self.clock()
        unique: list[tuple[TraceKey, list[AnySpan], list[Hashable], int]] = []
        for items in groups:
            key = (storable_text(items[0].tenant), items[0].trace_id)
            seen: set[Hashable] = set()
            kept: list[AnySpan] = []
            ids: list[Hashable] = []
            for item in items:
                identity = self.codec.identity(item)
                if identity not in seen:
                    seen.add(identity)
                    kept.append(item)
                    ids.append(identity)
            unique.append((key, kept, ids, len(items) - len(kept)))
        results: dict[TraceKey, Merged] = {}
        with self.store.writing("keep the spans of flushed traces") as conn:
            # one group per trace is the assembler's rule; should a key come twice, its groups merge
            # one after the other within this transaction
            pending = list(unique)
            while pending:
                batch: dict[TraceKey, tuple[list[AnySpan], list[Hashable], int]] = {}
                later = []
                for key, kept, ids, duplicates in pending:
                    if key in batch:
                        later.append((key, kept, ids, duplicates))
                    else:
                        batch[key] = (kept, ids, duplicates)
                results.update(self._merge(conn, batch, now))
                pending = later
        return [results[key] for key, _, _, _ in unique]

    def _merge(
        self,
        conn: Connection,
        batch: dict[TraceKey, tuple[list[AnySpan], list[Hashable], int]],
        now: datetime,
    ) -> dict[TraceKey, Merged]:
        out: dict[TraceKey, Merged] = {}
        kept_rows = self._locked(conn, sorted(batch))
        fresh = [key for key in sorted(batch) if key not in kept_rows]
        if fresh:
            encoded = self.codec.encode_many([batch[key][0] for key in fresh])
            rows = [
                {
                    "tenant": key[0],
                    "trace_id": key[1],
                    "spans": spans,
                    "events": events,
                    "items": len(batch[key][0]),
                    "first_flushed_at": now,
                    "updated_at": now,
                    "expired": False,
                }
                for key, (spans, events) in zip(fresh, encoded, strict=True)
            ]
            if isinstance(self._new_rows, InsertNew):
                inserted = {(t, i) for t, i in self._new_rows.execute(conn, rows)}
            else:
                # SQLite: this transaction holds the only write lock, so a key read as absent is absent
                self._new_rows.execute(conn, rows)
                inserted = set(fresh)
            for key in fresh:
                if key in inserted:
                    items, _, duplicates = batch[key]
                    out[key] = Merged(items, late=0, duplicates=duplicates, too_late=False, first=True)
            raced = [key for key in fresh if key not in inserted]  # inserted meanwhile by another merge
            if raced:
                kept_rows.update(self._locked(conn, raced))
        window = timedelta(seconds=self.late_window_s)
        for key, row in kept_rows.items():
            items, ids, duplicates = batch[key]
            if row["expired"] or now - row["first_flushed_at"] > window:
                out[key] = Merged((), late=0, duplicates=duplicates, too_late=True, first=False)
                continue
            before = self.codec.decode(key[0], row["spans"] or b"", row["events"] or b"")
            known = {self.codec.identity(item) for item in before}
            new = [item for item, identity in zip(items, ids, strict=True) if identity not in known]
            if new:
                spans, events = self.codec.encode(new)
                conn.execute(
                    sa.update(trace_spans)
                    .where(trace_spans.c.tenant == key[0], trace_spans.c.trace_id == key[1])
                    .values(
                        spans=(row["spans"] or b"") + spans,
                        events=(row["events"] or b"") + events,
                        items=row["items"] + len(new),
                        updated_at=now,
                    )
                )
            out[key] = Merged(
                [*before, *new],
                late=len(new),
                duplicates=duplicates + len(items) - len(new),
                too_late=False,
                first=False,
            )
        return out

    def _locked(self, conn: Connection, keys: Sequence[TraceKey]) -> dict[TraceKey, Any]:
        """The kept rows of `keys`, locked for this transaction (PostgreSQL; SQLite's transaction holds
        the write lock already)."""
        found: dict[TraceKey, Any] = {}
        t = trace_spans.c
        for tenant, ids in keys_by_group(keys):
            rows = conn.execute(
                sa.select(trace_spans)
                .where(t.tenant == tenant, t.trace_id.in_(ids))
                .order_by(t.trace_id)
                .with_for_update()
            ).mappings()
            for row in rows:
                found[(row["tenant"], row["trace_id"])] = row
        return found

    def expire(self, limit: int = 500) -> list[TraceKey]:
        """Clear the spans kept for up to `limit` traces whose late window closed; returns their keys,
        each once over every process sharing the store (the update that clears a row claims it)."""
        cutoff = self.clock() - timedelta(seconds=self.late_window_s)
        t = trace_spans.c
        with self.store.writing("expire kept spans") as conn:
            due = (
                sa.select(t.tenant, t.trace_id)
                .where(t.first_flushed_at < cutoff, t.expired == sa.false())
                .order_by(t.first_flushed_at)
                .limit(limit)
                .with_for_update(skip_locked=True)
            )
            keys = [(row.tenant, row.trace_id) for row in conn.execute(due)]
            for tenant, ids in keys_by_group(keys):
                conn.execute(
                    sa.update(trace_spans)
                    .where(t.tenant == tenant, t.trace_id.in_(ids), t.expired == sa.false())
                    .values(spans=None, events=None, expired=True)
                )
        return keys

    def kept(self, tenant: str, trace_id: str) -> list[AnySpan] | None:
        """What is kept for one trace (None: nothing, or its window closed): for tests and debugging."""
        t = trace_spans.c
        with self.store.reading("read kept spans") as conn:
            row = (
                conn.execute(sa.select(trace_spans).where(t.tenant == tenant, t.trace_id == trace_id))
                .mappings()
                .first()
            )
        if row is None or row["expired"]:
            return None
        return self.codec.decode(tenant, row["spans"] or b"", row["events"] or b"")
