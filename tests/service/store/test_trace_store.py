"""Tests for `service/store/trace_store.py` (and the row mapping in `service/store/tables.py`).

Every test that takes `store` runs on SQLite and on PostgreSQL (the latter
only with DATABASE_URL set; see conftest.py).
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from service.errors import InvalidInput, StoreUnavailable
from service.model import Chunk, Feedback, ModelUsage, QueryEmbedding, RagTrace, Retrieval, Timings
from service.store.rows import feedback_row
from service.store.store_sink import StoreSink
from service.store.tables import SCHEMA_VERSION, feedback, trace_contexts, traces
from service.store.trace_query import MAX_PAGE_SIZE, TraceFilters, decode_cursor, encode_cursor
from service.store.trace_store import Store

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def trace_id(n: int) -> str:
    return f"{n:032x}"


def make_trace(n: int, **fields: Any) -> RagTrace:
    values: dict[str, Any] = {
        "trace_id": trace_id(n),
        "app": "support-bot",
        "start_time": T0 + timedelta(seconds=n),
        "query": f"question {n}",
        "answer": f"answer {n}",
        "retrieval": Retrieval(
            chunks=tuple(
                Chunk(id=f"doc-{n}-{r}", rank=r, score=0.9 - r / 10, content=f"text {r}") for r in range(3)
            )
        ),
        "usage": (ModelUsage(model="gpt-4o-mini", input_tokens=100 + n, output_tokens=20, cost_usd=0.001),),
        "timings": Timings(total_s=1.5, retrieval_s=0.2, generation_s=1.1),
    }
    values.update(fields)
    return RagTrace(**values)


def make_feedback(event: str, n: int, kind: str = "up", **fields: Any) -> Feedback:
    values: dict[str, Any] = {"event_id": event, "trace_id": trace_id(n), "kind": kind, "time": T0}
    values.update(fields)
    return Feedback(**values)


@pytest.fixture
def raw(store_url: str, store: Store) -> Iterator[sa.Engine]:
    """A second engine on the store's database, for looking at (and tampering with) tables directly."""
    engine = sa.create_engine(store_url, poolclass=NullPool)
    yield engine
    engine.dispose()


