"""The faithfulness estimate as ragmon computed it before the database summed cells: every record read.

The oracle `JudgmentStore.window_cells` is checked against (tests/service/judge/test_estimate_window.py) and
timed against (bench/judge/estimate_window.py).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from sampler import GROUPINGS, FaithfulnessEstimate, Grouping, JudgedSample, SqlJudgeQueue, estimate_by
from service.judge.store import JudgmentStore


def record_by_record(
    queue: SqlJudgeQueue, store: JudgmentStore, *, now: datetime, window: timedelta, answers: bool = False
) -> dict[Grouping, dict[tuple[str, ...], FaithfulnessEstimate]]:
    """Each record of the window read, its judgment looked up by key, the estimate per grouping; with
    `answers`, a scored sample scores 1 when all its claims are supported, else 0. Items not judged yet
    (pending, deferred, leased) are samples too: `pending`, their cell's nonresponse."""
    records = queue.records(since=now - window)
    outcomes = store.outcomes(r.key for r in records if r.state == "done")
    samples = []
    for record in records:
        if record.state != "done":
            samples.append(JudgedSample.from_record(record))
            continue
        found = outcomes.get((record.key.tenant, record.key.trace_id, record.key.judge_version))
        if found is None:
            continue  # completed by a worker whose judgment write was lost: not a sample
        outcome, score = found
        if outcome == "scored":
            if answers and score is not None:
                score = 1.0 if score >= 1.0 - 1e-9 else 0.0
            samples.append(JudgedSample.from_record(record, "scored", score))
        elif outcome == "no_claims":
            samples.append(JudgedSample.from_record(record, "no_claims"))
        else:
            samples.append(JudgedSample.from_record(replace(record, state="failed")))
    return {g: estimate_by(samples, g, now=now, window=window) for g in GROUPINGS}
