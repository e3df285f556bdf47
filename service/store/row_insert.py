"""`PlainInsert`: new rows into one table through the driver's `executemany`.

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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
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

    def values(self, row: Mapping[str, Any]) -> tuple[Any, ...]:
        """The driver-ready parameters of one row (a mapping with every column)."""
        return tuple(row[name] if process is None else process(row[name]) for name, process in self._columns)

    def execute(self, conn: Connection, rows: Iterable[Mapping[str, Any]]) -> None:
        """Insert `rows` in the connection's transaction; nothing when there are none."""
        parameters = [self.values(row) for row in rows]
        if parameters:
            conn.exec_driver_sql(self.sql, parameters)