def row_count(engine: sa.Engine, table: sa.Table) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def all_pages(store: Store, tenant: str, limit: int, **filters: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(10_000):
        page, cursor = store.list_traces(tenant, limit=limit, cursor=cursor, **filters)
        assert len(page) <= limit
        items.extend(page)
        if cursor is None:
            return items
    raise AssertionError("pagination did not terminate")


# --- schema ------------------------------------------------------------------------------------------


def test_create_schema_is_idempotent_and_records_its_version(store_url: str) -> None:
    store = Store(store_url)
    try:
        assert store.schema_version() is None
        store.create_schema()
        store.insert_traces([make_trace(1)])
        store.create_schema()
        assert store.schema_version() == SCHEMA_VERSION
        assert store.count_traces("default") == 1
    finally:
        store.close()


def test_create_schema_adds_usage_unknown_to_a_schema_1_database(store_url: str) -> None:
    """A database made by schema 1 (no `traces.usage_unknown`) gets the column, its old rows false, and
    then stores a trace whose token counts are unknown."""
    store = Store(store_url)
    engine = sa.create_engine(store_url, poolclass=NullPool)
    try:
        store.create_schema()
        store.insert_traces([make_trace(1)])
        with engine.begin() as conn:  # the schema-1 table: the same but for the column schema 2 added
            conn.execute(sa.text("ALTER TABLE traces DROP COLUMN usage_unknown"))
        store.close()
        store = Store(store_url)
        store.create_schema()
        assert store.schema_version() == SCHEMA_VERSION == 2
        old = store.get_trace("default", trace_id(1))
        assert old is not None and (old["usage_unknown"], old["input_tokens"]) == (False, 101)
        unknown = make_trace(
            2,
            usage=(
                ModelUsage(
                    model="gpt-4o-mini", input_tokens=None, output_tokens=None, cost_source="unknown_usage"
                ),
            ),
        )
        assert store.insert_traces([unknown]) == [trace_id(2)]
        record = store.get_trace("default", trace_id(2))
        assert record is not None
        assert (record["input_tokens"], record["output_tokens"], record["cost_usd"]) == (None, None, None)
        assert (record["usage_unknown"], record["unpriced"]) == (True, False)
        assert record["context"]["usage"][0]["input_tokens"] is None
        with engine.connect() as conn:  # the row keeps the known part: none
            stored = conn.execute(sa.select(traces.c.input_tokens).where(traces.c.trace_id == trace_id(2)))
            assert stored.scalar_one() == 0
    finally:
        store.close()
        engine.dispose()


# --- writes: idempotency -----------------------------------------------------------------------------


def test_same_batch_twice_is_stored_once_and_second_call_returns_nothing(
    store: Store, raw: sa.Engine
) -> None:
    batch = [make_trace(n) for n in range(20)]
    assert store.insert_traces(batch) == [t.trace_id for t in batch]
    assert store.insert_traces(batch) == []
    assert row_count(raw, traces) == 20
    assert row_count(raw, trace_contexts) == 20


def test_mixed_batch_returns_only_new_ids_in_batch_order(store: Store) -> None:
    store.insert_traces([make_trace(n) for n in range(0, 10, 2)])
    mixed = [make_trace(n) for n in (9, 0, 7, 2, 5)]
    assert store.insert_traces(mixed) == [trace_id(9), trace_id(7), trace_id(5)]
    assert store.count_traces("default") == 8


def test_redelivery_with_different_content_keeps_the_first_version(store: Store) -> None:
    store.insert_traces([make_trace(1, answer="first")])
    assert store.insert_traces([make_trace(1, answer="second", partial=True)]) == []
    record = store.get_trace("default", trace_id(1))
    assert record is not None
    assert record["answer"] == "first"
    assert record["flags"]["partial"] is False


def test_duplicates_inside_one_batch_count_once(store: Store, raw: sa.Engine) -> None:
    batch = [make_trace(3), make_trace(4), make_trace(3, answer="again")]
    assert store.insert_traces(batch) == [trace_id(3), trace_id(4)]
    assert row_count(raw, traces) == 2


def test_empty_batches_do_nothing(store: Store) -> None:
    assert store.insert_traces([]) == []
    assert store.insert_feedback([]) == []
    assert store.count_traces("default") == 0


def test_concurrent_writers_see_each_trace_as_new_exactly_once(store: Store, raw: sa.Engine) -> None:
    rng = random.Random(7)
    batches = [[make_trace(n) for n in rng.sample(range(300), 100)] for _ in range(12)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(store.insert_traces, batches))
    reported = [tid for result in results for tid in result]
    expected = {t.trace_id for batch in batches for t in batch}
    assert len(reported) == len(set(reported))
    assert set(reported) == expected
    assert row_count(raw, traces) == len(expected)


def test_large_multi_tenant_batches_report_exactly_the_new_traces(store: Store, raw: sa.Engine) -> None:
    # more keys per tenant than one IN list carries, two tenants, half of them stored before
    stored = [make_trace(n, tenant=t) for t in ("a", "b") for n in range(0, 1300, 2)]
    for start in range(0, len(stored), 400):
        store.insert_traces(stored[start : start + 400])
    batch = [make_trace(n, tenant=t) for n in range(1300) for t in ("b", "a")]
    new = store.insert_traces(batch)
    assert new == [t.trace_id for t in batch if int(t.trace_id, 16) % 2]
    assert row_count(raw, traces) == row_count(raw, trace_contexts) == 2600


def test_ingest_lookups_use_the_primary_key(store: Store, raw: sa.Engine) -> None:
    store.insert_traces([make_trace(n) for n in range(50)])
    store.insert_feedback([make_feedback("e", 60, "regenerate")])
    executed: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        executed.append((statement, parameters))

    sa.event.listen(store.engine, "before_cursor_execute", record)
    try:
        assert store.insert_traces([make_trace(n) for n in range(40, 70)]) == [
            trace_id(n) for n in range(50, 70)
        ]
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", record)
    assert store.get_trace("default", trace_id(60))["flags"]["is_regeneration"] is True  # type: ignore[index]
    lookups = [e for e in executed if e[0].lstrip().upper().startswith(("SELECT", "UPDATE"))]
    assert lookups, executed
    if raw.dialect.name == "sqlite":
        # these run for every batch of new traces: a scan would grow with the table
        with raw.connect() as conn:
            for statement, parameters in lookups:
                plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).all()
                assert not any(row[-1].startswith("SCAN traces") for row in plan), (statement, plan)


def test_feedback_is_idempotent_by_event_id(store: Store, raw: sa.Engine) -> None:
    batch = [make_feedback("e1", 1), make_feedback("e2", 1, "down"), make_feedback("e1", 1, "down")]
    assert store.insert_feedback(batch) == ["e1", "e2"]
    assert store.insert_feedback(batch) == []
    assert row_count(raw, feedback) == 2


