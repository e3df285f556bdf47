"""Tests of service/probes/trec.py: trec_eval's ranking order, tolerated and refused lines."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from service.errors import InvalidInput, PermanentError
from service.probes.trec import parse_qrels, parse_run, read_qrels, read_run
from tests.service.probes.trec_eval_oracle import trec_eval_dir


def test_run_is_ranked_by_score_then_docno_descending_ignoring_the_rank_column() -> None:
    lines = [
        "q1 Q0 b 1 0.5 tag",
        "q1 Q0 a 2 0.9 tag",
        "q1 Q0 c 3 0.5 tag",  # ties with b: docno descending puts c first
        "q1 Q0 d 4 -1e3 tag",
        "q2 Q0 z 1 1 tag",
    ]
    assert parse_run(lines) == {"q1": ("a", "c", "b", "d"), "q2": ("z",)}


def test_trailing_fields_and_blank_lines_are_ignored() -> None:
    run = parse_run(["", "q1 Q0 a 1 2.0 tag and more junk", "   ", "q1\tQ0\tb\t2\t1.0\ttag"])
    assert run == {"q1": ("a", "b")}


def test_duplicate_docno_in_a_ranking_names_both_lines() -> None:
    with pytest.raises(
        InvalidInput, match=r"run\.txt:3: duplicate docno 'a' for query 'q1' \(first on line 1\)"
    ):
        parse_run(["q1 Q0 a 1 2 t", "q1 Q0 b 2 1 t", "q1 Q0 a 3 0 t"], source="run.txt")
    # The same docno under another query is a different ranking.
    assert parse_run(["q1 Q0 a 1 2 t", "q2 Q0 a 1 2 t"]) == {"q1": ("a",), "q2": ("a",)}


def test_every_bad_run_line_is_reported_at_once() -> None:
    lines = ["q1 Q0 a 1 x t", "q1 Q0 b 1", "q1 Q0 c 1 nan t", "q1 Q0 d 1 inf t", "q1 Q0 e 1 1.0 t"]
    with pytest.raises(InvalidInput) as caught:
        parse_run(lines, source="r")
    message = caught.value.message
    assert message.startswith("4 problem(s) in run r")
    assert "r:1: score 'x' is not a number" in message
    assert "r:2: expected 6 fields" in message
    assert "r:3: score 'nan' is not finite" in message
    assert "r:4: score 'inf' is not finite" in message
    assert "r:5" not in message
    assert isinstance(caught.value, PermanentError)


def test_long_lists_of_problems_are_capped() -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_run([f"q{i} Q0 d 1 bad t" for i in range(25)], source="r")
    lines = caught.value.message.splitlines()
    assert lines[0] == "25 problem(s) in run r"
    assert lines[-1] == "... and 5 more"
    assert len(lines) == 1 + 20 + 1


def test_qrels_keep_grades_including_negative_ones() -> None:
    qrels = parse_qrels(["301 0 a 2", "301 0 b -1", "", "302 0 a 0"])
    assert qrels == {"301": {"a": 2, "b": -1}, "302": {"a": 0}}


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("301 0 a", "expected 4 fields"),
        ("301 0 a 1 extra", "expected 4 fields"),
        ("301 0 a 1.5", "relevance '1.5' is not an integer"),
        ("301 0 a yes", "relevance 'yes' is not an integer"),
    ],
)
def test_malformed_qrels_lines_are_refused(line: str, problem: str) -> None:
    with pytest.raises(InvalidInput, match=rf"q:2: {problem}"):
        parse_qrels(["301 0 z 1", line], source="q")


def test_a_docno_judged_twice_is_refused() -> None:
    with pytest.raises(InvalidInput, match=r"q:3: docno 'a' of query '301' is already judged on line 1"):
        parse_qrels(["301 0 a 1", "301 0 b 1", "301 1 a 1"], source="q")


def test_read_from_files(tmp_path: Path) -> None:
    (tmp_path / "qrels").write_text("1 0 a 1\n1 0 b 0\n", encoding="utf-8")
    (tmp_path / "run").write_text("1 Q0 b 1 3.0 t\n1 Q0 a 2 4.0 t\n", encoding="utf-8")
    assert read_qrels(tmp_path / "qrels") == {"1": {"a": 1, "b": 0}}
    assert read_run(str(tmp_path / "run")) == {"1": ("a", "b")}
    (tmp_path / "bad").write_text("1 Q0 b 1 3.0\n", encoding="utf-8")
    with pytest.raises(InvalidInput, match=str(tmp_path / "bad") + ":1:"):
        read_run(tmp_path / "bad")


def test_trec_eval_test_files() -> None:
    directory = trec_eval_dir()
    raw: dict[str, list[tuple[float, str]]] = {}
    for line in (directory / "results.test").read_text(encoding="utf-8").splitlines():
        qid, _, docno, _, score, *_ = line.split()
        raw.setdefault(qid, []).append((float(score), docno))
    run = read_run(directory / "results.test")
    assert {qid: len(docs) for qid, docs in run.items()} == {"301": 500, "302": 500, "303": 500}
    ties = 0
    for qid, ranking in run.items():
        scores = {docno: value for value, docno in raw[qid]}
        assert sorted(ranking) == sorted(scores)
        for above, below in itertools.pairwise(ranking):
            assert scores[above] > scores[below] or (scores[above] == scores[below] and above > below)
            ties += scores[above] == scores[below]
    assert ties > 0  # the file has tied scores, so the docno tie-break is exercised
    # results.trunc has junk after the sixth field and no ranking for 302.
    trunc = read_run(directory / "results.trunc")
    assert set(trunc) == {"301", "303"}
    qrels = read_qrels(directory / "qrels.rel_level")
    assert {grade for judged in qrels.values() for grade in judged.values()} == {-1, 0, 1, 2, 3, 4}
