"""A judged sample and a blind review queue on one database, filled trace by trace (tests of the
human-corrected estimate: service/review/correction.py, the report, `ragmon review labels`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from sampler import JudgeItem, SqlJudgeQueue, create_tables
from service.judge.store import JudgmentStore, judgments
from service.review.records import Intake, Queue, ReviewIn
from service.review.store import ReviewStore
from service.store.trace_store import Store

NOW = datetime.now(UTC).replace(microsecond=0)
VERSION = "heuristic/test"


def tid(n: int) -> str:
    return f"{n:032x}"


class World:
    """A judged sample and a review queue on one database, filled trace by trace."""

    def __init__(self, store: Store) -> None:
        self.engine = store.engine
        JudgmentStore(store.engine).create_schema()
        create_tables(store.engine)
        self.reviews = ReviewStore(store.engine)
        self.reviews.create_schema()
        self.queue = SqlJudgeQueue(store.engine, max_attempts=1)
        self.judgments = JudgmentStore(store.engine)

    def judged(
        self,
        n: int,
        faithfulness: float | None,
        *,
        tenant: str = "a",
        app: str = "shop",
        pi: float = 0.5,
        age: timedelta = timedelta(hours=1),
        outcome: str = "scored",
        claims: int = 2,
    ) -> str:
        item = JudgeItem(
            trace_id=tid(n),
            tenant=tenant,
            app=app,
            stratum="base" if pi < 1 else "thumbs_down",
            inclusion_probability=pi,
            judge_version=VERSION,
            enqueued_at=NOW - age,
            trace_time=NOW - age,
        )
        self.queue.enqueue([item])
        [record] = [r for r in self.queue.claim(10, 60.0, "w") if r.key.trace_id == tid(n)]
        self.queue.complete(record.key)
        with self.engine.begin() as conn:
            conn.execute(
                sa.insert(judgments),
                [
                    {
                        "tenant": tenant,
                        "trace_id": tid(n),
                        "judge_version": VERSION,
                        "app": app,
                        "judge": "heuristic",
                        "outcome": outcome,
                        "faithfulness": faithfulness,
                        "judged_at": NOW,
                        "record": json.dumps({"claims": ["c"] * claims, "outcome": outcome}),
                    }
                ],
            )
        return tid(n)

    def label(
        self,
        trace_id: str,
        review: ReviewIn,
        *,
        queue: Queue = "blind",
        tenant: str = "a",
        who: str = "alice",
    ) -> None:
        [item_id] = self.reviews.add(
            [Intake(tenant, queue, trace_id, "shop", "blind_sample" if queue == "blind" else "api")]
        )
        self.reviews.claim(item_id, who, [tenant], 60)
        assert self.reviews.submit(item_id, who, [tenant], review) is not None