# --- reads: the record -------------------------------------------------------------------------------


def test_record_round_trip_is_complete_and_json_ready(store: Store) -> None:
    chunks = (Chunk(id="a", rank=0, score=0.8, content="alpha"), Chunk(id="b", rank=1, score=0.5))
    trace = make_trace(
        5,
        tenant="acme",
        release="v2",
        intent="billing",
        session_id="s-1",
        user_hash="f" * 64,
        start_time=datetime(2025, 3, 1, 13, 30, tzinfo=UTC) + timedelta(microseconds=123456),
        query_embedding=QueryEmbedding(model="text-embedding-3-small", vector=(0.1, 0.2, 0.3)),
        retrieval=Retrieval(
            retriever="pgvector",
            k=2,
            chunks=chunks,
            filter="lang = 'en'",
            excluded_ids=("z",),
            reranker_input=chunks,
            reranker_output=(Chunk(id="b", rank=0, score=0.99, metadata={"source": "faq"}),),
        ),
        cited_chunk_ids=("b",),
        timings=Timings(
            total_s=2.0, embedding_s=0.1, retrieval_s=0.3, rerank_s=0.2, generation_s=1.3, ttft_s=0.4
        ),
        usage=(
            ModelUsage(model="gpt-4o", input_tokens=900, output_tokens=150, cost_usd=0.01, cost_source="app"),
            ModelUsage(model="in-house", input_tokens=10, output_tokens=0),
        ),
        probe_run_id="run-1",
        probe_question_id="q-7",
        span_count=6,
        source="json",
    )
    assert store.insert_traces([trace]) == [trace.trace_id]
    record = store.get_trace("acme", trace.trace_id)
    assert record is not None
    json.dumps(record, allow_nan=False)
    assert record["tenant"] == "acme"
    assert record["release"] == "v2"
    assert record["intent"] == "billing"
    assert record["session_id"] == "s-1"
    assert record["user_hash"] == "f" * 64
    assert datetime.fromisoformat(record["start_time"]) == trace.start_time
    assert record["timings"] == trace.timings.model_dump()
    assert (record["input_tokens"], record["output_tokens"]) == (910, 150)
    assert record["cost_usd"] == pytest.approx(0.01)
    assert record["unpriced"] is True
    assert record["top1_score"] == pytest.approx(0.8)
    assert record["chunk_ids"] == ["a", "b"]
    assert record["chunk_scores"] == pytest.approx([0.8, 0.5])
    assert record["flags"] == {
        "is_regeneration": False,
        "regeneration_source": None,
        "partial": False,
        "probe_run_id": "run-1",
        "probe_question_id": "q-7",
    }
    assert (record["span_count"], record["source"]) == (6, "json")
    assert record["feedback"] == []
    context = record["context"]
    assert context["retriever"] == "pgvector"
    assert context["k"] == 2
    assert context["filter"] == "lang = 'en'"
    assert context["excluded_ids"] == ["z"]
    assert [c["content"] for c in context["chunks"]] == ["alpha", None]
    assert [c["id"] for c in context["reranker_input"]] == ["a", "b"]
    assert context["reranker_output"][0]["metadata"] == {"source": "faq"}
    assert context["cited_chunk_ids"] == ["b"]
    assert context["query_embedding"] == {"model": "text-embedding-3-small", "dim": 3}
    assert [u["model"] for u in context["usage"]] == ["gpt-4o", "in-house"]
    assert context["usage"][1]["cost_source"] == "unpriced"


def test_timezones_are_normalized_to_utc(store: Store) -> None:
    plus_two = datetime(2025, 3, 1, 14, 0, tzinfo=UTC).astimezone(ZoneInfo("Europe/Berlin"))
    naive = datetime(2025, 3, 1, 9, 0)
    store.insert_traces([make_trace(1, start_time=plus_two), make_trace(2, start_time=naive)])
    first, second = store.get_trace("default", trace_id(1)), store.get_trace("default", trace_id(2))
    assert first is not None and second is not None
    assert datetime.fromisoformat(first["start_time"]) == plus_two
    assert first["start_time"].endswith("+00:00")
    assert datetime.fromisoformat(second["start_time"]) == naive.replace(tzinfo=UTC)
    assert store.count_traces("default", since=datetime(2025, 3, 1, 13, 59, tzinfo=UTC)) == 1


