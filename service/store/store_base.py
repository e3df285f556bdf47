"""`StoreBase`: the database under `Store`: error translation, transactions, the schema, health.

`Store` (trace_store.py) derives from it, through `TraceReads` (trace_reads.py), and its
`__init__` sets what this class reads: the engine (built in engine.py), the URL as it may be
shown, and whether the store is closed. Every statement of the store runs in `_write` (one
transaction; on SQLite it takes the write lock at BEGIN) or `_read` (a pooled connection), and
both translate SQLAlchemy's exceptions into ragmon's (`_translated`): it is the one place the
store catches them. Tables kept beside the traces get the same through `writing` and `reading`
(span_archive.py); stores of other record kinds take the bare `engine` (judge queue, judgments).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from service.errors import InvalidInput, StoreUnavailable
from service.store.engine import transaction
from service.store.tables import SCHEMA_VERSION, metadata, schema_version

__all__ = ["StoreBase"]


def _add_missing_columns(conn: Connection) -> None:
    """Add the columns of ragmon's tables that an existing database lacks (newer schema versions)."""
    inspector = sa.inspect(conn)
    for table in metadata.sorted_tables:
        if not inspector.has_table(table.name):
            continue
        present = {column["name"] for column in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name in present:
                continue
            if column.server_default is None and not column.nullable:
                raise RuntimeError(f"{table.name}.{column.name} has no default to add it to old rows with")
            definition = sa.schema.CreateColumn(column).compile(dialect=conn.dialect)
            preparer = conn.dialect.identifier_preparer
            conn.execute(sa.text(f"ALTER TABLE {preparer.format_table(table)} ADD COLUMN {definition}"))


class StoreBase:
    """The engine of a `Store` with its error translation and transactions, its schema, its health.

    `Store.__init__` sets what it holds: `url` (credentials masked), `_engine` and `_closed`.
    """

    url: str
    _engine: Engine
    _closed: bool

    @property
    def dialect(self) -> str:
        """`sqlite` or `postgresql`."""
        return self._engine.dialect.name

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    @contextmanager
    def _translated(self, action: str) -> Iterator[None]:
        if self._closed:
            raise StoreUnavailable(f"{action}: store {self.url} is closed")
        try:
            yield
        except (sa_exc.IntegrityError, sa_exc.DataError) as exc:
            raise InvalidInput(f"{action}: the database refused the data: {exc.orig}") from exc
        except (sa_exc.DBAPIError, sa_exc.TimeoutError) as exc:
            cause = getattr(exc, "orig", None) or exc
            raise StoreUnavailable(
                f"{action}: store {self.url} unavailable: {type(cause).__name__}: {cause}"
            ) from exc
        except (sa_exc.StatementError, OverflowError) as exc:
            # Raised while binding values, before the database saw them. The cause alone: the
            # StatementError's text carries the statement and the batch's parameters.
            cause = getattr(exc, "orig", None) or exc
            raise InvalidInput(f"{action}: value cannot be stored: {type(cause).__name__}: {cause}") from exc

    @contextmanager
    def _write(self, action: str) -> Iterator[Connection]:
        with self._translated(action), transaction(self._engine, writes=True) as conn:
            yield conn

    @contextmanager
    def _read(self, action: str) -> Iterator[Connection]:
        with self._translated(action), self._engine.connect() as conn:
            yield conn

    def _insert(self, table: sa.Table) -> Any:
        """`INSERT ... ON CONFLICT (primary key) DO NOTHING` in this store's dialect."""
        insert = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
        return insert(table).on_conflict_do_nothing(index_elements=list(table.primary_key.columns))

    @property
    def engine(self) -> Engine:
        """The engine, for stores of other record kinds that share this database (judge queue, judgments)."""
        return self._engine

    def create_schema(self) -> None:
        """Create missing tables and indexes, add missing columns, and record `SCHEMA_VERSION`; safe
        to repeat.

        A column added to an existing table after schema 1 has a server default (`tables.py`), so a
        database of an older schema gets it with one `ALTER TABLE ... ADD COLUMN`, its old rows the
        default; nothing else in an existing table is changed.
        """
        with self._write("create schema") as conn:
            metadata.create_all(conn, checkfirst=True)
            _add_missing_columns(conn)
            conn.execute(
                self._insert(schema_version),
                [{"version": SCHEMA_VERSION, "applied_at": datetime.now(UTC)}],
            )

    def schema_version(self) -> int | None:
        """The newest schema version recorded in the database; None before `create_schema`."""
        with self._read("read schema version") as conn:
            if not sa.inspect(conn).has_table(schema_version.name):
                return None
            version = conn.execute(sa.select(sa.func.max(schema_version.c.version))).scalar()
        return None if version is None else int(version)

    def sync_to_disk(self) -> None:
        """Make every transaction committed so far survive a power loss, not only a crash of ragmon.

        On SQLite (synchronous=NORMAL) a commit is written to the WAL file but fsynced only at the
        next checkpoint; this fsyncs the WAL file. Checkpoints fsync the database file themselves.
        PostgreSQL commits are durable when they return: nothing to do."""
        if self.engine.dialect.name != "sqlite":
            return
        database = self.engine.url.database
        if not database or database == ":memory:":
            return
        try:
            fd = os.open(f"{database}-wal", os.O_RDONLY)
        except FileNotFoundError:  # nothing written since the last checkpoint that removed it
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def ping(self) -> None:
        """Return when the database answers a trivial query; raise `StoreUnavailable` otherwise."""
        with self._read("ping") as conn:
            conn.execute(sa.select(1)).scalar_one()

    def close(self) -> None:
        """Close every pooled connection. Safe to call twice; later calls raise `StoreUnavailable`."""
        if not self._closed:
            self._closed = True
            self._engine.dispose()

    @contextmanager
    def writing(self, action: str) -> Iterator[Connection]:
        """A write transaction with this store's timeouts and error translation (`StoreUnavailable`,
        `InvalidInput`), for tables kept beside the traces (span_archive.py)."""
        with self._write(action) as conn:
            yield conn

    @contextmanager
    def reading(self, action: str) -> Iterator[Connection]:
        """A connection for reads, with this store's error translation."""
        with self._read(action) as conn:
            yield conn
