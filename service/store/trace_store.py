"""`Store`: ragmon's persistence layer for traces and feedback.

One code path for SQLite (a file in WAL mode, the embedded default) and
PostgreSQL (`postgresql+psycopg://...`), written in SQLAlchemy Core (one
exception, for speed: new traces, under "Idempotent writes"). This module holds
the writes; `Store` has its reads from `TraceReads` (`trace_reads.py`), and its
error translation, transactions, schema and health from `StoreBase`
(`store_base.py`). Table shapes and the record ↔ row converters live in
`service.store.tables`, the engines and their transactions in `engine.py`,
listing filters and cursors in `trace_query.py`; `StoreSink` (`store_sink.py`)
is the pipeline stage that feeds the store.

Guarantees every method keeps:

* Idempotent writes: a trace is stored once per (tenant, trace_id) and a
  feedback event once per (tenant, event_id) (`INSERT ... ON CONFLICT DO
  NOTHING`). A stored trace is replaced only by a version of it with a
  higher `RagTrace.revision` (its late spans arrived: trace_updates.py);
  a redelivery, or an older version that arrives last, changes nothing. Each batch is one transaction:
  all of it is written, or none. New traces take a faster road to the same
  rows (service/store/row_insert.py says why): on SQLite the batch's stored
  keys are read under the write lock and only the others inserted, by plain
  executemany; on PostgreSQL the batch is COPYed into a session's staging
  table and moved with `INSERT ... SELECT ... ON CONFLICT DO NOTHING
  RETURNING`, which both skips the stored keys and names the new ones.
* Tenant isolation: every read filters by the tenant it is given.
* Bounded waits: connecting, waiting for a lock and running a statement are
  each limited by the timeouts given to `Store`.
* Errors: SQLAlchemy exceptions are caught only in `StoreBase._translated`
  (store_base.py). A database that cannot be reached, times out or fails for
  reasons a retry may cure raises `StoreUnavailable`; data the database
  refuses (an integer out of range, a constraint) raises `InvalidInput`, a
  `PermanentError`, whose message names the cause but not the statement or
  its parameters (they hold every record of the batch, of any tenant).
* Dead letters: `insert_dead_letters` keeps records a sink refused for good
  (the bus hands them over one at a time, `service/bus/memory.py`), once per
  (tenant, kind, record id); `list_dead_letters` reads them per tenant.
  Retention removes them with the traces of their age.

Regeneration from feedback: a `regenerate` feedback event marks the trace it
names as a regeneration with source "feedback". The row itself is updated in
the transaction that stores the second of the two (feedback after trace: the
feedback insert updates the row; trace after feedback: the trace insert does).
Because two concurrent transactions can each miss the other, reads also OR the
row flag with "a regenerate feedback exists", so what a reader sees never
depends on arrival order. A flag the app set itself ("attribute", "reask") is
never overwritten.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.schema import CreateTable

from service.config import masked_url
from service.model import Feedback, RagTrace
from service.store import trace_updates
from service.store.engine import postgres_engine, sqlite_engine
from service.store.keys import keys_by_group, keys_in
from service.store.row_insert import CopyRows, PlainInsert
from service.store.rows import (
    dead_letter_row,
    feedback_row,
    non_request_row,
    storable_text,
    to_utc,
    trace_context,
    trace_row,
)
from service.store.tables import (
    dead_letters,
    fanout_outbox,
    feedback,
    non_request_traces,
    trace_contexts,
    trace_counted,
    trace_spans,
    traces,
)
from service.store.trace_query import regenerate_feedback
from service.store.trace_reads import TraceReads
from service.store.trace_updates import FanoutState

__all__ = ["Store", "StoredTraces"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StoredTraces:
    """What `Store.store_traces` did: the ids of the new traces, the keys of the replaced ones."""

    new: list[str]
    updated: list[tuple[str, str]]


def _outbox_rows(tenant: str, kind: str, ids: Sequence[str]) -> tuple[sa.ColumnElement[bool], ...]:
    """The `fanout_outbox` rows of these records of one tenant and kind."""
    return (
        fanout_outbox.c.tenant == tenant,
        fanout_outbox.c.kind == kind,
        fanout_outbox.c.record_id.in_(ids),
    )


# Statements of the ingest path, compiled once (see `keys_by_group`).
_STORED_TRACE_KEYS = sa.select(traces.c.tenant, traces.c.trace_id).where(
    traces.c.tenant == sa.bindparam("for_tenant"), traces.c.trace_id.in_(sa.bindparam("keys", expanding=True))
)
# PostgreSQL: new trace rows are COPYed into this session-private table (created as each connection
# opens, emptied at every commit), then moved into `traces` in key order by one statement that
# skips the stored ones and names the new (service/store/row_insert.py says why COPY).
_STAGED_TRACES = sa.Table(
    "ragmon_staged_traces",
    sa.MetaData(),
    *(sa.Column(column.name, column.type) for column in traces.columns),
    prefixes=["TEMPORARY"],
    postgresql_on_commit="DELETE ROWS",
)
_TRACE_COLUMNS = ", ".join(column.name for column in traces.columns)
_MOVE_STAGED_TRACES = (
    f"INSERT INTO traces ({_TRACE_COLUMNS}) SELECT {_TRACE_COLUMNS} FROM {_STAGED_TRACES.name}"
    " ORDER BY tenant, trace_id ON CONFLICT DO NOTHING RETURNING tenant, trace_id"
)
# Feedback that arrived before its trace marks the trace when it is stored.
_MARK_FEEDBACK_REGENERATIONS = (
    sa.update(traces)
    .where(
        traces.c.tenant == sa.bindparam("for_tenant"),
        traces.c.trace_id.in_(sa.bindparam("keys", expanding=True)),
        traces.c.is_regeneration == sa.false(),
        regenerate_feedback(),
    )
    .values(is_regeneration=True, regeneration_source="feedback")
)


def _context_row(key: tuple[str, str], trace: RagTrace) -> dict[str, Any]:
    return {"tenant": key[0], "trace_id": key[1], "context": trace_context(trace)}


class Store(TraceReads):
    """The trace and feedback store on SQLite or PostgreSQL; thread-safe, blocking.

    `url` is a SQLAlchemy URL: `sqlite:///path.db` (the file is created; its
    directory must exist), `sqlite://` for a private in-memory database, or
    `postgresql+psycopg://user@host:port/db` (`postgresql://` is read as
    psycopg; server settings may come in its `options` query parameter).
    Timeouts, in seconds: `connect_timeout_s` for opening a
    connection (PostgreSQL; at least 2 s, libpq's floor), `pool_timeout_s` for
    waiting on a free pooled connection, `statement_timeout_s` for one
    statement and for waiting on a lock (PostgreSQL `statement_timeout` and
    `lock_timeout`, SQLite busy timeout). `application_name` names its
    PostgreSQL connections (`pg_stat_activity`) unless the URL does. Call
    `create_schema()` once before use, `close()` at the end.
    """

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 5,
        max_overflow: int = 5,
        pool_timeout_s: float = 5.0,
        connect_timeout_s: float = 5.0,
        statement_timeout_s: float = 10.0,
        application_name: str = "ragmon",
    ) -> None:
        for name, value in (
            ("pool_timeout_s", pool_timeout_s),
            ("connect_timeout_s", connect_timeout_s),
            ("statement_timeout_s", statement_timeout_s),
        ):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if pool_size < 1 or max_overflow < 0:
            raise ValueError("pool_size must be at least 1 and max_overflow at least 0")
        parsed = sa.make_url(url)
        if parsed.drivername in ("postgresql", "postgres"):
            parsed = parsed.set(drivername="postgresql+psycopg")
        # as it may be shown: the password and credential-like query parameters masked (`masked_url`)
        self.url = masked_url(parsed.render_as_string(hide_password=False))
        self.pool_size = pool_size
        self.max_overflow = max_overflow
        self.pool_timeout_s = pool_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.statement_timeout_s = statement_timeout_s
        self._closed = False
        # new trace rows and contexts through the driver's executemany (SQLite) or COPY (PostgreSQL):
        # service/store/row_insert.py
        self._plain_inserts: tuple[PlainInsert, PlainInsert] | None = None
        self._copies: tuple[CopyRows, CopyRows] | None = None
        if parsed.get_backend_name() == "sqlite":
            self._engine = sqlite_engine(
                parsed,
                pool_size=pool_size,
                max_overflow=max_overflow,
                pool_timeout_s=pool_timeout_s,
                statement_timeout_s=statement_timeout_s,
            )
            dialect = self._engine.dialect
            self._plain_inserts = (PlainInsert(traces, dialect), PlainInsert(trace_contexts, dialect))
        elif parsed.drivername == "postgresql+psycopg":
            self._engine = postgres_engine(
                parsed,
                pool_size=pool_size,
                max_overflow=max_overflow,
                pool_timeout_s=pool_timeout_s,
                connect_timeout_s=connect_timeout_s,
                statement_timeout_s=statement_timeout_s,
                application_name=application_name,
            )
            self._on_connect_create_staging()
            dialect = self._engine.dialect
            self._copies = (CopyRows(traces, dialect), CopyRows(trace_contexts, dialect))
        else:
            raise ValueError(f"unsupported store URL {self.url!r}: use sqlite:/// or postgresql+psycopg://")

    def _on_connect_create_staging(self) -> None:
        """PostgreSQL: each new connection creates its session's staging table (`_STAGED_TRACES`), in
        a committed transaction of its own: created in a batch's, a rolled-back batch would drop it."""
        staging = str(CreateTable(_STAGED_TRACES).compile(dialect=self._engine.dialect))

        @sa.event.listens_for(self._engine, "connect")
        def _create_staging(dbapi_connection: Any, _record: Any) -> None:
            with dbapi_connection.cursor() as cursor:
                cursor.execute(staging)
            dbapi_connection.commit()

    def insert_traces(self, batch: Sequence[RagTrace], *, outbox: bool = False) -> list[str]:
        """Store a batch of traces in one transaction; return the ids that were new.

        The result keeps batch order and holds one entry per (tenant, trace_id)
        not stored before; a redelivered trace changes nothing and is left out,
        so the same batch twice returns [] the second time. With `outbox`, each
        new trace also gets a `fanout_outbox` row in the same transaction.
        A stored trace is replaced by a version of higher revision (`store_traces`).
        """
        return self.store_traces(batch, outbox=outbox).new

    def store_traces(self, batch: Sequence[RagTrace], *, outbox: bool = False) -> StoredTraces:
        """Store a batch of traces in one transaction: new ones are inserted, and a stored trace is
        replaced by a fuller version of it (a higher `revision`: its late spans arrived;
        service/store/trace_updates.py). Returns the new trace ids (batch order, as `insert_traces`)
        and the (tenant, trace_id) of the replaced ones. With `outbox`, each new trace gets a
        `fanout_outbox` row of kind `trace` and each replaced one a row of kind `update`."""
        if not batch:
            return StoredTraces([], [])
        created_at = datetime.now(UTC)
        pending: dict[tuple[str, str], RagTrace] = {}
        for trace in batch:
            key = (storable_text(trace.tenant), trace.trace_id)
            seen = pending.get(key)
            if seen is None or trace.revision > seen.revision:
                pending[key] = trace
        with self._write("insert traces") as conn:
            new = self._insert_new_traces(conn, pending, created_at)
            for tenant, keys in keys_by_group(new):
                conn.execute(_MARK_FEEDBACK_REGENERATIONS, {"for_tenant": tenant, "keys": keys})
            if outbox and new:
                self._outbox_add(conn, "trace", new, created_at)
            stored = {k: t for k, t in pending.items() if k not in new and t.revision > 0}
            updated = (
                trace_updates.replace_stored(conn, self._dialect_module, stored, created_at, outbox=outbox)
                if stored
                else []
            )
        return StoredTraces(
            [trace_id for (tenant, trace_id) in pending if (tenant, trace_id) in new], updated
        )

    @property
    def _dialect_module(self) -> Any:
        return postgresql if self.dialect == "postgresql" else sqlite

    def fanout_state(self, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], FanoutState]:
        """Where the fan-out of these stored traces stands (service/store/trace_updates.py)."""
        with self._read("read the fan-out state") as conn:
            return trace_updates.fanout_state(conn, keys)

    def finish_new(self, fanned: Sequence[RagTrace]) -> None:
        """The first fan-out of these traces returned: their outbox rows go (`trace_updates.finish_new`)."""
        if fanned:
            with self._write("finish the fan-out of new traces") as conn:
                trace_updates.finish_new(conn, self._dialect_module, fanned, datetime.now(UTC))

    def finish_updates(self, done: Sequence[tuple[tuple[str, str], datetime, str]]) -> None:
        """The fan-out of these updates returned (`trace_updates.finish_updates`)."""
        if done:
            with self._write("finish the fan-out of updated traces") as conn:
                trace_updates.finish_updates(conn, self._dialect_module, done, datetime.now(UTC))

    def forget_counted(self, keys: Iterable[tuple[str, str]]) -> None:
        """Delete what was counted for these traces: no later version of them can come."""
        with self._write("forget counted traces") as conn:
            for tenant, ids in keys_by_group((storable_text(t), i) for t, i in keys):
                conn.execute(
                    sa.delete(trace_counted).where(
                        trace_counted.c.tenant == tenant, trace_counted.c.trace_id.in_(ids)
                    )
                )

    def _insert_new_traces(
        self, conn: Connection, pending: dict[tuple[str, str], RagTrace], created_at: datetime
    ) -> set[tuple[str, str]]:
        """Insert the rows and contexts of the traces in `pending` not stored before; their keys."""
        # Concurrent batches that share ids wait on each other's rows; inserting
        # in key order everywhere keeps that from becoming a deadlock on PostgreSQL.
        order = sorted(pending)
        if self._plain_inserts is not None:
            # SQLite: this transaction holds the only write lock (BEGIN IMMEDIATE), so a key read
            # as absent stays absent until commit, and the new rows need no ON CONFLICT.
            stored: set[tuple[str, str]] = set()
            for tenant, keys in keys_by_group(order):
                found = conn.execute(_STORED_TRACE_KEYS, {"for_tenant": tenant, "keys": keys})
                stored.update((row_tenant, trace_id) for row_tenant, trace_id in found)
            new = [k for k in order if k not in stored]
            insert_traces, insert_contexts = self._plain_inserts
            insert_traces.execute(conn, (trace_row(pending[k], created_at=created_at) for k in new))
            insert_contexts.execute(conn, (_context_row(k, pending[k]) for k in new))
            return set(new)
        if self._copies is None:
            raise RuntimeError(f"no insert road for {self.dialect}")
        copy_traces, copy_contexts = self._copies
        copy_traces.copy(
            conn, _STAGED_TRACES.name, (trace_row(pending[k], created_at=created_at) for k in order)
        )
        inserted = conn.exec_driver_sql(_MOVE_STAGED_TRACES)
        new_keys = {(tenant, trace_id) for tenant, trace_id in inserted}
        # a key the move inserted was absent, and its context with it: a concurrent batch with the same
        # key waits on the new row's lock, then skips it and its context
        if new_keys:
            copy_contexts.copy(
                conn, "trace_contexts", (_context_row(k, pending[k]) for k in sorted(new_keys))
            )
        return new_keys

    # -- the fan-out outbox (tables.fanout_outbox)

    def _outbox_add(self, conn: Connection, kind: str, keys: Iterable[tuple[str, str]], at: datetime) -> None:
        rows = [
            {"tenant": t, "kind": kind, "record_id": i, "created_at": at, "queued_at": at}
            for t, i in sorted(keys)
        ]
        conn.execute(self._insert(fanout_outbox), rows)

    def outboxed(self, kind: str, keys: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
        """Those of `keys` ((tenant, record id)) whose fan-out has not completed."""
        found: set[tuple[str, str]] = set()
        with self._read("read the fan-out outbox") as conn:
            for tenant, ids in keys_by_group((storable_text(t), i) for t, i in keys):
                rows = conn.execute(
                    sa.select(fanout_outbox.c.record_id).where(*_outbox_rows(tenant, kind, ids))
                )
                found.update((tenant, row[0]) for row in rows)
        return found

    def clear_outbox(self, kind: str, keys: Iterable[tuple[str, str]]) -> None:
        """The fan-out of these records returned: forget them."""
        with self._write("clear the fan-out outbox") as conn:
            for tenant, ids in keys_by_group((storable_text(t), i) for t, i in keys):
                conn.execute(sa.delete(fanout_outbox).where(*_outbox_rows(tenant, kind, ids)))

    def take_outbox(self, older_than: datetime, limit: int = 500) -> list[tuple[str, str, str, datetime]]:
        """(tenant, kind, record id, when it was stored) of up to `limit` records whose fan-out is
        older than `older_than` and unfinished; each is stamped now, so another sweep leaves it alone
        for a while (a sweep that dies leaves it to be taken again later)."""
        now = datetime.now(UTC)
        with self._write("take from the fan-out outbox") as conn:
            rows = conn.execute(
                sa.select(
                    fanout_outbox.c.tenant,
                    fanout_outbox.c.kind,
                    fanout_outbox.c.record_id,
                    fanout_outbox.c.queued_at,
                )
                .where(fanout_outbox.c.created_at < older_than)
                .order_by(fanout_outbox.c.created_at)
                .limit(limit)
                .with_for_update(skip_locked=True)
            ).all()
            for tenant, kind, record_id, _ in rows:
                conn.execute(
                    sa.update(fanout_outbox)
                    .where(*_outbox_rows(tenant, kind, [record_id]))
                    .values(created_at=now)
                )
        return [(t, k, r, to_utc(q)) for t, k, r, q in rows]

    def stored_traces(self, keys: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
        """Those of `keys` ((tenant, trace_id)) whose trace is stored."""
        found: set[tuple[str, str]] = set()
        with self._read("read stored trace keys") as conn:
            for tenant, ids in keys_by_group((storable_text(t), i) for t, i in keys):
                rows = conn.execute(_STORED_TRACE_KEYS, {"for_tenant": tenant, "keys": ids})
                found.update((row_tenant, trace_id) for row_tenant, trace_id in rows)
        return found

    def insert_non_requests(self, batch: Sequence[RagTrace]) -> int:
        """Store traces that are not user requests in `non_request_traces`; return how many were new.

        Idempotent by (tenant, trace_id), like `insert_traces`."""
        if not batch:
            return 0
        created_at = datetime.now(UTC)
        pending = {(storable_text(t.tenant), t.trace_id): t for t in batch}
        rows = [non_request_row(pending[k], created_at=created_at) for k in sorted(pending)]
        with self._write("insert non-request traces") as conn:
            return len(
                conn.execute(
                    self._insert(non_request_traces).returning(non_request_traces.c.trace_id), rows
                ).all()
            )

    def insert_feedback(self, batch: Sequence[Feedback], *, outbox: bool = False) -> list[str]:
        """Store a batch of feedback events in one transaction; return the new event ids.

        Idempotent by (tenant, event_id). The trace need not exist yet. A new
        `regenerate` event marks an existing trace as a regeneration. With
        `outbox`, each new event gets a `fanout_outbox` row in the same transaction.
        """
        if not batch:
            return []
        created_at = datetime.now(UTC)
        pending: dict[tuple[str, str], Feedback] = {}
        for event in batch:
            pending.setdefault((storable_text(event.tenant), storable_text(event.event_id)), event)
        rows = [feedback_row(pending[k], created_at=created_at) for k in sorted(pending)]  # see insert_traces
        with self._write("insert feedback") as conn:
            inserted = conn.execute(
                self._insert(feedback).returning(
                    feedback.c.tenant, feedback.c.event_id, feedback.c.trace_id, feedback.c.kind
                ),
                rows,
            ).all()
            regenerated = {(r.tenant, r.trace_id) for r in inserted if r.kind == "regenerate"}
            if regenerated:
                conn.execute(
                    sa.update(traces)
                    .where(
                        keys_in(traces.c.tenant, traces.c.trace_id, regenerated),
                        traces.c.is_regeneration == sa.false(),
                    )
                    .values(is_regeneration=True, regeneration_source="feedback")
                )
            if outbox and inserted:
                self._outbox_add(conn, "feedback", {(r.tenant, r.event_id) for r in inserted}, created_at)
        new = {(r.tenant, r.event_id) for r in inserted}
        return [event_id for (tenant, event_id) in pending if (tenant, event_id) in new]

    def insert_dead_letters(self, records: Sequence[RagTrace | Feedback], error: str) -> int:
        """Keep records a sink refused for good, each with `error`; return how many rows were new.

        One transaction. Idempotent by (tenant, kind, record id): a record
        refused again keeps its first row. Every value is made storable and
        bounded (`tables.dead_letter_row`), so no record's content can make
        this fail; only the database can (`StoreUnavailable`).
        """
        if not records:
            return 0
        created_at = datetime.now(UTC)
        pending: dict[tuple[str, str, str], dict[str, Any]] = {}
        for record in records:
            row = dead_letter_row(record, error, created_at=created_at)
            pending.setdefault((row["tenant"], row["kind"], row["record_id"]), row)
        insert = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
        statement = (
            insert(dead_letters)
            .on_conflict_do_nothing(index_elements=["tenant", "kind", "record_id"])
            .returning(dead_letters.c.id)
        )
        with self._write("insert dead letters") as conn:
            return len(conn.execute(statement, [pending[k] for k in sorted(pending)]).all())

    def delete_older_than(self, cutoff: datetime, *, chunk_size: int = 500) -> int:
        """Delete data older than `cutoff` in all tenants; return how many traces went.

        A trace goes when it started before the cutoff, together with its
        context and all its feedback; feedback given before the cutoff goes
        too, whether or not its trace exists, and so do dead letters written
        before it (they hold the same content). Work is done in transactions of
        at most `chunk_size` traces (or feedback events), so locks stay short
        and an interrupted run leaves whole traces, never half of one.
        """
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
        deleted = self._delete_in_chunks(
            "delete old traces",
            traces,
            "trace_id",
            traces.c.start_time < cutoff,
            (trace_contexts, feedback, trace_spans, trace_counted, traces),
            chunk_size,
        )
        # what non-request traces kept, and tombstones of traces deleted before
        with self._write("delete old kept spans") as conn:
            conn.execute(sa.delete(trace_spans).where(trace_spans.c.first_flushed_at < cutoff))
            conn.execute(sa.delete(trace_counted).where(trace_counted.c.updated_at < cutoff))
        with self._write("delete old non-request traces") as conn:
            conn.execute(sa.delete(non_request_traces).where(non_request_traces.c.start_time < cutoff))
        with self._write("delete old dead letters") as conn:
            conn.execute(sa.delete(dead_letters).where(dead_letters.c.created_at < cutoff))
        self._delete_in_chunks(
            "delete old feedback", feedback, "event_id", feedback.c.time < cutoff, (feedback,), chunk_size
        )
        return deleted

    def _delete_in_chunks(
        self,
        what: str,
        keys_of: sa.Table,
        key: str,
        where: sa.ColumnElement[bool],
        tables: Sequence[sa.Table],
        chunk_size: int,
    ) -> int:
        """Delete, one transaction per chunk of `keys_of` rows matching `where`, the rows of `tables` with
        those (tenant, `key`) keys; return how many keys went."""
        deleted = 0
        while True:
            with self._write(what) as conn:
                keys = [
                    (k[0], k[1])
                    for k in conn.execute(
                        sa.select(keys_of.c.tenant, keys_of.c[key]).where(where).limit(chunk_size)
                    )
                ]
                for table in tables if keys else ():
                    conn.execute(sa.delete(table).where(keys_in(table.c.tenant, table.c[key], keys)))
            deleted += len(keys)
            if len(keys) < chunk_size:
                return deleted
