"""Tests of service/judge/store.py `save`: one judgment per trace and judge version; a judgment of a later
version of the trace (its answer came late) replaces the one before, with its flags; the same version
judged again (a redelivered item) changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from service.judge.judgment import Judgment
from service.judge.store import JudgmentStore
from service.store.trace_store import Store

TRACE = "12" * 16
AT = datetime(2026, 1, 5, 12, tzinfo=UTC)


def judgment(revision: int, outcome: str, **fields: object) -> Judgment:
    values: dict[str, object] = {
        "trace_id": TRACE,
        "judge": "heuristic",
        "judge_version": "heuristic/v1",
        "outcome": outcome,
        "judged_at": AT,
        "trace_revision": revision,
    }
    values.update(fields)
    return Judgment.model_validate(values)


def test_a_judgment_of_a_later_trace_revision_replaces_the_earlier_one(store: Store) -> None:
    judgments = JudgmentStore(store.engine)
    judgments.create_schema()
    without_answer = judgment(1, "failed", failure_reason="no_answer")
    new, flags = judgments.save(without_answer, 0.5)
    assert new and [f.reason for f in flags] == ["judge_failure"]
    assert judgments.save(without_answer, 0.5) == (False, [])  # redelivered: nothing changes
    scored = judgment(
        3,
        "scored",
        faithfulness=1.0,
        claims=("five days",),
        supported=(0,),
        failure_mode="none",
        context_sufficient=True,
        diagnosis="ok",
    )
    assert judgments.save(scored, 0.5) == (True, [])
    found, raised = judgments.for_trace("default", TRACE)
    assert [(j["outcome"], j["trace_revision"]) for j in found] == [("scored", 3)]
    assert raised == []  # the failure flag went with the judgment it came from
    assert judgments.save(judgment(2, "failed", failure_reason="no_answer"), 0.5) == (False, [])
    assert judgments.outcomes([("default", TRACE, "heuristic/v1")]) == {
        ("default", TRACE, "heuristic/v1"): ("scored", 1.0)
    }


def test_retention_deletes_judgments_and_flags_from_before_the_cutoff(store: Store) -> None:
    judgments = JudgmentStore(store.engine)
    judgments.create_schema()
    ids = [f"{n:032x}" for n in range(5)]
    for n, trace_id in enumerate(ids):  # judged a day apart; each a failure, which raises a flag now
        when = AT + timedelta(days=n)
        failed = judgment(1, "failed", failure_reason="no_answer", trace_id=trace_id, judged_at=when)
        judgments.save(failed, 0.5)

    def kept() -> list[tuple[bool, bool]]:
        stored = (judgments.for_trace("default", trace_id) for trace_id in ids)
        return [(bool(found), bool(raised)) for found, raised in stored]

    assert judgments.delete_older_than(AT + timedelta(days=2, hours=1), chunk_size=2) == 3  # chunks 2 + 1
    assert kept() == [(False, True)] * 3 + [(True, True)] * 2  # the flags were raised after the cutoff
    assert judgments.delete_older_than(datetime.now(UTC) + timedelta(seconds=1)) == 2
    assert kept() == [(False, False)] * 5
