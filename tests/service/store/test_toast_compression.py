"""PostgreSQL compresses a stored trace's large values with lz4 (`TOAST_COMPRESSION`, store/engine.py),
and a server that refuses a method keeps its default and stays usable.

Against a real PostgreSQL server (`DATABASE_URL`, skipped without it). pglz, the server's default,
was 43 % of PostgreSQL's statement time in bench/scale (bench/RESULTS.md)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from service.model import RagTrace
from service.store.engine import TOAST_COMPRESSION
from service.store.trace_store import Store

pytestmark = pytest.mark.postgres


def _server_has(url: str, method: str) -> bool:
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            values = conn.execute(
                sa.text("SELECT enumvals FROM pg_settings WHERE name = 'default_toast_compression'")
            ).scalar()
        return method in (values or [])
    finally:
        engine.dispose()


def _large_trace() -> RagTrace:
    chunks = [
        {"id": f"doc-{i}", "rank": i + 1, "score": 0.9, "content": f"refund policy paragraph {i}. " * 60}
        for i in range(4)
    ]
    return RagTrace.model_validate(
        {
            "trace_id": "ab" * 16,
            "tenant": "t1",
            "app": "shop",
            "start_time": datetime(2026, 1, 5, tzinfo=UTC),
            "query": "how long do refunds take?",
            "answer": "five days",
            "retrieval": {"chunks": chunks},
        }
    )


def test_a_stored_traces_large_values_are_compressed_with_lz4(postgres_url: str) -> None:
    if not _server_has(postgres_url, TOAST_COMPRESSION):
        pytest.skip(f"this PostgreSQL server has no {TOAST_COMPRESSION} compression (built without it)")
    store = Store(postgres_url, statement_timeout_s=10.0, connect_timeout_s=5.0)
    try:
        store.create_schema()
        store.store_traces([_large_trace()])
        with store.engine.connect() as conn:
            assert conn.execute(sa.text("SHOW default_toast_compression")).scalar() == TOAST_COMPRESSION
            method, size = conn.execute(
                sa.text("SELECT pg_column_compression(context), pg_column_size(context) FROM trace_contexts")
            ).one()
        assert method == TOAST_COMPRESSION  # compressed, and by lz4 rather than the server's pglz
        assert size < 3000  # the ~6 KB of chunk text, repetitive here, stored compressed
        assert store.get_trace("t1", "ab" * 16)["context"]["chunks"][3]["content"].startswith("refund")  # type: ignore[index]
    finally:
        store.close()


def test_a_server_that_refuses_the_method_keeps_its_default_and_works(
    postgres_engines: Callable[..., Engine], caplog: pytest.LogCaptureFixture
) -> None:
    # PostgreSQL's TOAST knows pglz and lz4 only: zstd is refused by every version to date
    engine = postgres_engines(toast_compression="zstd")
    # two connections, one message
    with (
        caplog.at_level(logging.INFO, logger="service.store.engine"),
        engine.connect() as first,
        engine.connect() as second,
    ):
        for conn in (first, second):
            assert conn.execute(sa.text("SHOW default_toast_compression")).scalar() == "pglz"
            assert conn.execute(sa.text("SELECT 1")).scalar() == 1
    said = [r.getMessage() for r in caplog.records if "keeps its default compression" in r.getMessage()]
    assert len(said) == 1 and "zstd" in said[0]
