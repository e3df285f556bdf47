"""Tests of service/probes/retrieval_metrics.py: trec_eval's own outputs, pytrec_eval on random data"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Callable

import pytest

from service.probes.golden import parse_golden
from service.probes.retrieval_metrics import (
    SLICES,
    Evaluation,
    QueryTarget,
    average_precision,
    evaluate,
    hit_rate_at,
    metric_names,
    ndcg_at,
    precision_at,
    recall_at,
    reciprocal_rank,
    score_query,
    targets_from_golden,
    targets_from_qrels,
)
from service.probes.trec import read_qrels, read_run
from tests.service.probes.trec_eval_oracle import TOLERANCE, our_key, parse_trec_eval_output, trec_eval_dir

# (trec_eval output, qrels, run, relevance level -l, -c) as trec_eval's test directory produced them.
ORACLE_CASES = [
    ("out.test.aq", "qrels.test", "results.test", 1, False),
    ("out.test.aql", "qrels.rel_level", "results.test", 2, False),
    ("out.test.aqc", "qrels.test", "results.trunc", 1, True),
]


def _ours(
    output: str, qrels_name: str, run_name: str, level: int, complete: bool
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """Our values, keyed by trec_eval measure name, for each query and for "all" (the mean)."""
    directory = trec_eval_dir()
    expected = parse_trec_eval_output(directory / output)
    qrels = read_qrels(directory / qrels_name)
    run = read_run(directory / run_name)
    keys = {m: our_key(m) for row in expected.values() for m in row}
    ks = sorted({k for key in keys.values() if key is not None and key[1] is not None for k in [key[1]]})
    evaluation = evaluate(run, targets_from_qrels(qrels), ks=ks, relevance_level=level, complete=complete)
    ours: dict[str, dict[str, float]] = {}
    for qid, result in evaluation.per_query.items():
        row: dict[str, float] = {"num_rel": result.num_rel, "num_ret": result.num_ret}
        gains = {doc: float(max(grade, 0)) for doc, grade in qrels[qid].items()}
        row["ndcg"] = ndcg_at(run.get(qid, ()), gains)
        for measure, key in keys.items():
            if key is not None and key[1] is not None:
                row[measure] = result.scores[f"{key[0]}@{key[1]}"]
            elif key is not None and key[0] != "ndcg":
                row[measure] = result.scores[key[0]]
        ours[qid] = row
    measures = set(next(iter(ours.values())))
    ours["all"] = {
        m: math.fsum(ours[q][m] for q in evaluation.per_query) / len(evaluation.per_query) for m in measures
    }
    ours["all"]["num_rel"] *= len(evaluation.per_query)
    ours["all"]["num_ret"] *= len(evaluation.per_query)
    return expected, ours


@pytest.mark.parametrize(("output", "qrels_name", "run_name", "level", "complete"), ORACLE_CASES)
def test_matches_trec_eval_outputs(
    output: str, qrels_name: str, run_name: str, level: int, complete: bool
) -> None:
    expected, ours = _ours(output, qrels_name, run_name, level, complete)
    compared = 0
    for qid, row in expected.items():
        for measure, value in row.items():
            if measure in ours[qid]:
                assert ours[qid][measure] == pytest.approx(value, abs=TOLERANCE), (output, qid, measure)
                compared += 1
    # Every measure we implement, for each of 3 queries and the mean: P, recall, ndcg_cut at 9 cutoffs,
    # success at 3, map, recip_rank, ndcg, num_rel, num_ret.
    assert compared == 4 * (3 * 9 + 3 + 5)


@pytest.mark.parametrize(("mode", "level"), [("binary", 1), ("graded", 2)])
def test_matches_expected_metrics_json(mode: str, level: int) -> None:
    directory = trec_eval_dir()
    spec = json.loads((directory / "expected_metrics.json").read_text(encoding="utf-8"))[mode]
    qrels = read_qrels(directory / spec["qrels"])
    run = read_run(directory / spec["run"])
    ks = (1, 5, 10, 20, 100, 1000)
    evaluation = evaluate(run, targets_from_qrels(qrels), ks=ks, relevance_level=level)
    assert set(evaluation.per_query) == set(spec["per_query"])
    compared = 0
    for qid, values in spec["per_query"].items():
        for measure, value in values.items():
            key = our_key(measure)
            if key is None or key[1] is None:
                continue
            got = evaluation.per_query[qid].scores[f"{key[0]}@{key[1]}"]
            assert got == pytest.approx(value, abs=TOLERANCE), (qid, measure)
            mean = evaluation.mean[f"{key[0]}@{key[1]}"]
            assert mean == pytest.approx(spec["mean"][measure], abs=TOLERANCE), measure
            compared += 1
        assert evaluation.per_query[qid].scores["average_precision"] == pytest.approx(
            values["map"], abs=TOLERANCE
        )
        assert evaluation.per_query[qid].scores["reciprocal_rank"] == pytest.approx(
            values["recip_rank"], abs=TOLERANCE
        )
    assert evaluation.mean["average_precision"] == pytest.approx(spec["mean"]["map"], abs=TOLERANCE)
    assert evaluation.mean["reciprocal_rank"] == pytest.approx(spec["mean"]["recip_rank"], abs=TOLERANCE)
    assert compared == 3 * (4 + 5 + 4 + 3)  # P, recall, ndcg_cut, success cutoffs in the file


def _random_case(rng: random.Random) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, float]]]:
    """Random graded qrels (grades -1..4) and scored runs with deliberate score ties."""
    qrels: dict[str, dict[str, int]] = {}
    scores: dict[str, dict[str, float]] = {}
    for q in range(rng.randint(1, 8)):
        qid = f"q{q}"
        pool = [f"d{rng.randint(0, 99):02d}x{i}" for i in range(rng.randint(5, 60))]
        judged = rng.sample(pool, rng.randint(1, len(pool)))
        qrels[qid] = {doc: rng.choice([-1, 0, 0, 1, 1, 2, 3, 4]) for doc in judged}
        qrels[qid][rng.choice(judged)] = 4  # at least one id relevant at every level used below
        retrieved = rng.sample(pool, rng.randint(0, len(pool)))
        # Few distinct scores, so ties are common and the docno tie-break is exercised.
        scores[qid] = {doc: float(rng.randint(0, 6)) / 2 for doc in retrieved}
    return qrels, scores


def _ranked(scores: dict[str, float]) -> tuple[str, ...]:
    return tuple(doc for doc, _ in sorted(scores.items(), key=lambda item: (item[1], item[0]), reverse=True))


@pytest.mark.parametrize("seed", range(40))
def test_agrees_with_pytrec_eval_on_random_runs(seed: int) -> None:
    pytrec_eval = pytest.importorskip(
        "pytrec_eval", reason="cross-check needs pytrec-eval-terrier (test extra)"
    )
    rng = random.Random(seed)
    qrels, scores = _random_case(rng)
    level = rng.choice([1, 2, 3])
    ks = (1, 3, 5, 10, 20)
    cut = ",".join(map(str, ks))
    measures = {f"P.{cut}", f"recall.{cut}", f"success.{cut}", f"ndcg_cut.{cut}", "map", "recip_rank"}
    graded = pytrec_eval.RelevanceEvaluator(qrels, measures, relevance_level=level).evaluate(scores)
    binary_qrels = {q: {d: int(g >= level) for d, g in judged.items()} for q, judged in qrels.items()}
    binary = pytrec_eval.RelevanceEvaluator(binary_qrels, {f"ndcg_cut.{cut}"}).evaluate(scores)
    rankings = {qid: _ranked(s) for qid, s in scores.items()}
    evaluation = evaluate(rankings, targets_from_qrels(qrels), ks=ks, relevance_level=level, complete=True)
    assert set(evaluation.per_query) == set(graded)
    for qid, theirs in graded.items():
        ours = evaluation.per_query[qid].scores
        for k in ks:
            assert ours[f"precision@{k}"] == pytest.approx(theirs[f"P_{k}"], abs=1e-9)
            assert ours[f"recall@{k}"] == pytest.approx(theirs[f"recall_{k}"], abs=1e-9)
            assert ours[f"hit_rate@{k}"] == pytest.approx(theirs[f"success_{k}"], abs=1e-9)
            assert ours[f"ndcg@{k}"] == pytest.approx(theirs[f"ndcg_cut_{k}"], abs=1e-9)
            assert ours[f"ndcg_binary@{k}"] == pytest.approx(binary[qid][f"ndcg_cut_{k}"], abs=1e-9)
        assert ours["average_precision"] == pytest.approx(theirs["map"], abs=1e-9)
        assert ours["reciprocal_rank"] == pytest.approx(theirs["recip_rank"], abs=1e-9)


def _random_query(rng: random.Random) -> tuple[list[str], dict[str, int]]:
    pool = [f"c{i}" for i in range(rng.randint(2, 40))]
    grades = {doc: rng.randint(0, 3) for doc in rng.sample(pool, rng.randint(1, len(pool)))}
    grades[rng.choice(list(grades))] = rng.randint(1, 3)
    return rng.sample(pool, rng.randint(0, len(pool))), grades


@pytest.mark.parametrize("seed", range(200))
def test_properties_on_random_queries(seed: int) -> None:
    rng = random.Random(seed)
    ranking, grades = _random_query(rng)
    ks = (1, 2, 3, 5, 8, 13, 50)
    scores = score_query(ranking, grades, ks)
    assert all(0.0 <= value <= 1.0 for value in scores.values())
    relevant = {doc for doc, grade in grades.items() if grade >= 1}
    for smaller, larger in itertools.pairwise(ks):
        assert scores[f"recall@{smaller}"] <= scores[f"recall@{larger}"]
        assert scores[f"hit_rate@{smaller}"] <= scores[f"hit_rate@{larger}"]
    for k in ks:
        hits = sum(1 for doc in ranking[:k] if doc in relevant)
        assert scores[f"precision@{k}"] * k == pytest.approx(hits)
        assert scores[f"hit_rate@{k}"] == (1.0 if hits else 0.0)
    # The ideal ordering scores nDCG 1 at every cutoff, graded and binary.
    ideal = sorted(grades, key=lambda doc: grades[doc], reverse=True)
    best = score_query(ideal, grades, ks)
    for k in ks:
        assert best[f"ndcg@{k}"] == pytest.approx(1.0)
        assert best[f"ndcg_binary@{k}"] == pytest.approx(1.0)
    assert best["average_precision"] == pytest.approx(1.0)
    assert best["reciprocal_rank"] == 1.0


def test_single_metric_functions_agree_with_score_query() -> None:
    rng = random.Random(7)
    for _ in range(50):
        ranking, grades = _random_query(rng)
        relevant = {doc for doc, grade in grades.items() if grade >= 2}
        if not relevant:
            continue
        scores = score_query(ranking, grades, (3, 10), relevance_level=2)
        for k in (3, 10):
            assert precision_at(ranking, relevant, k) == scores[f"precision@{k}"]
            assert recall_at(ranking, relevant, k) == scores[f"recall@{k}"]
            assert hit_rate_at(ranking, relevant, k) == scores[f"hit_rate@{k}"]
            assert (
                ndcg_at(ranking, {d: float(max(g, 0)) for d, g in grades.items()}, k) == scores[f"ndcg@{k}"]
            )
        assert reciprocal_rank(ranking, relevant) == scores["reciprocal_rank"]
        assert average_precision(ranking, relevant) == scores["average_precision"]


def test_first_relevant_at_third_rank() -> None:
    ranking = ["a", "b", "c", "d"]
    assert reciprocal_rank(ranking, {"c", "d"}) == pytest.approx(1 / 3)
    assert average_precision(ranking, {"c", "d", "z"}) == pytest.approx((1 / 3 + 2 / 4) / 3)
    # Precision divides by k even when fewer than k ids were retrieved, as trec_eval does.
    assert precision_at(ranking, {"c"}, 10) == pytest.approx(1 / 10)


@pytest.mark.parametrize(
    "call",
    [
        lambda r: precision_at(r, {"a"}, 5),
        lambda r: recall_at(r, {"a"}, 5),
        lambda r: hit_rate_at(r, {"a"}, 5),
        lambda r: reciprocal_rank(r, {"a"}),
        lambda r: average_precision(r, {"a"}),
        lambda r: ndcg_at(r, {"a": 1.0}, 5),
        lambda r: score_query(r, {"a": 1}, (5,)),
    ],
)
def test_duplicate_ids_are_rejected_not_counted_twice(call: Callable[[list[str]], object]) -> None:
    with pytest.raises(ValueError, match=r"'a' twice \(ranks 1 and 3\)"):
        call(["a", "b", "a"])


def test_evaluate_names_the_query_with_a_duplicate() -> None:
    with pytest.raises(ValueError, match=r"query 'q2'.*'x' twice"):
        evaluate({"q1": ["x"], "q2": ["x", "y", "x"]}, targets_from_qrels({"q1": {"x": 1}, "q2": {"x": 1}}))


def test_undefined_denominators_raise_and_defined_ones_are_zero() -> None:
    for undefined in (
        lambda: recall_at(["a"], set(), 1),
        lambda: average_precision(["a"], set()),
        lambda: ndcg_at(["a"], {"a": 0.0}),
        lambda: score_query(["a"], {"a": 1}, (1,), relevance_level=2),
    ):
        with pytest.raises(ValueError, match="undefined"):
            undefined()
    assert precision_at(["a"], set(), 1) == 0.0
    assert hit_rate_at(["a"], set(), 1) == 0.0
    assert reciprocal_rank(["a"], set()) == 0.0


def test_argument_checks() -> None:
    with pytest.raises(ValueError, match="k must be at least 1"):
        precision_at(["a"], {"a"}, 0)
    with pytest.raises(TypeError, match="k must be an int"):
        precision_at(["a"], {"a"}, True)
    with pytest.raises(TypeError, match="not one string"):
        recall_at("abc", {"a"}, 1)
    with pytest.raises(ValueError, match="gain of 'a'"):
        ndcg_at(["a"], {"a": -1.0})
    with pytest.raises(ValueError, match="relevance_level must be at least 1"):
        score_query(["a"], {"a": 1}, (1,), relevance_level=0)
    with pytest.raises(ValueError, match="non-empty and distinct"):
        evaluate({}, [], ks=(5, 5))
    with pytest.raises(ValueError, match="two targets"):
        evaluate({}, [QueryTarget("q", {"a": 1}), QueryTarget("q", {"b": 1})])


_ROWS = [
    {
        "question_id": "ok",
        "question": "q?",
        "category": "billing",
        "gold_chunks": [{"chunk_id": "c1"}, {"chunk_id": "c2", "relevance": 2}],
    },
    {"question_id": "ok2", "question": "q?", "gold_chunks": [{"chunk_id": "c5"}], "category": "billing"},
    {"question_id": "other_cat", "question": "q?", "gold_chunks": [{"chunk_id": "c9"}], "category": "login"},
    {
        "question_id": "clarify",
        "question": "q?",
        "expected_behaviour": "clarify",
        "gold_chunks": [{"chunk_id": "c1"}],
    },
    {"question_id": "refuse", "question": "q?", "expected_behaviour": "deny"},
    {"question_id": "unanswerable", "question": "q?", "expected_behaviour": "no_answer"},
    {"question_id": "unlabelled", "question": "q?"},
    {"question_id": "private", "question": "q?", "tenants": ["globex"], "gold_chunks": [{"chunk_id": "c7"}]},
    {"question_id": "unasked", "question": "q?", "gold_chunks": [{"chunk_id": "c8"}]},
]
GOLDEN = "".join(json.dumps(row) + "\n" for row in _ROWS)


def _golden_evaluation(complete: bool = False) -> tuple[dict[str, list[str]], Evaluation]:
    rankings = {
        "ok": ["x", "c2", "c1"],
        "ok2": ["y"],
        "other_cat": ["c9"],
        "clarify": ["c1"],
        "refuse": ["c1"],
        "unanswerable": [],
        "unlabelled": ["c1"],
        "private": ["c7"],
        "stray": ["c1"],
    }
    targets = targets_from_golden(parse_golden(GOLDEN.splitlines()), "acme")
    return rankings, evaluate(rankings, targets, ks=(1, 3), complete=complete)


def test_every_question_lands_in_exactly_one_slice() -> None:
    _, evaluation = _golden_evaluation()
    slices = evaluation.slices
    assert tuple(slices) == SLICES
    assert slices["scored"] == ("ok", "ok2", "other_cat")
    assert slices["clarify"] == ("clarify",)
    assert slices["deny"] == ("refuse",)
    assert slices["no_answer"] == ("unanswerable",)
    assert slices["no_gold"] == ("unlabelled",)
    assert slices["no_eligible_gold"] == ("private",)
    assert slices["not_in_run"] == ("unasked",)
    assert slices["not_in_gold"] == ("stray",)
    questions = [qid for name, ids in slices.items() if name != "not_in_gold" for qid in ids]
    assert sorted(questions) == sorted(parse_golden(GOLDEN.splitlines()).questions)


def test_means_are_over_the_scored_slice_only() -> None:
    rankings, evaluation = _golden_evaluation()
    names = metric_names((1, 3))
    golden = parse_golden(GOLDEN.splitlines())
    per_query = {
        qid: score_query(rankings[qid], golden.questions[qid].eligible_grades("acme"), (1, 3))
        for qid in ("ok", "ok2", "other_cat")
    }
    for name in names:
        expected = sum(scores[name] for scores in per_query.values()) / 3
        assert evaluation.mean[name] == pytest.approx(expected)
    # A question not answered by design or without eligible gold would have pulled recall down as zeros.
    assert evaluation.mean["recall@3"] > sum(s["recall@3"] for s in per_query.values()) / 7
    summaries = {c.category: c for c in evaluation.per_category}
    assert summaries["billing"].count == 2
    assert summaries["billing"].mean["recall@3"] == pytest.approx(
        (per_query["ok"]["recall@3"] + per_query["ok2"]["recall@3"]) / 2
    )
    assert summaries["login"].mean["hit_rate@1"] == 1.0


def test_complete_scores_missing_questions_as_empty_rankings() -> None:
    _, evaluation = _golden_evaluation(complete=True)
    assert "unasked" in evaluation.slices["scored"]
    assert evaluation.slices["not_in_run"] == ()
    result = evaluation.per_query["unasked"]
    assert result.num_ret == 0
    assert all(value == 0.0 for value in result.scores.values())


def test_relevance_level_moves_questions_without_gold_at_that_level() -> None:
    targets = targets_from_qrels({"q1": {"a": 1, "b": 2}, "q2": {"c": 1}})
    evaluation = evaluate({"q1": ["a", "b"], "q2": ["c"]}, targets, ks=(1,), relevance_level=2)
    assert evaluation.slices["scored"] == ("q1",)
    assert evaluation.slices["no_gold"] == ("q2",)
    assert evaluation.per_query["q1"].num_rel == 1
    assert evaluation.per_query["q1"].scores["precision@1"] == 0.0


def test_false_exclusion_rate_uses_the_original_eligible_gold() -> None:
    targets = [
        QueryTarget("all_gold_excluded", {"g1": 1, "g2": 1}),
        QueryTarget("some_excluded", {"g1": 1, "g2": 1}),
        QueryTarget("no_log", {"g1": 1}),
        QueryTarget("ineligible_excluded", {"g1": 1}, ineligible={"h": 1}),
        QueryTarget("eligible_excluded", {"g1": 1}, ineligible={"h": 1}),
        QueryTarget("asks_back", {"g1": 1}, behaviour="clarify"),
    ]
    excluded = {
        "all_gold_excluded": ["g1", "g2", "noise"],
        "some_excluded": ["g1"],
        "ineligible_excluded": ["h"],
        "eligible_excluded": ["g1"],
        "asks_back": ["g1"],
    }
    rankings = {qid: ["noise", "g9"] for qid in excluded} | {"no_log": ["g1"]}
    evaluation = evaluate(rankings, targets, ks=(5,), excluded=excluded)
    fer = evaluation.false_exclusion
    assert fer.denominator == 4  # scoreable questions whose exclusions were logged
    assert fer.query_ids == ("all_gold_excluded", "eligible_excluded")
    assert fer.rate == pytest.approx(2 / 4)
    # The excluded gold still counts as missed: recall is against the original gold, not zero-over-zero.
    assert evaluation.per_query["all_gold_excluded"].num_rel == 2
    assert evaluation.per_query["all_gold_excluded"].scores["recall@5"] == 0.0


def test_false_exclusion_rate_is_none_without_logs() -> None:
    evaluation = evaluate({"q": ["a"]}, [QueryTarget("q", {"a": 1})], ks=(1,))
    assert evaluation.false_exclusion.denominator == 0
    assert evaluation.false_exclusion.rate is None


def test_to_dict_states_the_denominators_and_is_json() -> None:
    _, evaluation = _golden_evaluation()
    report = json.loads(json.dumps(evaluation.to_dict()))
    counts = report["denominators"]
    assert counts["questions"] == 9
    assert counts["scored"] == 3
    assert counts["not_in_gold"] == 1
    assert sum(counts[name] for name in SLICES if name != "not_in_gold") == counts["questions"]
    assert list(report["overall"]) == list(metric_names((1, 3)))
    assert set(report["per_query"]) == {"ok", "ok2", "other_cat"}
    assert report["per_query"]["ok"]["num_rel"] == 2
    assert {c["category"] for c in report["per_category"]} == {"billing", "login"}


def test_empty_scored_slice_reports_null_means() -> None:
    evaluation = evaluate({}, [QueryTarget("q", {}, behaviour="no_answer")], ks=(5,))
    report = evaluation.to_dict()
    assert report["overall"] == dict.fromkeys(metric_names((5,)))
    assert report["denominators"] == {"questions": 1, **{name: int(name == "no_answer") for name in SLICES}}