def test_unicode_and_huge_text_survive(store: Store) -> None:
    mixed = "naïve café — 日本語の質問 — مرحبا — 🧪👩🏽‍🔬 — e\u0301 — \u200b\t\n\r"
    huge = ("lorem ipsum 🦜 " * 400_000)[:5_000_000]
    trace = make_trace(
        1,
        app="app-ü",
        query=mixed,
        answer=huge,
        retrieval=Retrieval(chunks=(Chunk(id="片-1", rank=0, score=0.5, content=huge[:1_000_000] + mixed),)),
    )
    store.insert_traces([trace])
    record = store.get_trace("default", trace.trace_id)
    assert record is not None
    assert record["query"] == mixed
    assert record["answer"] == huge
    assert record["app"] == "app-ü"
    assert record["chunk_ids"] == ["片-1"]
    assert record["context"]["chunks"][0]["content"] == huge[:1_000_000] + mixed
    assert store.count_traces("default", app="app-ü") == 1


def test_text_no_database_can_hold_is_stored_the_same_everywhere(store: Store) -> None:
    trace = make_trace(
        1,
        query="before\x00after",
        answer="lone \ud800 surrogate",
        retrieval=Retrieval(chunks=(Chunk(id="c\x00", rank=0, score=float("nan"), content="x\x00"),)),
    )
    assert store.insert_traces([trace]) == [trace.trace_id]
    record = store.get_trace("default", trace.trace_id)
    assert record is not None
    json.dumps(record, allow_nan=False)
    assert record["query"] == "before\ufffdafter"
    assert record["answer"] == "lone ? surrogate"
    assert record["chunk_ids"] == ["c\ufffd"]
    assert record["chunk_scores"] == [None]
    assert record["top1_score"] is None
    assert record["context"]["chunks"][0]["content"] == "x\ufffd"


# --- feedback and regeneration -----------------------------------------------------------------------


def test_feedback_before_its_trace_is_joined_on_read(store: Store) -> None:
    events = [
        make_feedback(
            "late", 1, "down", reason="wrong", text="not what I asked", time=T0 + timedelta(minutes=2)
        ),
        make_feedback("early", 1, "up", time=T0 + timedelta(minutes=1)),
    ]
    assert store.insert_feedback(events) == ["late", "early"]
    assert store.get_trace("default", trace_id(1)) is None
    store.insert_traces([make_trace(1)])
    record = store.get_trace("default", trace_id(1))
    assert record is not None
    assert [f["event_id"] for f in record["feedback"]] == ["early", "late"]
    assert record["feedback"][1]["reason"] == "wrong"
    assert record["feedback"][1]["text"] == "not what I asked"
    assert record["flags"]["is_regeneration"] is False


@pytest.mark.parametrize("feedback_first", [True, False])
def test_regenerate_feedback_marks_the_trace_and_its_row(
    store: Store, raw: sa.Engine, feedback_first: bool
) -> None:
    def give_feedback() -> None:
        store.insert_feedback([make_feedback("r1", 1, "regenerate")])

    if feedback_first:
        give_feedback()
    store.insert_traces([make_trace(1), make_trace(2)])
    if not feedback_first:
        give_feedback()
    record = store.get_trace("default", trace_id(1))
    assert record is not None
    assert record["flags"]["is_regeneration"] is True
    assert record["flags"]["regeneration_source"] == "feedback"
    with raw.connect() as conn:
        flags = {
            tid: bool(flag)
            for tid, flag in conn.execute(sa.select(traces.c.trace_id, traces.c.is_regeneration))
        }
    assert flags == {trace_id(1): True, trace_id(2): False}
    assert [i["trace_id"] for i in store.list_traces("default", regeneration=True)[0]] == [trace_id(1)]


def test_regenerate_feedback_keeps_the_apps_own_source(store: Store) -> None:
    store.insert_traces([make_trace(1, is_regeneration=True, regeneration_source="attribute")])
    store.insert_feedback([make_feedback("r1", 1, "regenerate")])
    record = store.get_trace("default", trace_id(1))
    assert record is not None
    assert record["flags"]["regeneration_source"] == "attribute"


def test_regenerate_feedback_missed_by_the_row_still_counts_on_read(store: Store, raw: sa.Engine) -> None:
    # What two concurrent transactions can leave behind: the feedback row
    # exists but the trace row was never flagged.
    store.insert_traces([make_trace(1), make_trace(2)])
    with raw.begin() as conn:
        conn.execute(sa.insert(feedback), [feedback_row(make_feedback("r1", 1, "regenerate"), created_at=T0)])
    items, _ = store.list_traces("default")
    flags = {i["trace_id"]: i["flags"]["is_regeneration"] for i in items}
    assert flags == {trace_id(1): True, trace_id(2): False}
    assert store.count_traces("default", regeneration=True) == 1
    assert store.count_traces("default", regeneration=False) == 1
    record = store.get_trace("default", trace_id(1))
    assert record is not None and record["flags"]["regeneration_source"] == "feedback"


