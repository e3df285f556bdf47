"""Tests of service/probes/golden.py: the JSONL format, eligibility, per-line errors, versions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from service.errors import InvalidInput, http_status
from service.probes.golden import GoldenQuestion, GoldenSet, load_golden, parse_golden


def _line(**row: Any) -> str:
    return json.dumps({"question_id": "q1", "question": "How do I reset my password?", **row})


def test_a_full_row_reads_with_every_field() -> None:
    row = _line(
        gold_chunks=[{"chunk_id": "kb/12#3", "relevance": 2, "tenants": ["acme"]}, {"chunk_id": "kb/12#4"}],
        expected_facts=["Reset links expire after 24 hours."],
        expected_behaviour="answer",
        category="account",
        tenants=["acme", "globex"],
    )
    question = parse_golden([row]).questions["q1"]
    assert question.gold_chunks[0].relevance == 2
    assert question.gold_chunks[1].relevance == 1
    assert question.expected_facts == ("Reset links expire after 24 hours.",)
    assert question.category == "account"
    assert question.has_gold


def test_defaults_are_an_answerable_question_without_gold() -> None:
    question = parse_golden([_line()]).questions["q1"]
    assert question.expected_behaviour == "answer"
    assert question.category is None
    assert not question.has_gold
    assert question.eligible_grades(None) == {}


def test_eligibility_follows_the_item_then_the_question() -> None:
    row = _line(
        tenants=["acme", "globex"],
        gold_chunks=[
            {"chunk_id": "shared"},
            {"chunk_id": "acme_only", "tenants": ["acme"]},
            {"chunk_id": "initech_only", "tenants": ["initech"]},
        ],
    )
    question = parse_golden([row]).questions["q1"]
    assert question.eligible_grades("acme") == {"shared": 1, "acme_only": 1}
    assert question.eligible_grades("globex") == {"shared": 1}
    # An item's own tenants replace the question's, so initech sees its chunk and nothing else.
    assert question.eligible_grades("initech") == {"initech_only": 1}
    assert question.eligible_grades(None) == {"shared": 1, "acme_only": 1, "initech_only": 1}


def test_evidence_resolves_to_chunks_with_the_highest_grade() -> None:
    row = _line(
        evidence=[
            {"evidence_id": "e1", "chunk_ids": ["c1", "c2"], "relevance": 1},
            {"evidence_id": "e2", "chunk_ids": ["c2", "c3"], "relevance": 3},
            {"evidence_id": "e3", "chunk_ids": ["c4"], "relevance": 2, "tenants": ["globex"]},
        ]
    )
    question = parse_golden([row]).questions["q1"]
    assert question.eligible_grades("acme") == {"c1": 1, "c2": 3, "c3": 3}
    assert question.eligible_grades("globex") == {"c1": 1, "c2": 3, "c3": 3, "c4": 2}


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ('{"question_id": "q1", "question": ', "not valid JSON"),
        (_line(answer="x"), "answer: Extra inputs are not permitted"),
        (_line(expected_behaviour="refuse"), "expected_behaviour: Input should be 'answer', 'clarify'"),
        (_line(gold_chunks=[{"chunk_id": "a", "relevance": 0}]), "gold_chunks.0.relevance: Input should be"),
        (_line(gold_chunks=[{"chunk_id": ""}]), "gold_chunks.0.chunk_id: String should have at least 1"),
        (
            _line(evidence=[{"evidence_id": "e", "chunk_ids": []}]),
            "evidence.0.chunk_ids: Tuple should have at least 1",
        ),
        (_line(evidence=[{"evidence_id": "e", "chunk_ids": ["a", "a"]}]), "duplicate chunk id 'a'"),
        (_line(gold_chunks=[{"chunk_id": "a"}, {"chunk_id": "a"}]), "duplicate gold chunk id 'a'"),
        (
            _line(gold_chunks=[{"chunk_id": "a"}], evidence=[{"evidence_id": "e", "chunk_ids": ["a"]}]),
            "either gold_chunks or evidence, not both",
        ),
        (_line(question="  "), "question: String should match pattern"),
        ('["not", "an", "object"]', "Input should be an object"),
    ],
)
def test_bad_rows_are_refused_with_their_line(row: str, problem: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_golden(["", row], source="gold.jsonl")
    assert caught.value.message.startswith("1 problem(s) in golden set gold.jsonl")
    assert "gold.jsonl:2: " in caught.value.message
    assert problem in caught.value.message
    assert http_status(caught.value) == 422


def test_every_bad_line_is_reported_at_once() -> None:
    lines = [
        _line(),
        "{broken",
        _line(question_id="q2", expected_behaviour="maybe"),
        _line(question_id="q3"),
        _line(),  # q1 again
    ]
    with pytest.raises(InvalidInput) as caught:
        parse_golden(lines, source="g")
    message = caught.value.message
    assert message.splitlines()[0] == "3 problem(s) in golden set g"
    assert "g:2: not valid JSON" in message
    assert "g:3: expected_behaviour" in message
    assert "g:5: question_id 'q1' already used on line 1" in message
    assert "g:4" not in message


def test_version_ignores_formatting_and_order_but_not_content() -> None:
    a = _line(question_id="a", gold_chunks=[{"chunk_id": "c1"}], category="x")
    b = _line(question_id="b", expected_behaviour="no_answer")
    base = parse_golden([a, b]).version
    assert base.startswith("sha256:")
    assert len(base) == len("sha256:") + 64
    reformatted = json.dumps(json.loads(a), indent=None, separators=(",", ":"), sort_keys=True)
    assert parse_golden(["", b, reformatted]).version == base
    changed = _line(question_id="a", gold_chunks=[{"chunk_id": "c1", "relevance": 2}], category="x")
    assert parse_golden([changed, b]).version != base
    assert parse_golden([a]).version != base


def test_jsonl_round_trip_keeps_questions_and_version(tmp_path: Path) -> None:
    lines = [
        _line(
            question_id="a",
            evidence=[{"evidence_id": "e", "chunk_ids": ["c1"], "relevance": 2, "tenants": ["acme"]}],
            expected_facts=["f"],
            category="c",
        ),
        _line(question_id="b", expected_behaviour="deny", tenants=["globex"]),
    ]
    original = parse_golden(lines)
    path = tmp_path / "golden.jsonl"
    path.write_text(original.to_jsonl(), encoding="utf-8")
    loaded = load_golden(path)
    assert loaded.questions == original.questions
    assert loaded.version == original.version
    assert loaded.source == str(path)
    assert len(loaded) == 2
    assert [q.question_id for q in loaded] == ["a", "b"]


def test_load_golden_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "g.jsonl"
    path.write_text(_line() + "\nnot json\n", encoding="utf-8")
    with pytest.raises(InvalidInput, match=f"{path}:2: not valid JSON"):
        load_golden(path)


def test_golden_set_refuses_duplicate_questions_built_in_code() -> None:
    question = GoldenQuestion(question_id="q", question="?")
    with pytest.raises(ValueError, match="duplicate question_id 'q'"):
        GoldenSet([question, question])


def test_questions_are_immutable() -> None:
    question = parse_golden([_line()]).questions["q1"]
    with pytest.raises(ValueError, match="frozen"):
        question.category = "other"
