"""The faithfulness estimate from cells the database sums equals the one from every record read one by one."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from sampler import (
    GROUPINGS,
    JudgeItem,
    SqlJudgeQueue,
    create_tables,
    estimate_cells_by,
)
from sampler.estimate import FaithfulnessEstimate
from service.judge.judging import estimate_wait_s
from service.judge.store import JudgmentStore, judgments
from service.store.trace_store import Store
from tests.service.judge.record_by_record import record_by_record

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
WINDOW = timedelta(hours=24)
VERSION = "llm/test-judge/p1"


def fill(store: Store, rng: random.Random, n: int) -> tuple[SqlJudgeQueue, JudgmentStore]:
    """Queue records in every state and judgments of every outcome, some outside the window."""
    JudgmentStore(store.engine).create_schema()
    create_tables(store.engine)
    queue = SqlJudgeQueue(store.engine, max_attempts=1, clock=lambda: NOW)
    items = []
    for i in range(n):
        stratum, pi = rng.choice(
            [("base", 0.02), ("base", 0.05), ("thumbs_down", 1.0), ("low_retrieval", 0.25)]
        )
        age = rng.choice([timedelta(minutes=rng.randrange(1, 1400)), WINDOW + timedelta(minutes=5), WINDOW])
        items.append(
            JudgeItem(
                trace_id=f"{i:032x}",
                tenant=rng.choice(["default", "acme"]),
                app=rng.choice(["support-bot", "docs"]),
                stratum=stratum,
                inclusion_probability=pi,
                judge_version=VERSION,
                enqueued_at=NOW - timedelta(minutes=1),
                trace_time=NOW - age,
                release=rng.choice(["v1", "v2", None]),
                intent=rng.choice(["billing", None]),
                skip_reason="budget" if rng.random() < 0.2 else None,
            )
        )
    queue.enqueue(items)
    claimed = queue.claim(n, 60.0, "w") if n else []
    rows = []
    for record in claimed:
        roll = rng.random()
        if roll < 0.1:
            queue.fail(record.key, worker="w", reason="judge_unavailable", permanent=True)
            continue
        if roll < 0.15:
            continue  # still leased: not judged yet, a `pending` sample
        queue.complete(record.key)
        if roll < 0.18:
            continue  # done, but its judgment was lost: no sample
        outcome = "scored" if roll < 0.8 else rng.choice(["no_claims", "failed"])
        # binary verdicts, equal fractional scores, and anything in between
        score = rng.choice([1.0, 0.0, 0.7, round(rng.random(), 3)]) if outcome == "scored" else None
        rows.append(
            {
                "tenant": record.key.tenant,
                "trace_id": record.key.trace_id,
                "judge_version": VERSION,
                "app": record.item.app,
                "judge": "llm",
                "outcome": outcome,
                "faithfulness": score,
                "judged_at": NOW,
                "record": "{}",
            }
        )
    if rows:
        with store.engine.begin() as conn:
            conn.execute(sa.insert(judgments), rows)
    return queue, JudgmentStore(store.engine)


def assert_same(a: FaithfulnessEstimate, b: FaithfulnessEstimate) -> None:
    counts = ("n_judged", "n_failed", "n_no_claims", "n_skipped", "n_skipped_unadjusted", "method")
    assert [getattr(a, f) for f in counts] == [getattr(b, f) for f in counts]
    for field in ("estimate", "lower", "upper", "n_effective", "sum_weights"):
        x, y = getattr(a, field), getattr(b, field)
        assert (x is None) == (y is None), field
        if x is not None:
            assert x == pytest.approx(y, rel=1e-9, abs=1e-12), field


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_summed_cells_give_the_record_by_record_estimate(store: Store, seed: int) -> None:
    queue, judged = fill(store, random.Random(seed), 400)
    expected = record_by_record(queue, judged, now=NOW, window=WINDOW)
    cells = judged.window_cells(NOW - WINDOW, NOW)
    assert (
        sum(c.count for c in cells) < 400
    )  # the window, the lost judgment and the leased ones left some out
    for grouping in GROUPINGS:
        got = estimate_cells_by(cells, grouping)
        assert set(got) == set(expected[grouping])
        assert got, grouping
        for key, estimate in expected[grouping].items():
            assert_same(got[key], estimate)


@pytest.mark.parametrize("seed", [4, 5])
def test_the_answer_level_reading_is_the_share_of_wholly_supported_answers(store: Store, seed: int) -> None:
    """`reading="answers"` scores a judged answer 1 when every claim is supported: the same Hajek
    estimate, read record by record, of that 0/1 score; lower than the claim-level one when some
    answers are partly supported."""
    queue, judged = fill(store, random.Random(seed), 400)
    expected = record_by_record(queue, judged, now=NOW, window=WINDOW, answers=True)
    cells = judged.window_cells(NOW - WINDOW, NOW, reading="answers")
    claims = judged.window_cells(NOW - WINDOW, NOW)
    for grouping in GROUPINGS:
        got = estimate_cells_by(cells, grouping)
        assert got.keys() == expected[grouping].keys()
        for key in got:
            assert_same(got[key], expected[grouping][key])
    everyone = estimate_cells_by(cells, "app")
    for key, claim_level in estimate_cells_by(claims, "app").items():
        assert everyone[key].n_judged == claim_level.n_judged  # the same samples, read another way
        if claim_level.estimate is not None and everyone[key].estimate is not None:
            assert everyone[key].estimate <= claim_level.estimate + 1e-12


def test_equal_scores_fall_back_to_wilson_as_one_by_one(store: Store) -> None:
    queue, judged = fill(store, random.Random(9), 0)
    items = [
        JudgeItem(
            trace_id=f"{i:032x}",
            tenant="default",
            app="a",
            stratum="base",
            inclusion_probability=0.1,
            judge_version=VERSION,
            enqueued_at=NOW,
            trace_time=NOW - timedelta(hours=1),
        )
        for i in range(40)
    ]
    queue.enqueue(items)
    for record in queue.claim(40, 60.0, "w"):
        queue.complete(record.key)
    with store.engine.begin() as conn:
        conn.execute(
            sa.insert(judgments),
            [
                {
                    "tenant": "default",
                    "trace_id": item.trace_id,
                    "judge_version": VERSION,
                    "app": "a",
                    "judge": "llm",
                    "outcome": "scored",
                    "faithfulness": 0.7,
                    "judged_at": NOW,
                    "record": "{}",
                }
                for item in items
            ],
        )
    (cell,) = judged.window_cells(NOW - WINDOW, NOW)
    assert (cell.count, cell.score_m2) == (40, 0.0)
    estimate = estimate_cells_by([cell], "app")[("a",)]
    assert estimate.method == "wilson_kish"  # zero variance: the linearization interval would be a point
    assert estimate.estimate == pytest.approx(0.7)
    assert estimate.lower < 0.7 < estimate.upper
    assert_same(estimate, record_by_record(queue, judged, now=NOW, window=WINDOW)["app"][("a",)])


def test_one_tenants_cells_hold_only_its_records(store: Store) -> None:
    queue, judged = fill(store, random.Random(5), 300)
    everyone = judged.window_cells(NOW - WINDOW, NOW)
    acme = judged.window_cells(NOW - WINDOW, NOW, tenant="acme")
    default = judged.window_cells(NOW - WINDOW, NOW, tenant="default")
    assert sum(c.count for c in acme) + sum(c.count for c in default) == sum(c.count for c in everyone)
    records = queue.records(since=NOW - WINDOW, tenant="acme")
    assert 0 < sum(c.count for c in acme) <= sum(1 for r in records if r.item.trace_time > NOW - WINDOW)
    assert judged.window_cells(NOW - WINDOW, NOW, tenant="nobody") == []


def test_outcomes_answer_exact_keys_through_the_primary_key(store: Store) -> None:
    _, judged = fill(store, random.Random(0), 0)
    rows = [
        {
            "tenant": tenant,
            "trace_id": f"{i:032x}",
            "judge_version": version,
            "app": "a",
            "judge": "llm",
            "outcome": "scored",
            "faithfulness": i / 1000,
            "judged_at": NOW,
            "record": "{}",
        }
        for i in range(700)
        for tenant, version in (("default", VERSION), ("acme", VERSION), ("default", "other/p2"))
        if (i + len(tenant) + len(version)) % 3
    ]
    with store.engine.begin() as conn:
        conn.execute(sa.insert(judgments), rows)
    stored = {(r["tenant"], r["trace_id"], r["judge_version"]): r["faithfulness"] for r in rows}
    asked = [
        (t, f"{i:032x}", v) for i in range(0, 700, 3) for t, v in (("default", VERSION), ("acme", "other/p2"))
    ]
    asked += list(stored)[:600]  # more than one IN list for a (tenant, version)
    executed: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        executed.append((statement, parameters))

    sa.event.listen(store.engine, "before_cursor_execute", record)
    try:
        found = judged.outcomes(asked)
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", record)
    assert found == {k: ("scored", stored[k]) for k in asked if k in stored}
    if store.dialect == "sqlite":
        with store.engine.connect() as conn:
            for statement, parameters in [e for e in executed if "FROM judgments" in e[0]]:
                plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).all()
                assert not any(row[-1].startswith("SCAN judgments") for row in plan), plan


def _by_key(cells: list[Any]) -> dict[tuple[Any, ...], tuple[int, float, float]]:
    return {
        (c.app, c.release, c.intent, c.stratum, c.inclusion_probability, c.outcome): (
            c.count,
            c.score_sum,
            c.score_m2,
        )
        for c in cells
    }


def test_both_readings_summed_in_one_pass_are_each_reading_alone(store: Store) -> None:
    """The gauges take both readings from one pass over the window (it is linear in the window)."""
    _, judged = fill(store, random.Random(6), 400)
    statements: list[str] = []
    sa.event.listen(store.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    both = judged.window_cells_of(NOW - WINDOW, NOW, ("claims", "answers"))
    assert len([s for s in statements if "judge_queue LEFT OUTER JOIN judgments" in s]) == 1
    for reading in ("claims", "answers"):
        alone = _by_key(judged.window_cells(NOW - WINDOW, NOW, reading=reading))
        together = _by_key(both[reading])
        assert together.keys() == alone.keys() and alone
        for key, (count, score_sum, score_m2) in alone.items():
            assert together[key] == (count, pytest.approx(score_sum), pytest.approx(score_m2, abs=1e-12))


def test_the_estimate_keeps_to_a_tenth_of_a_thread() -> None:
    assert estimate_wait_s(30.0, 0.5) == 30.0  # a quick sum: every 30 s, as configured
    for took in (4.0, 5.0, 40.0):  # a window of millions: less often, never more than a tenth busy
        wait = estimate_wait_s(30.0, took)
        assert wait > 30.0 and took / (took + wait) == pytest.approx(0.1)


def test_every_tenants_cells_come_from_one_pass(store: Store) -> None:
    """The gauges with a tenant label: one pass over the window for every tenant (a pass a tenant
    read the whole window again for each)."""
    _, judged = fill(store, random.Random(7), 400)
    statements: list[str] = []
    sa.event.listen(store.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    per_tenant = judged.window_cells_per_tenant(NOW - WINDOW, NOW, ("claims", "answers"))
    assert len([s for s in statements if "judge_queue LEFT OUTER JOIN judgments" in s]) == 1
    assert sorted(per_tenant) == ["acme", "default"]
    for tenant, cells in per_tenant.items():
        alone = judged.window_cells_of(NOW - WINDOW, NOW, ("claims", "answers"), tenant=tenant)
        for reading in ("claims", "answers"):
            assert _by_key(cells[reading]).keys() == _by_key(alone[reading]).keys()
            for key, (count, score_sum, score_m2) in _by_key(alone[reading]).items():
                assert _by_key(cells[reading])[key] == (
                    count,
                    pytest.approx(score_sum),
                    pytest.approx(score_m2, abs=1e-12),
                )