def test_trace_labels_name_app_and_intent_of_stored_traces_only(store: Store) -> None:
    store.insert_traces([make_trace(1, app="chat", intent="billing"), make_trace(2, tenant="b", app="faq")])
    keys = {("default", trace_id(1)), ("default", trace_id(2)), ("default", trace_id(3))}
    assert store.trace_labels(keys) == {trace_id(1): ("chat", "billing")}
    assert store.trace_labels({("b", trace_id(2))}) == {trace_id(2): ("faq", None)}
    assert store.trace_labels(set()) == {}


# --- tenants -----------------------------------------------------------------------------------------


def test_tenants_are_isolated(store: Store) -> None:
    store.insert_traces([make_trace(1, tenant="a", answer="secret of a"), make_trace(2, tenant="a")])
    assert store.get_trace("b", trace_id(1)) is None
    assert store.list_traces("b") == ([], None)
    assert store.count_traces("b") == 0

    # The same trace id in another tenant is another trace, with its own feedback.
    assert store.insert_traces([make_trace(1, tenant="b", answer="b's own")]) == [trace_id(1)]
    store.insert_feedback([make_feedback("e", 1, "regenerate", tenant="b")])
    mine, theirs = store.get_trace("a", trace_id(1)), store.get_trace("b", trace_id(1))
    assert mine is not None and theirs is not None
    assert (mine["answer"], theirs["answer"]) == ("secret of a", "b's own")
    assert mine["feedback"] == [] and mine["flags"]["is_regeneration"] is False
    assert theirs["flags"]["is_regeneration"] is True
    assert store.count_traces("a", has_feedback=True) == 0
    assert {i["tenant"] for i in store.list_traces("a")[0]} == {"a"}


# --- listing, filters, pagination --------------------------------------------------------------------


@pytest.mark.parametrize("limit", [1, 7, 25, MAX_PAGE_SIZE])
def test_pages_neither_repeat_nor_skip_under_equal_timestamps(store: Store, limit: int) -> None:
    rng = random.Random(limit)
    numbers = rng.sample(range(10_000), 57)
    # Four distinct start times for 57 traces: ties everywhere.
    batch = [make_trace(n, start_time=T0 + timedelta(seconds=rng.randrange(4))) for n in numbers]
    store.insert_traces(batch)
    items = all_pages(store, "default", limit)
    keys = [(datetime.fromisoformat(i["start_time"]), i["trace_id"]) for i in items]
    assert len(keys) == len(set(keys)) == 57
    assert keys == sorted(((t.start_time, t.trace_id) for t in batch), reverse=True)


def test_pages_stay_consistent_when_newer_traces_arrive_meanwhile(store: Store) -> None:
    store.insert_traces([make_trace(n) for n in range(30)])
    first, cursor = store.list_traces("default", limit=10)
    store.insert_traces([make_trace(n) for n in range(100, 110)])
    second, _ = store.list_traces("default", limit=10, cursor=cursor)
    assert [i["trace_id"] for i in first + second] == [trace_id(n) for n in range(29, 9, -1)]


def _random_corpus(seed: int) -> tuple[list[RagTrace], list[Feedback]]:
    rng = random.Random(seed)
    corpus: list[RagTrace] = []
    for n in range(120):
        regenerated = rng.random() < 0.2
        corpus.append(
            make_trace(
                n,
                tenant=rng.choice(["a", "a", "b"]),
                app=rng.choice(["search", "chat", "faq"]),
                release=rng.choice(["v1", "v2", None]),
                intent=rng.choice(["billing", "howto", None]),
                session_id=rng.choice(["s1", "s2", "s3"]),
                start_time=T0 + timedelta(minutes=rng.randrange(60)),
                partial=rng.random() < 0.25,
                is_regeneration=regenerated,
                regeneration_source="attribute" if regenerated else None,
                probe_run_id="probe" if rng.random() < 0.15 else None,
            )
        )
    events: list[Feedback] = []
    for k, trace in enumerate(rng.sample(corpus, 50)):
        kind = rng.choice(["up", "down", "regenerate"])
        events.append(make_feedback(f"e{k}", int(trace.trace_id, 16), kind, tenant=trace.tenant))
    return corpus, events


