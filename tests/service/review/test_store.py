"""`service/review/store.py` on SQLite and PostgreSQL: intake, priority, leases, reviews, progress."""

from __future__ import annotations

import random
import threading
from datetime import UTC, datetime, timedelta

import pytest

from service.config import ReviewConfig
from service.judge.judgment import Judgment
from service.judge.store import JudgmentStore
from service.review.intake import ReviewIntake
from service.review.records import QUEUES, REASONS, ClaimRefused, Intake, ItemFilters, ReviewIn
from service.review.store import ReviewStore
from service.store.trace_store import Store

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def tid(n: int) -> str:
    return f"{n:032x}"


@pytest.fixture
def reviews(store: Store) -> ReviewStore:
    opened = ReviewStore(store.engine)
    opened.create_schema()
    JudgmentStore(store.engine).create_schema()
    return opened


def test_a_trace_enters_a_queue_once_with_all_its_reasons(reviews: ReviewStore) -> None:
    first = reviews.add([Intake("a", "flagged", tid(1), "shop", "judge_failure", "timeout")], now=T0)
    again = reviews.add(
        [
            Intake("a", "flagged", tid(1), "shop", "thumbs_down", "thumbs-down"),
            Intake("a", "flagged", tid(1), "shop", "unfaithful", "2 of 3 claims unsupported"),
            Intake("a", "flagged", tid(1), "shop", "thumbs_down", "thumbs-down"),
        ],
        now=T0 + timedelta(seconds=1),
    )
    assert len(first) == 1 and again == []
    items = reviews.list_items(["a"], now=T0)
    assert [i.id for i in items] == first
    item = items[0]
    assert [r for r, _ in item.reasons] == ["unfaithful", "thumbs_down", "judge_failure"]
    assert item.severity == 50  # raised to the most severe reason
    # another queue is another item; another tenant too
    reviews.add(
        [Intake("a", "blind", tid(1), "shop", "blind_sample"), Intake("b", "flagged", tid(1), "x", "api")]
    )
    assert len(reviews.list_items(["a"])) == 2
    assert len(reviews.list_items(["a", "b"])) == 3


def _state(
    reviews: ReviewStore, tenants: list[str], prefix: str
) -> dict[tuple[str, str, str], tuple[object, ...]]:
    """Every item of `tenants` with its reasons, keyed without the tenants' `prefix`."""
    return {
        (i.tenant.removeprefix(prefix), i.queue, i.trace_id): (
            i.app,
            i.severity,
            i.diagnosis,
            i.judge_version,
            i.state,
            i.created_at,
            tuple(sorted(i.reasons, key=str)),
        )
        for i in reviews.list_items(tenants, limit=1000)
    }


def test_a_batch_leaves_what_its_entries_one_at_a_time_leave(reviews: ReviewStore) -> None:
    """`add` takes a batch in two statements; the items and reasons must be those that adding each
    entry alone, in the batch's order, gives: several reasons for one item, a reason given twice,
    diagnoses and judge versions given by some entries only, an unknown app, items stored before."""
    rng = random.Random(7)

    def entries(prefix: str, n: int, seed: int) -> list[Intake]:
        pick = random.Random(seed)
        return [
            Intake(
                f"{prefix}{pick.choice('xy')}",
                pick.choice(QUEUES),
                tid(pick.randrange(12)),
                pick.choice(("shop", "unknown", "help")),
                pick.choice(REASONS),
                pick.choice((None, "because", "2 of 3 claims unsupported")),
                pick.choice((None, "retrieval_failure", "generation_failure")),
                pick.choice((None, "v1", "v2")),
            )
            for _ in range(n)
        ]

    for prefix in ("one-", "batch-"):
        reviews.add(entries(prefix, 15, seed=1), now=T0)  # items stored before, alike on both sides
    batch_seed = rng.randrange(1 << 30)
    one_at_a_time = sorted(
        entries("one-", 80, batch_seed), key=lambda e: (e.tenant, e.queue, e.trace_id, e.reason)
    )
    created_alone = [i for e in one_at_a_time for i in reviews.add([e], now=T0 + timedelta(seconds=1))]
    created_batch = reviews.add(entries("batch-", 80, batch_seed), now=T0 + timedelta(seconds=1))
    alone = _state(reviews, ["one-x", "one-y"], "one-")
    batch = _state(reviews, ["batch-x", "batch-y"], "batch-")
    assert len(created_alone) == len(created_batch) > 0
    assert len(batch) > 15 and batch == alone
    assert any(len(item[-1]) > 1 for item in batch.values())  # items with several reasons were made
    # the same batch again adds nothing
    assert reviews.add(entries("batch-", 80, batch_seed), now=T0 + timedelta(seconds=2)) == []
    assert _state(reviews, ["batch-x", "batch-y"], "batch-") == batch


