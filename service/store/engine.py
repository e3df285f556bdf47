"""The SQLAlchemy engines ragmon's stores run on, and their transactions.

SQLite: a file in WAL mode with synchronous=NORMAL (`Store.sync_to_disk` fsyncs
what an acknowledgement needs), checkpoints every `SQLITE_CHECKPOINT_PAGES`, and
pysqlite's implicit BEGIN replaced by ours: `transaction(writes=True)` opens with
BEGIN IMMEDIATE, so a read-then-write queues for the write lock instead of
failing to upgrade its read lock. Its busy timeout is the statement timeout.
PostgreSQL (psycopg): statement and lock timeouts, a connect timeout, and a ping
before a pooled connection is used. Both write JSON columns with `json_text`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import StaticPool

__all__ = [
    "SQLITE_CACHED_STATEMENTS",
    "SQLITE_CHECKPOINT_PAGES",
    "WRITES_OPTION",
    "json_text",
    "postgres_engine",
    "sqlite_engine",
    "transaction",
]

# Prepared statements each pooled SQLite connection keeps (Python's default: 128). A batch
# insert's multi-row VALUES statement differs with the batch's length and IN lists with their
# size, so the cache filled with large one-off programs: the server process grew ~25 MiB over
# 200k traces (bench/ingest --long); with 16 it stays flat and throughput is unchanged.
SQLITE_CACHED_STATEMENTS = 16
# WAL pages between automatic checkpoints (~40 MB of 4 KiB pages; SQLite's default is 1,000)
SQLITE_CHECKPOINT_PAGES = 10_000
# Marks a connection whose transaction will write: on SQLite it takes the
# write lock at BEGIN, so a later read-then-write cannot deadlock on upgrade.
WRITES_OPTION = "ragmon_writes"  # execution option: open the SQLite transaction with BEGIN IMMEDIATE


@contextmanager
def transaction(engine: Engine, *, writes: bool = False) -> Iterator[Connection]:
    """One transaction on `engine`. With `writes`, SQLite opens it with BEGIN IMMEDIATE (through the
    begin hook of `sqlite_engine`), so a read-then-write queues for the write lock instead of
    failing to upgrade its read lock while another connection writes."""
    with engine.connect() as conn:
        if writes:
            conn.execution_options(**{WRITES_OPTION: True})
        with conn.begin():
            yield conn


# For what orjson refuses (integers over 64 bits, non-string keys). One encoder object:
# `json.dumps` with options builds a new one per call.
_STDLIB_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


def json_text(value: Any) -> str:
    """The text of a JSON column value. orjson encodes a trace's context ~3x faster than the
    stdlib (46 -> 15 us a trace; bench/RESULTS.md, ingest); it writes NaN and infinities as
    null where the stdlib encoder would refuse the whole row."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return _STDLIB_JSON(value)


def sqlite_engine(
    url: sa.URL, *, pool_size: int, max_overflow: int, pool_timeout_s: float, statement_timeout_s: float
) -> Engine:
    """The engine of a SQLite database at `url` (a private one in memory for `sqlite://`), set up as
    the module docstring says."""
    in_memory = url.database in (None, "", ":memory:")
    options: dict[str, Any] = (
        {"poolclass": StaticPool}
        if in_memory
        else {"pool_size": pool_size, "max_overflow": max_overflow, "pool_timeout": pool_timeout_s}
    )
    engine = sa.create_engine(
        url,
        # `timeout` is SQLite's busy timeout: how long a writer waits for the lock.
        connect_args={
            "timeout": statement_timeout_s,
            "check_same_thread": False,
            "cached_statements": SQLITE_CACHED_STATEMENTS,
        },
        json_serializer=json_text,
        **options,
    )

    @sa.event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        # pysqlite's own implicit BEGIN is switched off; `_begin` issues ours.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        # NORMAL: a commit reaches the WAL file without an fsync; what an acknowledgement
        # needs to survive power loss is fsynced by `sync_to_disk` before the ingest log lets
        # go of it. Checkpoints every SQLITE_CHECKPOINT_PAGES, not SQLite's 1,000: index pages
        # rewritten by every batch are copied back once per checkpoint (bench/RESULTS.md).
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA wal_autocheckpoint={SQLITE_CHECKPOINT_PAGES}")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        writes = connection.get_execution_options().get(WRITES_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if writes else "BEGIN")

    return engine


def postgres_engine(
    url: sa.URL,
    *,
    pool_size: int,
    max_overflow: int,
    pool_timeout_s: float,
    connect_timeout_s: float,
    statement_timeout_s: float,
) -> Engine:
    """The engine of the PostgreSQL database at `url` (psycopg), set up as the module docstring says.
    Server options given in the URL (`?options=-csearch_path%3Dx`) are kept; ours come last and win."""
    timeout_ms = max(1, round(statement_timeout_s * 1000))
    given = url.query.get("options", "")
    given = " ".join(given) if isinstance(given, tuple) else given
    options = f"-c statement_timeout={timeout_ms} -c lock_timeout={timeout_ms} -c TimeZone=UTC"
    return sa.create_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_timeout=pool_timeout_s,
        # A restarted server leaves dead pooled connections; ping before use.
        pool_pre_ping=True,
        json_serializer=json_text,
        # psycopg re-parses every long multi-row INSERT; positional markers parse faster than named ones.
        paramstyle="format",
        connect_args={
            "connect_timeout": max(2, math.ceil(connect_timeout_s)),
            "options": f"{given} {options}".strip(),
        },
    )
