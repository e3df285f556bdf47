"""Tests of service/probes/store.py on SQLite and PostgreSQL: versions, runs, scores, baselines, traces."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from service.errors import InvalidInput
from service.model import Chunk, RagTrace, Retrieval
from service.probes.golden import parse_golden
from service.probes.store import GoldenStore, ProbeRun
from service.store.trace_store import Store

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
ROWS = [
    '{"question_id": "q1", "question": "How long do refunds take?", "gold_chunks": [{"chunk_id": "c1"}]}',
    '{"question_id": "q2", "question": "Can I change my email?", "gold_chunks": [{"chunk_id": "c2"}]}',
]


@pytest.fixture
def store(store_url: str) -> Iterator[tuple[Store, GoldenStore]]:
    traces = Store(store_url)
    traces.create_schema()
    golden = GoldenStore(traces.engine)
    golden.create_schema()
    golden.create_schema()  # safe to repeat
    yield traces, golden
    traces.close()


def _scored(run_id: str, started: datetime, version: str, recall: float) -> ProbeRun:
    result = {"run_id": run_id, "ks": [5], "per_question": {"q1": {"recall@5": recall}}}
    return ProbeRun(run_id, "support", version, started, started + timedelta(minutes=1), result)


def test_loading_is_idempotent_by_content_and_versions_are_kept(store: tuple[Store, GoldenStore]) -> None:
    _, golden = store
    first = golden.load("acme", parse_golden(ROWS), "support")
    again = golden.load("acme", parse_golden(reversed(ROWS)), "support")  # same content, other order
    assert first.new and not again.new and again.version == first.version
    changed = golden.load("acme", parse_golden(ROWS[:1]), "support")
    assert changed.new and changed.version != first.version and changed.questions == 1
    latest = golden.golden("acme", "support")
    assert latest is not None and latest.version == changed.version
    older = golden.golden("acme", "support", first.version)
    assert older is not None and set(older.questions) == {"q1", "q2"}
    assert golden.golden("other-tenant", "support") is None
    assert [g.version for g in golden.golden_sets("acme")] == [changed.version, first.version]
    with pytest.raises(ValueError):
        golden.load("acme", parse_golden(ROWS), " ")


def test_runs_previous_and_baseline(store: tuple[Store, GoldenStore]) -> None:
    _, golden = store
    version = golden.load("acme", parse_golden(ROWS), "support").version
    registered = golden.register_run("acme", "r1", "support", version, T0)
    assert golden.register_run("acme", "r1", "support", version, T0 + timedelta(hours=1)) == registered
    with pytest.raises(InvalidInput):
        golden.register_run("acme", "r1", "other", version, T0)
    with pytest.raises(InvalidInput, match="not been scored"):
        golden.pin_baseline("acme", "r1")
    golden.save_score("acme", _scored("r1", T0, version, 1.0))
    golden.save_score("acme", _scored("r2", T0 + timedelta(hours=1), version, 0.5))
    golden.save_score("acme", _scored("r3", T0 + timedelta(hours=2), version, 0.0))
    golden.save_score("acme", _scored("r3", T0 + timedelta(hours=2), version, 0.25))  # rescoring replaces
    r3 = golden.run("acme", "r3")
    assert r3 is not None and r3.result is not None and r3.result["per_question"]["q1"]["recall@5"] == 0.25
    previous = golden.previous_run("acme", r3)
    assert previous is not None and previous.run_id == "r2"
    r1 = golden.run("acme", "r1")
    assert r1 is not None and golden.previous_run("acme", r1) is None
    assert [r.run_id for r in golden.runs("acme", "support")] == ["r3", "r2", "r1"]
    assert golden.runs("someone-else") == []
    assert golden.baseline("acme", "support") is None
    golden.pin_baseline("acme", "r1")
    golden.pin_baseline("acme", "r2")  # re-pinning replaces
    baseline = golden.baseline("acme", "support")
    assert baseline is not None and baseline.run_id == "r2"
    latest = golden.latest_scored_runs()
    assert [(tenant, run.run_id) for tenant, run in latest] == [("acme", "r3")]
    assert golden.latest_scored_runs("nobody") == []


def test_run_traces_are_the_tagged_traces_of_the_tenant(store: tuple[Store, GoldenStore]) -> None:
    traces, golden = store

    def trace(n: int, tenant: str, run_id: str | None) -> RagTrace:
        return RagTrace(
            trace_id=f"{n:032x}",
            tenant=tenant,
            start_time=T0 + timedelta(seconds=n),
            retrieval=Retrieval(
                chunks=(Chunk(id="c1", rank=0), Chunk(id="c9", rank=1)),
                filter="lang = 'en'",
                excluded_ids=("c2",),
            ),
            probe_run_id=run_id,
            probe_question_id=None if run_id is None else "q1",
        )

    traces.insert_traces(
        [trace(1, "acme", "r1"), trace(2, "acme", "r2"), trace(3, "acme", None), trace(4, "evil", "r1")]
    )
    found = golden.run_traces("acme", "r1")
    assert [r["trace_id"] for r in found] == [f"{1:032x}"]
    (record,) = found
    assert record["chunk_ids"] == ["c1", "c9"]
    assert record["flags"]["probe_question_id"] == "q1"
    assert record["context"]["filter"] == "lang = 'en'" and record["context"]["excluded_ids"] == ["c2"]
    assert golden.run_traces("acme", "nope") == []
