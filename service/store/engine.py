"""The SQLAlchemy engines ragmon's stores run on, and their transactions.

SQLite: a file in WAL mode with synchronous=NORMAL (`Store.sync_to_disk` fsyncs
what an acknowledgement needs), checkpoints every `SQLITE_CHECKPOINT_PAGES`, and
pysqlite's implicit BEGIN replaced by ours: `transaction(writes=True)` opens with
BEGIN IMMEDIATE, so a read-then-write queues for the write lock instead of
failing to upgrade its read lock. Its busy timeout is the statement timeout.
PostgreSQL (psycopg): statement and lock timeouts, a connect timeout, a ping
before a pooled connection that sat idle is used (`PING_AFTER_IDLE_S`), and
values too large for a row page compressed with lz4 where the server has it
(`TOAST_COMPRESSION`), and an `application_name` naming the ragmon process in
`pg_stat_activity`. Both write JSON columns with `json_text`.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import StaticPool

__all__ = [
    "PING_AFTER_IDLE_S",
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
# A pooled PostgreSQL connection idle at least this long is pinged before use. SQLAlchemy's
# `pool_pre_ping` pings on every checkout: a round trip before every statement batch, 4-5 % of a
# sinks worker's samples (bench/RESULTS.md). A connection used within the last second was
# answering then; should the server have restarted since, its first statement fails, the pool
# drops every connection older than the failure, and the caller's retry gets a new one.
PING_AFTER_IDLE_S = 1.0
_IDLE_SINCE = "ragmon_idle_since"  # pool record info: monotonic time of the last checkin
# How PostgreSQL compresses a value too large for its row page (TOAST: over ~2 KB). Most of a
# stored trace is such values: the spans kept for late spans (~8 KB a trace of wire bytes), the
# context's chunk texts. The server's default, pglz, took ~110 us of server CPU per 8 KB span
# blob and was 43 % of PostgreSQL's statement time in bench/scale; lz4 (PostgreSQL 14+, where
# the server is built with it) writes the same rows 3x faster at about the same size
# (bench/RESULTS.md). A server without it keeps pglz: nothing else changes.
TOAST_COMPRESSION = "lz4"

log = logging.getLogger(__name__)


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
    ping_after_idle_s: float = PING_AFTER_IDLE_S,
    toast_compression: str = TOAST_COMPRESSION,
    application_name: str = "ragmon",
) -> Engine:
    """The engine of the PostgreSQL database at `url` (psycopg), set up as the module docstring says.
    Server options given in the URL (`?options=-csearch_path%3Dx`) are kept; ours come last and win.
    An `application_name` in the URL wins over `application_name`."""
    timeout_ms = max(1, round(statement_timeout_s * 1000))
    given = url.query.get("options", "")
    given = " ".join(given) if isinstance(given, tuple) else given
    options = f"-c statement_timeout={timeout_ms} -c lock_timeout={timeout_ms} -c TimeZone=UTC"
    engine = sa.create_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_timeout=pool_timeout_s,
        json_serializer=json_text,
        # psycopg re-parses every long multi-row INSERT; positional markers parse faster than named ones.
        paramstyle="format",
        connect_args={
            "connect_timeout": max(2, math.ceil(connect_timeout_s)),
            "options": f"{given} {options}".strip(),
            "application_name": url.query.get("application_name", application_name),
        },
    )
    _ping_when_idle(engine, ping_after_idle_s)
    _compress_with(engine, toast_compression)
    return engine


def _compress_with(engine: Engine, method: str) -> None:
    """Each new connection compresses large values with `method` (`default_toast_compression`, a
    setting of the session: it applies to every column left at the default, temporary staging
    tables included). A server that refuses it (older than 14, or built without the method) keeps
    its default; said once in the log."""
    said = False

    @sa.event.listens_for(engine, "connect")
    def _connected(dbapi_connection: Any, record: Any) -> None:
        nonlocal said
        try:
            with dbapi_connection.cursor() as cursor:
                cursor.execute(f"SET default_toast_compression = {method}")
            dbapi_connection.commit()
        except engine.dialect.loaded_dbapi.Error as exc:  # a server that does not know the method
            dbapi_connection.rollback()
            if not said:
                said = True
                log.info(
                    "PostgreSQL keeps its default compression of large values (%s refused: %s)", method, exc
                )


def _ping_when_idle(engine: Engine, idle_s: float) -> None:
    """A restarted server leaves dead pooled connections: ping one that sat idle `idle_s` or more
    before handing it out. A failed ping makes the pool discard it and connect anew (SQLAlchemy's
    `DisconnectionError` protocol, up to three tries)."""

    @sa.event.listens_for(engine, "checkin")
    def _checked_in(dbapi_connection: Any, record: Any) -> None:
        record.info[_IDLE_SINCE] = time.monotonic()

    @sa.event.listens_for(engine, "checkout")
    def _checked_out(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        idle_since = record.info.get(_IDLE_SINCE)
        if idle_since is None or time.monotonic() - idle_since < idle_s:
            return  # just connected, or in use within `idle_s`
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise sa.exc.DisconnectionError("a pooled connection that sat idle failed its ping") from exc