def _expected(
    corpus: Sequence[RagTrace], events: Sequence[Feedback], tenant: str, filters: TraceFilters
) -> list[str]:
    kinds: dict[tuple[str, str], set[str]] = {}
    for e in events:
        kinds.setdefault((e.tenant, e.trace_id), set()).add(e.kind)

    def keep(t: RagTrace) -> bool:
        got = kinds.get((t.tenant, t.trace_id), set())
        checks = [t.tenant == tenant]
        for name in ("app", "release", "intent", "session_id"):
            if name in filters:
                checks.append(getattr(t, name) == filters[name])
        if "since" in filters:
            checks.append(t.start_time >= filters["since"])
        if "until" in filters:
            checks.append(t.start_time < filters["until"])
        if "regeneration" in filters:
            checks.append((t.is_regeneration or "regenerate" in got) == filters["regeneration"])
        if "partial" in filters:
            checks.append(t.partial == filters["partial"])
        if "probe" in filters:
            checks.append((t.probe_run_id is not None) == filters["probe"])
        if "has_feedback" in filters:
            wanted = filters["has_feedback"]
            checks.append(bool(got) == wanted if isinstance(wanted, bool) else wanted in got)
        return all(checks)

    kept = sorted((t for t in corpus if keep(t)), key=lambda t: (t.start_time, t.trace_id), reverse=True)
    return [t.trace_id for t in kept]


FILTER_CASES: list[TraceFilters] = [
    {},
    {"app": "chat"},
    {"release": "v2", "intent": "billing"},
    {"session_id": "s2", "partial": False},
    {"since": T0 + timedelta(minutes=15), "until": T0 + timedelta(minutes=40)},
    {"regeneration": True},
    {"regeneration": False, "app": "faq"},
    {"partial": True},
    {"probe": True},
    {"probe": False, "has_feedback": False},
    {"has_feedback": True},
    {"has_feedback": "down"},
    {"has_feedback": "regenerate", "regeneration": True},
    {"has_feedback": "up", "since": T0 + timedelta(minutes=30)},
]


@pytest.mark.parametrize("filters", FILTER_CASES, ids=lambda f: ",".join(sorted(f)) or "none")
def test_filters_match_a_reference_computed_in_python(store: Store, filters: TraceFilters) -> None:
    corpus, events = _random_corpus(seed=11)
    store.insert_feedback(events[:25])
    store.insert_traces(corpus)
    store.insert_feedback(events[25:])
    for tenant in ("a", "b"):
        want = _expected(corpus, events, tenant, filters)
        got = [i["trace_id"] for i in all_pages(store, tenant, 13, **filters)]
        assert got == want
        assert store.count_traces(tenant, **filters) == len(want)


def test_list_items_are_compact_and_json_ready(store: Store) -> None:
    store.insert_traces([make_trace(1)])
    store.insert_feedback([make_feedback("e", 1, "down")])
    (item,), cursor = store.list_traces("default")
    json.dumps(item, allow_nan=False)
    assert cursor is None
    assert "context" not in item and "feedback" not in item
    assert item["chunk_ids"] == ["doc-1-0", "doc-1-1", "doc-1-2"]


def test_bad_listing_arguments_are_refused(store: Store) -> None:
    with pytest.raises(ValueError):
        store.list_traces("default", limit=0)
    with pytest.raises(ValueError):
        store.list_traces("default", limit=MAX_PAGE_SIZE + 1)
    with pytest.raises(InvalidInput):
        store.list_traces("default", cursor="not a cursor")
    with pytest.raises(ValueError):
        store.count_traces("default", has_feedback="meh")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        store.count_traces("default", colour="red")  # type: ignore[call-arg]


def test_cursor_round_trips() -> None:
    when = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    assert decode_cursor(encode_cursor(when, trace_id(9))) == (when, trace_id(9))
    for bad in ("", "////", encode_cursor(when, "x")[:-3], "WzEsMl0"):
        with pytest.raises(InvalidInput):
            decode_cursor(bad)


# --- retention ---------------------------------------------------------------------------------------


