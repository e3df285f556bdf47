"""Traces and feedback for the distributed tests: distinct, valid records with known ids."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from service.model import Feedback, RagTrace, Timings


def trace_ids(n: int) -> list[str]:
    return [uuid.uuid4().hex for _ in range(n)]


def traces(n: int, app: str = "shop") -> list[RagTrace]:
    now = datetime.now(UTC)
    return [
        RagTrace(
            trace_id=trace_id,
            app=app,
            start_time=now,
            query=f"question {i}",
            answer=f"answer {i}",
            timings=Timings(total_s=0.1 + i % 7 / 10),
            source="json",
        )
        for i, trace_id in enumerate(trace_ids(n))
    ]


def feedback_for(batch: list[RagTrace], kind: str = "up") -> list[Feedback]:
    now = datetime.now(UTC)
    return [
        Feedback(event_id=uuid.uuid4().hex, trace_id=t.trace_id, app=t.app, kind=kind, time=now)
        for t in batch
    ]


def json_traces(n: int, app: str = "shop") -> list[dict[str, Any]]:
    """`TraceIn` records for the JSON ingest API."""
    return [
        {"trace_id": trace_id, "app": app, "query": f"question {i}", "answer": f"answer {i}"}
        for i, trace_id in enumerate(trace_ids(n))
    ]
