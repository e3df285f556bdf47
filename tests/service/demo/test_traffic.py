"""The demo's traffic plan: determinism, and the rates of what users do, over seeds."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from service.demo.corpus import word_set
from service.demo.traffic import LOCAL_MODEL, plan_traffic


def _wilson(k: int, n: int, z: float = 3.29) -> tuple[float, float]:
    """99.9 % Wilson score interval for k successes in n trials."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def test_same_seed_same_plan_other_seed_other_plan() -> None:
    first = list(plan_traffic(200, seed=4, shift_after=100))
    assert first == list(plan_traffic(200, seed=4, shift_after=100))
    assert [p.query for p in first] != [p.query for p in plan_traffic(200, seed=5, shift_after=100)]


def test_arguments_are_checked_before_any_request_is_drawn() -> None:
    with pytest.raises(ValueError):
        plan_traffic(0, seed=0)
    with pytest.raises(ValueError):
        plan_traffic(10, seed=0, shift_after=-3)
    with pytest.raises(ValueError):
        plan_traffic(10, seed=0, dim=4)


def test_reasks_are_near_identical_and_regenerations_repeat_the_question() -> None:
    plans = list(plan_traffic(1500, seed=21))
    by_index = {p.index: p for p in plans}
    last_in_session: dict[str, str] = {}
    kinds: Counter[str] = Counter()
    for p in plans:
        kinds[p.kind] += 1
        previous = last_in_session.get(p.session_id)
        if p.kind == "reask":
            assert previous is not None and previous != p.query
            a, b = word_set(previous), word_set(p.query)
            assert len(a & b) / len(a | b) >= 0.8
        elif p.kind == "regenerate":
            assert p.regenerates is not None and by_index[p.regenerates].query == p.query == previous
            assert p.regeneration_signal in ("attribute", "feedback")
        elif previous is not None:
            a, b = word_set(previous), word_set(p.query)
            assert len(a & b) / len(a | b) < 0.8
        last_in_session[p.session_id] = p.query
    assert kinds["reask"] > 0 and kinds["regenerate"] > 0


def test_unhappy_users_give_thumbs_down_more_often_over_seeds() -> None:
    counts = Counter()
    for seed in range(3):
        for p in plan_traffic(1000, seed=seed):
            unhappy = p.bad_retrieval or not p.faithful
            counts[(unhappy, "n")] += 1
            counts[(unhappy, "down")] += p.rating == "down"
    low_bad, _ = _wilson(counts[(True, "down")], counts[(True, "n")])
    _, high_good = _wilson(counts[(False, "down")], counts[(False, "n")])
    assert low_bad > high_good


def test_bad_retrieval_and_the_topic_shift_lower_top1_scores_over_seeds() -> None:
    for seed in range(3):
        plans = list(plan_traffic(1200, seed=seed, shift_after=600))
        before = [p for p in plans[:600] if not p.bad_retrieval]
        bad = [p for p in plans[:600] if p.bad_retrieval]
        shifted = [p for p in plans[600:] if p.shifted]
        good_top = np.mean([p.documents[0].score for p in before])
        assert np.mean([p.documents[0].score for p in bad]) < good_top
        assert np.mean([p.documents[0].score for p in shifted]) < good_top
        assert not any(p.shifted for p in plans[:600])
        assert {p.release for p in plans[600:] if p.app == "support-bot"} == {"2.4.0"}


def test_models_tokens_and_stage_times_are_plausible() -> None:
    plans = list(plan_traffic(800, seed=8))
    models = Counter(p.model for p in plans)
    # the unpriced local model is drawn with probability 0.08
    low, high = _wilson(models[LOCAL_MODEL], len(plans))
    assert low <= 0.08 <= high
    for p in plans:
        t = p.times
        assert 0 < t.ttft_ns < t.generation_ns
        assert (t.rerank_ns > 0) == bool(p.reranked)
        assert t.total_ns > t.embedding_ns + t.retrieval_ns + t.generation_ns
        assert p.prompt_tokens > p.completion_tokens > 0
        assert len(p.documents) == 5 and len(p.reranked) in (0, 3)
        assert all(0 <= d.score <= 1 for d in p.documents + p.reranked)


def test_the_offline_judge_flags_exactly_the_answers_the_demo_made_unfaithful() -> None:
    """The default judge on the demo's own answers: every planted claim is caught, refusals make no
    claim, and every faithful answer is judged faithful (so the demo's faithfulness gauges mean
    something). One used to be flagged: a title with a colon in it ("Account: two-factor login")
    ended its "According to ...:" prefix early, and the rest read as a contradiction."""
    from service.judge.heuristic import HeuristicJudge

    judge = HeuristicJudge()
    outcomes: Counter[tuple[bool, str]] = Counter()
    for p in plan_traffic(300, seed=0, shift_after=150):
        context = p.reranked or p.documents
        verdict = judge.verdict(p.query, [d.content for d in context] + [d.title for d in context], p.answer)
        outcomes[(p.faithful, "unfaithful" if verdict.unsupported else verdict.outcome)] += 1
    assert outcomes == {
        (True, "scored"): 216,
        (True, "no_claims"): 31,
        (False, "unfaithful"): 53,
    }