def test_priority_is_severity_then_recency_and_filters_apply(reviews: ReviewStore) -> None:
    reviews.add([Intake("a", "flagged", tid(1), "shop", "judge_failure")], now=T0)
    reviews.add(
        [Intake("a", "flagged", tid(2), "shop", "unfaithful", diagnosis="generation_failure")], now=T0
    )
    reviews.add(
        [Intake("a", "flagged", tid(3), "bank", "unfaithful", diagnosis="retrieval_failure")],
        now=T0 + timedelta(minutes=1),
    )
    reviews.add([Intake("a", "flagged", tid(4), "bank", "thumbs_down")], now=T0 + timedelta(minutes=2))
    order = [i.trace_id for i in reviews.list_items(["a"], now=T0)]
    assert order == [tid(3), tid(2), tid(4), tid(1)]
    assert [i.trace_id for i in reviews.list_items(["a"], ItemFilters(app="bank"))] == [tid(3), tid(4)]
    assert [i.trace_id for i in reviews.list_items(["a"], ItemFilters(reason="thumbs_down"))] == [tid(4)]
    by_diagnosis = reviews.list_items(["a"], ItemFilters(diagnosis="retrieval_failure"))
    assert [i.trace_id for i in by_diagnosis] == [tid(3)]
    assert reviews.apps(["a"]) == ["bank", "shop"]


def test_a_leased_item_cannot_be_claimed_by_another_reviewer_until_the_lease_expires(
    reviews: ReviewStore,
) -> None:
    [item_id] = reviews.add([Intake("a", "flagged", tid(1), "shop", "unfaithful")], now=T0)
    held = reviews.claim(item_id, "alice", ["a"], lease_s=60, now=T0)
    assert held is not None and held.state == "claimed" and held.reviewer == "alice"
    with pytest.raises(ClaimRefused) as refused:
        reviews.claim(item_id, "bob", ["a"], lease_s=60, now=T0 + timedelta(seconds=30))
    assert refused.value.reviewer == "alice"
    assert reviews.claim_next("bob", ["a"], 60, now=T0 + timedelta(seconds=30)) is None
    # alice renews; after her lease runs out the item is open again and bob gets it
    reviews.claim(item_id, "alice", ["a"], lease_s=60, now=T0 + timedelta(seconds=50))
    assert reviews.get(item_id, ["a"], now=T0 + timedelta(seconds=100)).state == "claimed"  # type: ignore[union-attr]
    late = T0 + timedelta(seconds=111)
    assert reviews.get(item_id, ["a"], now=late).state == "open"  # type: ignore[union-attr]
    assert reviews.progress(["a"], now=late).items == {("flagged", "open"): 1}
    taken = reviews.claim_next("bob", ["a"], 60, now=late)
    assert taken is not None and taken.id == item_id and taken.reviewer == "bob"
    # alice's expired lease no longer lets her submit: bob holds the item
    with pytest.raises(ClaimRefused):
        reviews.submit(item_id, "alice", ["a"], ReviewIn("faithful"), now=late)