def test_retention_deletes_old_traces_with_everything_attached_in_chunks(
    store: Store, raw: sa.Engine
) -> None:
    cutoff = T0 + timedelta(seconds=50)
    old = [make_trace(n, tenant=("a" if n % 2 else "b")) for n in range(0, 50)]
    young = [make_trace(n) for n in range(50, 60)]
    store.insert_traces(old + young)
    store.insert_feedback(
        [
            # on an old trace but given after the cutoff: goes with its trace
            make_feedback("on-old", 1, "down", tenant="a", time=cutoff + timedelta(hours=1)),
            # old feedback for a trace that never arrived: goes by its own age
            make_feedback("orphan-old", 999, time=cutoff - timedelta(seconds=1)),
            # young feedback for a trace that never arrived: stays
            make_feedback("orphan-young", 998, time=cutoff),
            make_feedback("on-young", 55, time=cutoff + timedelta(hours=1)),
        ]
    )
    assert store.delete_older_than(cutoff, chunk_size=7) == 50
    assert row_count(raw, traces) == 10
    assert row_count(raw, trace_contexts) == 10
    with raw.connect() as conn:
        kept = set(conn.execute(sa.select(feedback.c.event_id)).scalars())
    assert kept == {"orphan-young", "on-young"}
    assert store.get_trace("a", trace_id(1)) is None
    assert store.delete_older_than(cutoff, chunk_size=7) == 0
    with pytest.raises(ValueError):
        store.delete_older_than(cutoff, chunk_size=0)


# --- failures ----------------------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_database_raises_store_unavailable(store_url: str, tmp_path: Any) -> None:
    if store_url.startswith("sqlite"):
        url = f"sqlite:///{tmp_path / 'no-such-dir' / 'ragmon.db'}"
    else:
        closed = sa.make_url(store_url).set(host="127.0.0.1", port=_closed_port())
        url = closed.render_as_string(hide_password=False)
    store = Store(url, connect_timeout_s=2.0, pool_timeout_s=2.0)
    try:
        for call in (
            store.ping,
            store.create_schema,
            lambda: store.insert_traces([make_trace(1)]),
            lambda: store.insert_feedback([make_feedback("e", 1)]),
            lambda: store.get_trace("default", trace_id(1)),
            lambda: store.count_traces("default"),
        ):
            with pytest.raises(StoreUnavailable) as caught:
                call()
            assert isinstance(caught.value.__cause__, sa.exc.DBAPIError)
            assert caught.value.retry_after_s > 0
    finally:
        store.close()


def test_a_batch_that_times_out_midway_leaves_nothing_behind(store_url: str, raw: sa.Engine) -> None:
    """The trace rows go in, the context insert waits on a lock and times out: all is rolled back."""
    store = Store(store_url, statement_timeout_s=0.5)
    store.create_schema()
    batch = [make_trace(n) for n in range(10)]
    try:
        if store.dialect == "postgresql":
            with raw.connect() as blocker, blocker.begin():
                blocker.exec_driver_sql("LOCK TABLE trace_contexts IN ACCESS EXCLUSIVE MODE")
                with pytest.raises(StoreUnavailable):
                    store.insert_traces(batch)
        else:
            # SQLite locks the whole file: a second writer holds it for the duration.
            path = sa.make_url(store_url).database
            assert path is not None
            writer = sqlite3.connect(path, isolation_level=None)
            writer.execute("BEGIN IMMEDIATE")
            try:
                with pytest.raises(StoreUnavailable):
                    store.insert_traces(batch)
            finally:
                writer.execute("ROLLBACK")
                writer.close()
        assert row_count(raw, traces) == 0
        assert row_count(raw, trace_contexts) == 0
        assert store.insert_traces(batch) == [t.trace_id for t in batch]
    finally:
        store.close()


def test_a_batch_failing_after_its_first_statement_is_rolled_back(store: Store, raw: sa.Engine) -> None:
    """A trigger makes the context insert fail after the trace rows were written."""
    with raw.begin() as conn:
        if store.dialect == "postgresql":
            conn.exec_driver_sql(
                "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'refused' USING ERRCODE = 'check_violation'; END $$"
            )
            conn.exec_driver_sql(
                "CREATE TRIGGER refuse BEFORE INSERT ON trace_contexts FOR EACH ROW EXECUTE FUNCTION refuse()"
            )
        else:
            conn.exec_driver_sql(
                "CREATE TRIGGER refuse BEFORE INSERT ON trace_contexts "
                "BEGIN SELECT RAISE(ABORT, 'refused'); END"
            )
    batch = [make_trace(n) for n in range(5)]
    with pytest.raises(InvalidInput):
        store.insert_traces(batch)
    assert row_count(raw, traces) == 0
    with raw.begin() as conn:
        conn.exec_driver_sql(
            "DROP TRIGGER refuse" + (" ON trace_contexts" if store.dialect == "postgresql" else "")
        )
    assert store.insert_traces(batch) == [t.trace_id for t in batch]


