"""Tests of the fan-out outbox (store/tables.fanout_outbox, StoreSink, service/outbox.py): what happens
after the store commit (judge enqueue, review intake, metrics) runs exactly once, also when a sink
fails between the commit and its effect."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

from sampler import create_tables
from service.model import Feedback, RagTrace
from service.store.trace_store import Store
from tests.live_server import live_server, post_accepted


def trace(n: int, tenant: str = "t1") -> RagTrace:
    return RagTrace(
        trace_id=f"{n:032x}",
        tenant=tenant,
        app="outbox-app",
        start_time=datetime.now(UTC),
        query="q",
        answer="a",
    )


def test_new_records_get_an_outbox_row_in_their_transaction(store_url: str) -> None:
    store = Store(store_url)
    store.create_schema()
    try:
        assert store.insert_traces([trace(1), trace(2, "t2")], outbox=True) == [f"{1:032x}", f"{2:032x}"]
        assert store.insert_traces([trace(3)]) == [f"{3:032x}"]  # no fan-out behind it: no row
        keys = [("t1", f"{1:032x}"), ("t2", f"{2:032x}"), ("t1", f"{3:032x}")]
        assert store.outboxed("trace", keys) == {("t1", f"{1:032x}"), ("t2", f"{2:032x}")}
        assert store.insert_traces([trace(1)], outbox=True) == []  # a redelivery adds nothing
        event = Feedback(
            event_id="e1", trace_id=f"{1:032x}", tenant="t1", kind="down", time=datetime.now(UTC)
        )
        assert store.insert_feedback([event], outbox=True) == ["e1"]
        assert store.outboxed("feedback", [("t1", "e1")]) == {("t1", "e1")}
        # a sweep takes only rows older than its cutoff, and stamps what it took
        assert store.take_outbox(datetime.now(UTC) - timedelta(hours=1)) == []
        taken = store.take_outbox(datetime.now(UTC) + timedelta(seconds=1))
        assert sorted(row[:3] for row in taken) == sorted(
            [("t1", "trace", f"{1:032x}"), ("t2", "trace", f"{2:032x}"), ("t1", "feedback", "e1")]
        )
        assert all(abs((row[3] - datetime.now(UTC)).total_seconds()) < 60 for row in taken)  # when stored
        assert store.take_outbox(datetime.now(UTC) - timedelta(seconds=5)) == []  # stamped just now
        assert store.feedback_events([("t1", "e1")]) == [event]
        store.clear_outbox("trace", keys)
        store.clear_outbox("feedback", [("t1", "e1")])
        assert store.outboxed("trace", keys) == set() and store.outboxed("feedback", [("t1", "e1")]) == set()
    finally:
        store.close()


def test_a_failed_judge_enqueue_after_the_commit_is_run_again_exactly_once(tmp_path: Path) -> None:
    settings = {
        "assembler": {"grace_s": 0.05},
        "judging": {"workers": 0},
        "sampler": {"rates": {"base": 1.0}},
        "drift": {"enabled": False},
    }
    records = [
        {"trace_id": f"{n:032x}", "app": "outbox-app", "query": f"question {n}", "answer": "an answer"}
        for n in range(1, 11)
    ]
    with live_server(tmp_path, **settings) as server:
        engine = server.pipeline.store.engine
        with engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE judge_queue"))  # the judge queue's write fails for real
        with server.client() as client:
            assert client.post("/api/v1/traces", json={"traces": records}).status_code == 200
        server.flush()
        with engine.connect() as conn:
            stored = conn.execute(sa.text("SELECT count(*) FROM traces")).scalar()
            waiting = conn.execute(sa.text("SELECT count(*) FROM fanout_outbox")).scalar()
        assert (stored, waiting) == (10, 10)
        # the judge queue wrote nothing, and the counters after it counted nothing yet
        assert server.metric("ragmon_traces_total", app="outbox-app") == 0

        create_tables(engine)  # the queue is back
        swept = server.call(server.pipeline.outbox_sweep.sweep(min_age_s=0))
        assert swept == 10
        with engine.connect() as conn:
            queued = conn.execute(sa.text("SELECT count(DISTINCT trace_id), count(*) FROM judge_queue")).one()
            waiting = conn.execute(sa.text("SELECT count(*) FROM fanout_outbox")).scalar()
        assert tuple(queued) == (10, 10) and waiting == 0
        assert server.metric("ragmon_traces_total", app="outbox-app") == 10

        # a redelivery of the same traces changes nothing: stored, fanned out, counted once
        with server.client() as client:
            assert client.post("/api/v1/traces", json={"traces": records}).status_code == 200
        server.flush()
        time.sleep(0.2)
        assert server.call(server.pipeline.outbox_sweep.sweep(min_age_s=0)) == 0
        assert server.metric("ragmon_traces_total", app="outbox-app") == 10
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM judge_queue")).scalar() == 10


def test_feedback_before_its_trace_waits_joins_under_the_traces_app_and_orphans_expire(
    tmp_path: Path,
) -> None:
    """2,000 thumbs-down for traces that never existed make no review item and no app="none" count; they
    expire as orphans. Feedback that came first is counted and reviewed with its trace's app when it comes."""
    settings = {"assembler": {"grace_s": 0.05}, "judging": {"workers": 0}, "store": {"feedback_wait_s": 600}}
    with live_server(tmp_path, **settings) as server:
        engine = server.pipeline.store.engine
        unknown = [
            {"trace_id": f"{n:032x}", "kind": "down", "event_id": f"ghost-{n}"} for n in range(10_000, 12_000)
        ]
        early = {"trace_id": f"{1:032x}", "kind": "down", "event_id": "early-1", "reason": "wrong"}
        with server.client() as client:
            for start in range(0, len(unknown), 500):
                batch = unknown[start : start + 500]
                assert post_accepted(client, "/api/v1/feedback", batch).status_code == 200
            assert post_accepted(client, "/api/v1/feedback", early).status_code == 200
        server.flush()
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM review_items")).scalar() == 0
            assert conn.execute(sa.text("SELECT count(*) FROM feedback")).scalar() == 2_001  # all kept
        assert server.metric("ragmon_feedback_total", app="none", rating="down") == 0

        record = {"trace_id": f"{1:032x}", "app": "late-app", "query": "q", "answer": "a"}
        with server.client() as client:
            assert client.post("/api/v1/traces", json={"traces": [record]}).status_code == 200
        server.flush()
        assert server.metric("ragmon_feedback_total", app="late-app", rating="down") == 1
        with engine.connect() as conn:
            items = conn.execute(sa.text("SELECT trace_id FROM review_items")).scalars().all()
        assert items == [f"{1:032x}"]

        # within the wait, the sweep leaves them waiting; past it, they are orphans, counted once
        assert server.call(server.pipeline.outbox_sweep.sweep(min_age_s=0)) == 0
        assert server.metric("ragmon_feedback_orphaned_total", kind="down") == 0
        later = datetime.now(UTC) + timedelta(seconds=601)
        server.call(server.pipeline.outbox_sweep.sweep(min_age_s=0, now=later))
        assert server.metric("ragmon_feedback_orphaned_total", kind="down") == 2_000
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM fanout_outbox")).scalar() == 0
            assert conn.execute(sa.text("SELECT count(*) FROM review_items")).scalar() == 1
        assert server.metric("ragmon_feedback_total", app="none", rating="down") == 0