def test_concurrent_claims_never_hand_one_item_to_two_reviewers(reviews: ReviewStore) -> None:
    ids = reviews.add([Intake("a", "flagged", tid(n), "shop", "unfaithful") for n in range(6)])
    won: dict[str, list[int]] = {}
    start = threading.Barrier(6)

    def reviewer(name: str) -> None:
        start.wait()
        got = reviews.claim_next(name, ["a"], 60)
        won[name] = [] if got is None else [got.id]

    threads = [threading.Thread(target=reviewer, args=(f"r{n}",)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    taken = [i for got in won.values() for i in got]
    assert len(taken) == len(set(taken))  # nobody shares an item
    assert set(taken) <= set(ids)
    states = {i.id: i.reviewer for i in reviews.list_items(["a"]) if i.state == "claimed"}
    assert sorted(states) == sorted(taken)


def test_a_reviewer_of_one_tenant_cannot_see_or_claim_another_tenants_item(reviews: ReviewStore) -> None:
    [item_id] = reviews.add([Intake("b", "flagged", tid(1), "shop", "unfaithful")])
    assert reviews.get(item_id, ["a"]) is None
    assert reviews.claim(item_id, "alice", ["a"], 60) is None
    assert reviews.submit(item_id, "alice", ["a"], ReviewIn("faithful")) is None
    assert reviews.list_items(["a"]) == []


def test_one_review_closes_the_item_and_one_item_per_reviewer(reviews: ReviewStore) -> None:
    first, second = reviews.add(
        [Intake("a", "flagged", tid(1), "shop", "unfaithful"), Intake("a", "flagged", tid(2), "shop", "api")]
    )  # applied in trace id order
    reviews.claim(first, "alice", ["a"], 60)
    reviews.claim(second, "alice", ["a"], 60)  # gives the first back
    assert reviews.get(first, ["a"]).state == "open"  # type: ignore[union-attr]
    with pytest.raises(ClaimRefused):
        reviews.submit(first, "alice", ["a"], ReviewIn("faithful"))
    review = ReviewIn(
        "unfaithful",
        failure_mode="fabrication",
        expected_chunk_ids=("c1", "c9"),
        reference_answer="It is 42.",
        category="billing",
        expected_behaviour="answer",
        note="the number is made up",
    )
    record = reviews.submit(second, "alice", ["a"], review)
    assert record is not None and record.review == review
    assert reviews.get(second, ["a"]).state == "done"  # type: ignore[union-attr]
    assert reviews.review_of(second) == record
    with pytest.raises(ClaimRefused) as refused:
        reviews.claim(second, "bob", ["a"], 60)
    assert refused.value.state == "done"
    # a new reason for a done item is listed but does not reopen it
    reviews.add([Intake("a", "flagged", tid(2), "shop", "thumbs_down")])
    assert reviews.get(second, ["a"]).state == "done"  # type: ignore[union-attr]
    progress = reviews.progress(["a"])
    assert progress.items == {("flagged", "open"): 1, ("flagged", "done"): 1}
    assert progress.reviewers == {("alice", "done"): 1}
    assert [r.trace_id for r in reviews.list_reviews(["a"])] == [tid(2)]
    assert reviews.list_reviews(["a"], since=datetime.now(UTC) + timedelta(hours=1)) == []


def test_a_blind_item_is_not_given_to_someone_who_reviewed_the_trace_with_the_judge_shown(
    reviews: ReviewStore,
) -> None:
    reviews.add(
        [
            Intake("a", "flagged", tid(1), "shop", "unfaithful"),
            Intake("a", "blind", tid(1), "shop", "blind_sample"),
        ]
    )
    flagged = reviews.find("a", "flagged", tid(1)).id  # type: ignore[union-attr]
    blind = reviews.find("a", "blind", tid(1)).id  # type: ignore[union-attr]
    reviews.claim(flagged, "alice", ["a"], 60)
    reviews.submit(flagged, "alice", ["a"], ReviewIn("unfaithful"))
    with pytest.raises(ClaimRefused):
        reviews.claim(blind, "alice", ["a"], 60)
    assert reviews.claim_next("alice", ["a"], 60) is None
    assert reviews.claim(blind, "bob", ["a"], 60) is not None


def test_oldest_open_age_and_per_reviewer_progress(reviews: ReviewStore) -> None:
    reviews.add([Intake("a", "flagged", tid(1), "shop", "unfaithful")], now=T0)
    reviews.add([Intake("a", "flagged", tid(2), "shop", "unfaithful")], now=T0 + timedelta(minutes=5))
    reviews.add([Intake("a", "blind", tid(3), "shop", "blind_sample")], now=T0 + timedelta(minutes=7))
    now = T0 + timedelta(minutes=10)
    reviews.claim_next("bob", ["a"], 600, ItemFilters(queue="flagged"), now=now)
    progress = reviews.progress(["a"], now=now)
    assert progress.items == {("flagged", "open"): 1, ("flagged", "claimed"): 1, ("blind", "open"): 1}
    assert progress.reviewers == {("bob", "claimed"): 1}
    ages = progress.to_json(now)["queues"]
    # bob got the newer flagged item (same severity, newer first): the oldest open one is 10 min old
    assert ages["flagged"]["oldest_open_age_s"] == pytest.approx(600)
    assert ages["blind"]["oldest_open_age_s"] == pytest.approx(180)


def _judgment(trace_id: str, unsupported: int, version: str = "v1") -> Judgment:
    claims = ("a", "b", "c")
    return Judgment(
        trace_id=trace_id,
        tenant="a",
        app="shop",
        judge="heuristic",
        judge_version=version,
        outcome="scored",
        faithfulness=(3 - unsupported) / 3,
        claims=claims,
        supported=tuple(range(3 - unsupported)),
        unsupported=tuple(range(3 - unsupported, 3)),
        failure_mode="none" if unsupported == 0 else "fabrication",
        context_sufficient=True,
        diagnosis="ok" if unsupported == 0 else "generation_failure",
        rationale="r",
        judged_at=T0,
    )


async def test_intake_of_judgments_is_idempotent_and_calibration_pairs_join(
    store: Store, reviews: ReviewStore
) -> None:
    judgments = JudgmentStore(store.engine)
    intake = ReviewIntake(ReviewConfig(blind_rate=1.0), flag_threshold=0.5, store=reviews)
    bad = _judgment(tid(1), unsupported=2)
    good = _judgment(tid(2), unsupported=0)
    for judgment in (bad, good, bad):
        judgments.save(judgment, 0.5)
        await intake.after_judgment(judgment)
    items = {(i.queue, i.trace_id): i for i in reviews.list_items(["a"])}
    assert set(items) == {("flagged", tid(1)), ("blind", tid(1)), ("blind", tid(2))}
    assert {r for r, _ in items[("flagged", tid(1))].reasons} == {"unfaithful", "low_faithfulness"}
    assert items[("flagged", tid(1))].diagnosis == "generation_failure"
    blind = items[("blind", tid(2))]
    reviews.claim(blind.id, "alice", ["a"], 60)
    reviews.submit(blind.id, "alice", ["a"], ReviewIn("unfaithful"))
    [row] = reviews.calibration_rows(["a"])
    assert (row.queue, row.judge_version, row.judge_outcome, row.verdict) == (
        "blind",
        "v1",
        "scored",
        "unfaithful",
    )
    assert row.judge_faithfulness == 1.0
    assert reviews.calibration_rows(["b"]) == []


def test_the_reviewer_who_labelled_an_item_may_label_it_again_and_the_later_label_wins(
    reviews: ReviewStore,
) -> None:
    [item_id] = reviews.add([Intake("a", "blind", tid(1), "shop", "blind_sample")], now=T0)
    reviews.claim(item_id, "alice", ["a"], 60)
    first = reviews.submit(item_id, "alice", ["a"], ReviewIn("faithful"), now=T0)
    assert first is not None and not first.replaced
    again = ReviewIn("unfaithful", claims_supported=(True, False))
    second = reviews.submit(item_id, "alice", ["a"], again, now=T0 + timedelta(minutes=5))
    assert second is not None and second.replaced
    [stored] = reviews.list_reviews(["a"])
    assert stored.review == again and stored.created_at == T0 + timedelta(minutes=5)
    assert reviews.review_of(item_id) == stored
    # marks dropped by a later label without marks
    reviews.submit(item_id, "alice", ["a"], ReviewIn("unfaithful"))
    assert reviews.review_of(item_id).review.claims_supported is None  # type: ignore[union-attr]
    # nobody else may overwrite it, and another tenant's reviewer does not see it
    with pytest.raises(ClaimRefused):
        reviews.submit(item_id, "bob", ["a"], ReviewIn("faithful"))
    assert reviews.submit(item_id, "alice", ["b"], ReviewIn("faithful")) is None
    assert len(reviews.list_reviews(["a"])) == 1


def test_claim_marks_and_the_claim_level_label() -> None:
    assert ReviewIn("unfaithful", claims_supported=(True, False, True, True)).claim_share() == 0.75
    assert ReviewIn("faithful").claim_share() == 1.0  # faithful: no unsupported claim
    assert ReviewIn("unfaithful").claim_share() is None
    assert ReviewIn("unsure").claim_share() is None
    assert ReviewIn("unsure", claims_supported=(False, True)).claim_share() == 0.5
    assert ReviewIn("faithful", claims_supported=()).claim_share() is None
    with pytest.raises(ValueError, match="every claim is supported"):
        ReviewIn("faithful", claims_supported=(True, False))
    with pytest.raises(ValueError, match="true or false"):
        ReviewIn("unfaithful", claims_supported=(1, 0))  # type: ignore[arg-type]


def test_the_blind_rate_can_be_set_per_app() -> None:
    intake = ReviewIntake(
        ReviewConfig(blind_rate=0.0, blind_rates={"shop": 1.0, "docs": 0.25}),
        0.5,
        None,  # type: ignore[arg-type]
    )
    ids = [tid(n) for n in range(2000)]
    assert all(intake.in_blind_sample("a", i, "shop") for i in ids)
    assert not any(intake.in_blind_sample("a", i, "bank") for i in ids)
    docs = sum(intake.in_blind_sample("a", i, "docs") for i in ids)
    assert 400 < docs < 600  # 500 expected; the draw is fixed by the trace id
    assert docs == sum(intake.in_blind_sample("a", i, "docs") for i in ids)