def test_values_the_database_refuses_raise_a_permanent_error(store: Store, raw: sa.Engine) -> None:
    too_many = make_trace(1, usage=(ModelUsage(model="m", input_tokens=2**70),))
    with pytest.raises(InvalidInput):
        store.insert_traces([make_trace(2), too_many])
    assert row_count(raw, traces) == 0


def test_a_closed_store_refuses_work_and_closes_twice(store_url: str) -> None:
    store = Store(store_url)
    store.create_schema()
    store.ping()
    store.close()
    store.close()
    with pytest.raises(StoreUnavailable):
        store.insert_traces([make_trace(1)])
    with pytest.raises(StoreUnavailable):
        store.ping()


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("mysql+pymysql://localhost/x", {}),
        ("sqlite://", {"statement_timeout_s": 0}),
        ("sqlite://", {"connect_timeout_s": float("nan")}),
        ("sqlite://", {"pool_size": 0}),
    ],
)
def test_bad_store_arguments_are_refused(url: str, options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Store(url, **options)


def test_in_memory_sqlite_works_across_threads() -> None:
    store = Store("sqlite://")
    try:
        store.create_schema()
        thread = threading.Thread(target=store.insert_traces, args=([make_trace(1)],))
        thread.start()
        thread.join()
        assert store.count_traces("default") == 1
    finally:
        store.close()


# --- the sink ----------------------------------------------------------------------------------------


class Recorder:
    """A TraceConsumer that keeps what it was given."""

    def __init__(self) -> None:
        self.batches: list[list[RagTrace]] = []

    async def consume_traces(self, batch: Sequence[RagTrace]) -> None:
        self.batches.append(list(batch))


def test_sink_stores_and_forwards_only_new_traces(store: Store) -> None:
    downstream = Recorder()
    sink = StoreSink(store, new_traces=downstream)
    first = [make_trace(1), make_trace(2), make_trace(1)]
    second = [make_trace(2), make_trace(3)]

    async def scenario() -> list[str]:
        await sink.start()
        await sink.consume_traces(first)
        await sink.consume_traces(first)
        await sink.consume_traces(second)
        new_ids = await sink.store_traces([make_trace(3), make_trace(4)])
        await sink.consume_feedback([make_feedback("e", 4, "down")])
        await sink.stop(timeout_s=1.0)
        await sink.stop(timeout_s=1.0)
        return new_ids

    assert asyncio.run(scenario()) == [trace_id(4)]
    assert [[t.trace_id for t in b] for b in downstream.batches] == [
        [trace_id(1), trace_id(2)],
        [trace_id(3)],
    ]
    assert store.count_traces("default") == 4
    assert store.count_traces("default", has_feedback="down") == 1


def test_sink_passes_store_errors_to_the_caller(store_url: str) -> None:
    store = Store(store_url)
    store.close()
    sink = StoreSink(store)
    with pytest.raises(StoreUnavailable):
        asyncio.run(sink.consume_traces([make_trace(1)]))
    with pytest.raises(StoreUnavailable):
        asyncio.run(sink.consume_feedback([make_feedback("e", 1)]))


def test_feedback_for_returns_each_keys_events_oldest_first_and_uses_the_index(
    store: Store, raw: sa.Engine
) -> None:
    store.insert_feedback(
        [
            make_feedback("late", 1, kind="down", time=T0 + timedelta(seconds=5)),
            make_feedback("early", 1, time=T0),
            make_feedback("other-trace", 2),
            make_feedback("other-tenant", 1, tenant="acme"),
        ]
    )
    executed: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        executed.append((statement, parameters))

    sa.event.listen(store.engine, "before_cursor_execute", record)
    try:
        found = store.feedback_for(
            [("default", trace_id(1)), ("acme", trace_id(1)), ("default", trace_id(3))]
        )
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", record)
    assert {k: [f.event_id for f in v] for k, v in found.items()} == {
        ("default", trace_id(1)): ["early", "late"],
        ("acme", trace_id(1)): ["other-tenant"],
    }
    if raw.dialect.name == "sqlite":
        # runs for every new-trace batch: a scan of the whole feedback table would grow with it
        (statement, parameters), *_ = [e for e in executed if "FROM feedback" in e[0]]
        with raw.connect() as conn:
            plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).all()
        assert any("ix_feedback_tenant_trace" in row[-1] for row in plan), plan
