"""PlainInsert writes exactly the values SQLAlchemy's own insert writes (SQLite, the store's path); so
does InsertNew (PostgreSQL, the span archive's), which also says which rows were new."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from service.store.engine import json_text
from service.store.row_insert import CopyRows, InsertNew, PlainInsert
from service.store.tables import feedback, metadata, trace_contexts, traces

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)  # microsecond 0: formatted differently by sqlite3 itself


def trace_rows() -> list[dict[str, Any]]:
    rows = []
    for n, start in enumerate(
        [
            T0,
            T0 + timedelta(microseconds=1),
            datetime(2026, 3, 1, 14, 0, 0, 250, tzinfo=timezone(timedelta(hours=2))),
            datetime(2026, 3, 1, 9, 30),  # naive: taken as UTC
        ]
    ):
        rows.append(
            {
                "tenant": "acme" if n % 2 else "default",
                "trace_id": f"{n:032x}",
                "app": "support-bot",
                "release": None if n == 0 else "v2",
                "intent": "billing",
                "session_id": "s-1",
                "user_hash": None,
                "start_time": start,
                "total_s": 1.25,
                "embedding_s": None,
                "retrieval_s": 0.125,
                "rerank_s": None,
                "generation_s": 1.0,
                "ttft_s": 0.25,
                "input_tokens": 2**40,
                "output_tokens": 0,
                "cost_usd": 0.000123,
                "unpriced": bool(n % 2),
                "usage_unknown": n == 1,
                "query": "Où est ma facture? ✓",
                "answer": "",
                "top1_score": 0.875,
                "chunk_ids": ["doc-1", "dóc-2"],
                "chunk_scores": [0.875, None],
                "is_regeneration": n == 2,
                "regeneration_source": "reask" if n == 2 else None,
                "partial": False,
                "probe_run_id": None,
                "probe_question_id": None,
                "span_count": 4,
                "source": "otlp",
                "created_at": T0 + timedelta(seconds=n, microseconds=n * 7),
            }
        )
    return rows


def context_rows() -> list[dict[str, Any]]:
    context = {
        "chunks": [{"id": "doc-1", "score": 0.5, "content": 'a "quoted" ✓ text', "metadata": {"page": 3}}],
        "usage": [{"model": "gpt-4o-mini", "cost_usd": None, "input_tokens": 10}],
        "query_embedding": None,
        "k": 5,
    }
    return [{"tenant": "default", "trace_id": f"{n:032x}", "context": context} for n in range(3)]


def feedback_rows() -> list[dict[str, Any]]:
    return [
        {
            "tenant": "default",
            "event_id": f"e{n}",
            "trace_id": f"{n:032x}",
            "app": None,
            "kind": "down",
            "reason": "wrong",
            "text": "nope ✗",
            "time": T0 + timedelta(minutes=n),
            "created_at": T0,
        }
        for n in range(3)
    ]


def engine_at(path: Path) -> sa.Engine:
    engine = sa.create_engine(f"sqlite:///{path}", json_serializer=json_text)
    metadata.create_all(engine)
    return engine


def stored(path: Path, table: sa.Table) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(f"SELECT * FROM {table.name} ORDER BY tenant, 2").fetchall()


@pytest.mark.parametrize(
    ("table", "rows"),
    [(traces, trace_rows()), (trace_contexts, context_rows()), (feedback, feedback_rows())],
    ids=["traces", "trace_contexts", "feedback"],
)
def test_stores_what_sqlalchemy_insert_stores(
    tmp_path: Path, table: sa.Table, rows: list[dict[str, Any]]
) -> None:
    by_sqlalchemy, by_plain = engine_at(tmp_path / "a.db"), engine_at(tmp_path / "b.db")
    with by_sqlalchemy.begin() as conn:
        conn.execute(sa.insert(table), rows)
    with by_plain.begin() as conn:
        PlainInsert(table, by_plain.dialect).execute(conn, rows)
    expected = stored(tmp_path / "a.db", table)
    assert len(expected) == len(rows)
    assert stored(tmp_path / "b.db", table) == expected
    # and it reads back through the table's types as the same values
    with by_plain.connect() as conn:
        back = [
            dict(r) for r in conn.execute(sa.select(table).order_by(*table.primary_key.columns)).mappings()
        ]
    with by_sqlalchemy.connect() as conn:
        assert back == [
            dict(r) for r in conn.execute(sa.select(table).order_by(*table.primary_key.columns)).mappings()
        ]
    by_sqlalchemy.dispose()
    by_plain.dispose()


def test_datetimes_keep_fixed_width_text_so_string_order_is_time_order(tmp_path: Path) -> None:
    engine = engine_at(tmp_path / "a.db")
    with engine.begin() as conn:
        PlainInsert(traces, engine.dialect).execute(conn, trace_rows())
    with sqlite3.connect(tmp_path / "a.db") as conn:
        texts = [t for (t,) in conn.execute("SELECT start_time FROM traces")]
    assert {len(t) for t in texts} == {len("2026-03-01 12:00:00.000000")}
    assert "2026-03-01 12:00:00.000000" in texts  # the +02:00 value is stored as 12:00:00.000250 UTC
    assert "2026-03-01 12:00:00.000250" in texts
    engine.dispose()


def test_a_row_without_a_column_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    engine = engine_at(tmp_path / "a.db")
    rows = trace_rows()
    del rows[-1]["created_at"]
    with pytest.raises(KeyError, match="created_at"), engine.begin() as conn:
        PlainInsert(traces, engine.dialect).execute(conn, rows)
    assert stored(tmp_path / "a.db", traces) == []
    engine.dispose()


def test_nothing_to_insert_runs_no_statement(tmp_path: Path) -> None:
    engine = engine_at(tmp_path / "a.db")
    statements: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    with engine.begin() as conn:
        PlainInsert(traces, engine.dialect).execute(conn, iter([]))
    assert not any(s.startswith("INSERT") for s in statements)
    engine.dispose()


def test_refuses_a_dialect_with_named_parameters() -> None:
    with pytest.raises(ValueError, match="positional"):
        PlainInsert(traces, postgresql.psycopg.dialect(paramstyle="pyformat"))


@pytest.mark.postgres
def test_insert_new_stores_what_sqlalchemy_stores_and_returns_only_the_new_keys(
    postgres_engines: Callable[..., sa.Engine],
) -> None:
    """`InsertNew` on PostgreSQL: the rows whose key is free are written as SQLAlchemy's own insert
    writes them; those whose key is taken are skipped, and only the new keys come back, in row order."""
    engine = postgres_engines()
    metadata.create_all(engine)
    rows = trace_rows()
    with engine.begin() as conn:
        conn.execute(sa.insert(traces), [rows[1]])  # one key taken before
    insert_new = InsertNew(traces, engine.dialect, ["tenant", "trace_id"])
    changed = {**rows[1], "answer": "not written: the key is taken"}
    with engine.begin() as conn:
        keys = insert_new.execute(conn, [rows[3], changed, rows[0], rows[2]])
        assert insert_new.execute(conn, []) == []
    assert keys == [(r["tenant"], r["trace_id"]) for r in (rows[3], rows[0], rows[2])]
    with engine.connect() as conn:
        written = [dict(r) for r in conn.execute(sa.select(traces).order_by(traces.c.trace_id)).mappings()]
        conn.execute(sa.delete(traces))
        conn.execute(sa.insert(traces), rows)
        expected = [dict(r) for r in conn.execute(sa.select(traces).order_by(traces.c.trace_id)).mappings()]
        conn.rollback()
    assert written == expected  # every type converted as SQLAlchemy converts it; row 1 untouched
    # a driver error surfaces as SQLAlchemy's, which the stores translate like any statement's
    with pytest.raises(sa.exc.DBAPIError), engine.begin() as conn:
        insert_new.execute(conn, [{**rows[0], "trace_id": "x" * 40}])  # over VARCHAR(32)


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("table", "rows"),
    [(traces, trace_rows()), (trace_contexts, context_rows())],
    ids=["traces", "trace_contexts"],
)
def test_copy_rows_stores_what_sqlalchemy_stores(
    postgres_engines: Callable[..., sa.Engine], table: sa.Table, rows: list[dict[str, Any]]
) -> None:
    """`CopyRows` (binary COPY, PostgreSQL): every column type the store copies, odd values included
    (None, 2**40, a naive time, non-ASCII text, nested JSON), reads back as SQLAlchemy's insert wrote it."""
    engine = postgres_engines()
    metadata.create_all(engine)
    with engine.begin() as conn:
        CopyRows(table, engine.dialect).copy(conn, table.name, rows)
    order = list(table.primary_key.columns)
    with engine.connect() as conn:
        copied = [dict(r) for r in conn.execute(sa.select(table).order_by(*order)).mappings()]
        conn.execute(sa.delete(table))
        conn.execute(sa.insert(table), rows)
        expected = [dict(r) for r in conn.execute(sa.select(table).order_by(*order)).mappings()]
        conn.rollback()
    assert len(copied) == len(rows) and copied == expected


def test_copy_rows_refuses_a_column_type_it_has_no_binary_form_for() -> None:
    odd = sa.Table(
        "odd", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True), sa.Column("at", sa.Time)
    )
    with pytest.raises(ValueError, match=r"odd\.at \(TIME"):
        CopyRows(odd, postgresql.psycopg.dialect(paramstyle="format"))
