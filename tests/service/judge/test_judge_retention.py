"""Retention reaches what the judge kept of a trace: a server deletes the judge-queue items and the
judgments older than `store.retention_days` as it deletes the traces (service/pipeline.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from sampler.queue import JudgeItem
from service.judge.judgment import Judgment
from tests.eventually import wait_until
from tests.live_server import live_server


def queued(trace_id: str, started: datetime) -> JudgeItem:
    return JudgeItem(
        trace_id=trace_id,
        tenant="default",
        app="shop",
        stratum="base",
        inclusion_probability=0.02,
        judge_version="heuristic/v1",
        enqueued_at=started,
        trace_time=started,
    )


def judged(trace_id: str, at: datetime) -> Judgment:
    return Judgment.model_validate(
        {
            "trace_id": trace_id,
            "judge": "heuristic",
            "judge_version": "heuristic/v1",
            "outcome": "failed",
            "failure_reason": "no_answer",
            "judged_at": at,
        }
    )


def test_a_server_deletes_judge_queue_items_and_judgments_past_retention(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    old, recent = "a" * 32, "b" * 32
    quiet = {"judging": {"workers": 0}}  # nothing claims the items while the test looks at them
    with live_server(tmp_path, **quiet) as server:  # creates the schema; retention of 30 days deletes nothing
        pipeline = server.pipeline
        pipeline.judge_queue.enqueue([queued(old, now - timedelta(days=3)), queued(recent, now)])
        for trace_id, at in ((old, now - timedelta(days=3)), (recent, now)):
            pipeline.judgments.save(judged(trace_id, at), 0.5)
    with live_server(tmp_path, store={"retention_days": 2}, **quiet) as server:
        queue, judgments = server.pipeline.judge_queue, server.pipeline.judgments

        def gone(trace_id: str) -> bool:
            key = queued(trace_id, now).key
            return queue.get(key) is None and not judgments.for_trace("default", trace_id)[0]

        wait_until(lambda: gone(old))  # the 3-day-old item and judgment, past a 2-day retention
        assert not gone(recent)
