"""Fast roads for new rows: `PlainInsert` (the driver's `executemany`) and `CopyRows` (PostgreSQL COPY).

Why not `connection.execute(insert(table), rows)`: for each row SQLAlchemy
builds a parameter dictionary and runs every column type's bind processor
through its generic execution context: ~8 % of the ingest server's GIL time
on the `traces` row alone (bench/RESULTS.md, "New traces by plain
executemany"; bench/ingest/store_insert.py). This does the same conversions,
with the same bind processors of the column types (so the stored values are
identical), in one tuple per row, and hands the tuples to the DBAPI cursor in
one call.

What it gives up: no `ON CONFLICT` and no `RETURNING`. The caller must know
that every row is new: `Store` uses it on SQLite only, where the transaction
holds the database's single write lock from `BEGIN IMMEDIATE`, so the keys it
read as absent stay absent until it commits.

`CopyRows` streams rows into a PostgreSQL table with `COPY ... FROM STDIN`
(psycopg 3's `cursor.copy`), converted by the same bind processors. Why:
SQLAlchemy sends a batch as one multi-row INSERT of ~30 markers a row, and
psycopg splits that statement's text with a regular expression on every
call, uncached: about half of the client's CPU per stored trace
(bench/ingest/store_insert.py --postgres). COPY has no statement to parse
and no markers. It has no `ON CONFLICT` either, so `Store` copies into a
temporary staging table and moves the rows from there with one
`INSERT ... SELECT ... ON CONFLICT DO NOTHING RETURNING`. It copies in COPY's
binary format: numbers, times and JSON need no text form written by the
client and parsed by the server (~20-30 us less server CPU and ~35-45 us less
client CPU a stored trace and its context, bench/RESULTS.md session 30).

`InsertNew` (PostgreSQL) inserts rows that may exist already and says which
were new: one single-row `INSERT ... ON CONFLICT DO NOTHING RETURNING key`,
prepared once and run for every row in one pipeline (psycopg 3's
`executemany(returning=True)`). For the span archive's rows (~8 KB of bytes
each) SQLAlchemy's multi-row statement cost the server 120-145 us and the
client ~130 us a row, this 50 and ~35 (bench/RESULTS.md, session 30): the
server no longer parses and plans a new statement of ~560 markers each batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect


class PlainInsert:
    """`INSERT INTO table (every column) VALUES (...)`, compiled once for one dialect."""

    def __init__(self, table: sa.Table, dialect: Dialect) -> None:
        compiled = sa.insert(table).compile(dialect=dialect)
        if not compiled.positional or compiled.positiontup is None:
            raise ValueError(
                f"PlainInsert needs a positional paramstyle; {dialect.name} uses {dialect.paramstyle}"
            )
        self.sql = str(compiled)
        # the dialect's own implementation of each type (SQLite's DATETIME writes a fixed-width
        # string; the generic type would hand sqlite3 a datetime to format its own way)
        processors: dict[str, Callable[[Any], Any] | None] = {
            column.key: column.type.dialect_impl(dialect).bind_processor(dialect) for column in table.columns
        }
        # in the order of the statement's markers
        self._columns = [(name, processors[name]) for name in compiled.positiontup]

    @property
    def columns(self) -> list[str]:
        """Column names in the order of `values`."""
        return [name for name, _ in self._columns]

    def values(self, row: Mapping[str, Any]) -> tuple[Any, ...]:
        """The driver-ready parameters of one row (a mapping with every column)."""
        return tuple(row[name] if process is None else process(row[name]) for name, process in self._columns)

    def execute(self, conn: Connection, rows: Iterable[Mapping[str, Any]]) -> None:
        """Insert `rows` in the connection's transaction; nothing when there are none."""
        parameters = [self.values(row) for row in rows]
        if parameters:
            conn.exec_driver_sql(self.sql, parameters)


@contextmanager
def _driver_cursor(conn: Connection, statement: str) -> Iterator[Any]:
    """A psycopg cursor on the connection's transaction; a driver error leaves it as SQLAlchemy's
    DBAPIError family, the form `Store` translates into StoreUnavailable / InvalidInput for every
    other statement."""
    import psycopg  # the PostgreSQL extra; only a PostgreSQL store builds CopyRows or InsertNew

    try:
        with conn.connection.driver_connection.cursor() as cursor:  # type: ignore[union-attr]
            yield cursor
    except psycopg.Error as exc:
        raise sa.exc.DBAPIError.instance(statement, None, exc, psycopg.Error) from exc


# PostgreSQL's name (as psycopg knows it) of each column type the copied tables use, by the type's
# DDL without its length: binary COPY needs the exact type of every field
_BINARY_TYPES = {
    "TEXT": "text",
    "VARCHAR": "varchar",
    "FLOAT": "float8",  # FLOAT without a precision is double precision in PostgreSQL
    "DOUBLE PRECISION": "float8",
    "BIGINT": "int8",
    "INTEGER": "int4",
    "BOOLEAN": "bool",
    "TIMESTAMP WITH TIME ZONE": "timestamptz",
    "JSON": "json",
    "BYTEA": "bytea",
}


def _binary_type(column: sa.Column[Any], dialect: Dialect) -> str:
    ddl = column.type.compile(dialect=dialect).split("(", 1)[0].strip()
    try:
        return _BINARY_TYPES[ddl]
    except KeyError:
        raise ValueError(
            f"CopyRows has no binary COPY type for {column.table.name}.{column.name} ({ddl})"
        ) from None


class CopyRows:
    """`COPY target (every column of table) FROM STDIN (FORMAT BINARY)` on PostgreSQL through psycopg 3."""

    def __init__(self, table: sa.Table, dialect: Dialect) -> None:
        self._rows = PlainInsert(table, dialect)
        self._columns = ", ".join(dialect.identifier_preparer.quote(name) for name in self._rows.columns)
        self._types = [_binary_type(table.columns[name], dialect) for name in self._rows.columns]

    def copy(self, conn: Connection, target: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Copy `rows` into the table named `target` (this table or one LIKE it), in the connection's
        transaction. Errors are SQLAlchemy's DBAPIError family, as for any statement."""
        statement = f"COPY {target} ({self._columns}) FROM STDIN (FORMAT BINARY)"
        with _driver_cursor(conn, statement) as cursor, cursor.copy(statement) as copy:
            copy.set_types(self._types)
            for row in rows:
                copy.write_row(self._rows.values(row))


class InsertNew:
    """`INSERT INTO table (every column) VALUES (...) ON CONFLICT DO NOTHING RETURNING key` on
    PostgreSQL through psycopg 3, one prepared statement pipelined over the rows."""

    def __init__(self, table: sa.Table, dialect: Dialect, key: Sequence[str]) -> None:
        self._rows = PlainInsert(table, dialect)
        quote = dialect.identifier_preparer.quote
        self.sql = f"{self._rows.sql} ON CONFLICT DO NOTHING RETURNING {', '.join(quote(k) for k in key)}"

    def execute(self, conn: Connection, rows: Iterable[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
        """Insert `rows` in the connection's transaction, skipping each whose key is taken (by a row
        before, or one committed meanwhile); returns the keys of the rows inserted, in row order.
        Errors are SQLAlchemy's DBAPIError family, as for any statement."""
        parameters = [self._rows.values(row) for row in rows]
        if not parameters:
            return []
        inserted: list[tuple[Any, ...]] = []
        with _driver_cursor(conn, self.sql) as cursor:
            cursor.executemany(self.sql, parameters, returning=True)
            while True:  # one result a row: its key, or nothing when the key was taken
                inserted += cursor.fetchall()
                if not cursor.nextset():
                    break
        return inserted
