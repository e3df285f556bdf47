"""HeuristicJudge: claim splitting, support rules, abstentions, determinism, and its accuracy on HaluEval."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from scipy.stats import norm

from service.judge.heuristic import HeuristicJudge, split_claims
from service.judge.judgment import Judge
from service.model import Chunk, RagTrace, Retrieval

CONTEXT = [
    "The Hobbit is a children's fantasy novel by J. R. R. Tolkien. It was published in 1937 "
    "by George Allen & Unwin in London. Some of its readers were adults."
]
QUESTION = "Who wrote The Hobbit and when was it published?"


def shared_data() -> Path:
    env = os.environ.get("RAGMON_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[3] / ".." / "shared" / "data"


def test_claims_are_sentences_and_clauses() -> None:
    answer = "Dr. J. R. R. Tolkien wrote it in 1937. It sold well; critics liked it, but some did not."
    assert split_claims(answer) == [
        "Dr. J. R. R. Tolkien wrote it in 1937",
        "It sold well",
        "critics liked it",
        "some did not",
    ]


@pytest.mark.parametrize(
    "answer",
    ["I don't know.", "The context does not mention the author.", "There is not enough information."],
)
def test_refusals_have_no_claims(answer: str) -> None:
    assert split_claims(answer) == []


@pytest.mark.parametrize(
    ("answer", "failure_mode"),
    [
        ("Tolkien wrote The Hobbit, published in 1937.", "none"),
        ("The Hobbit was published in 1938.", "contradiction"),
        ("The Hobbit is a novel by C. S. Lewis.", "wrong_entity"),
        ("All of its readers were adults.", "overgeneralization"),
        ("The novel won a major prize for its dragon illustrations.", "fabrication"),
    ],
)
def test_support_rules(answer: str, failure_mode: str) -> None:
    verdict = HeuristicJudge().verdict(QUESTION, CONTEXT, answer)
    assert verdict.failure_mode == failure_mode
    assert (verdict.unsupported == []) == (failure_mode == "none")


def test_context_sufficiency_from_question_coverage() -> None:
    judge = HeuristicJudge()
    assert judge.verdict(QUESTION, CONTEXT, "Tolkien.").context_sufficient is True
    assert (
        judge.verdict("What is the boiling point of mercury?", CONTEXT, "Tolkien.").context_sufficient
        is False
    )
    assert judge.verdict(QUESTION, [], "Tolkien.").context_sufficient is False


def trace(answer: str | None, chunks: tuple[str | None, ...], query: str = QUESTION) -> RagTrace:
    return RagTrace(
        trace_id="cd" * 16,
        start_time=datetime(2026, 1, 1, tzinfo=UTC),
        query=query,
        retrieval=Retrieval(chunks=tuple(Chunk(id=str(i), rank=i, content=c) for i, c in enumerate(chunks))),
        answer=answer,
    )


async def test_judgments_are_labelled_heuristic_and_deterministic() -> None:
    judge: Judge = HeuristicJudge()
    first = await judge.judge(
        trace("The novel by Tolkien was published in 1937. It was published in Paris.", tuple(CONTEXT))
    )
    second = await judge.judge(
        trace("The novel by Tolkien was published in 1937. It was published in Paris.", tuple(CONTEXT))
    )
    assert first.judge == "heuristic" and first.judge_model is None and first.calls == ()
    assert first.judge_version == judge.version
    assert first.faithfulness == 0.5 and first.diagnosis == "generation_failure"
    assert first.model_dump(exclude={"latency_s", "judged_at"}) == second.model_dump(
        exclude={"latency_s", "judged_at"}
    )


async def test_abstentions_and_missing_inputs() -> None:
    judge = HeuristicJudge()
    assert (await judge.judge(trace("I don't know.", tuple(CONTEXT)))).diagnosis == "unnecessary_abstention"
    off_topic = trace("I don't know.", tuple(CONTEXT), query="What is the boiling point of mercury?")
    assert (await judge.judge(off_topic)).diagnosis == "correct_abstention"
    assert (await judge.judge(trace(None, tuple(CONTEXT)))).failure_reason == "no_answer"
    assert (await judge.judge(trace("Tolkien.", (None,)))).failure_reason == "no_context"


def wilson_lower(k: int, n: int) -> float:
    z = float(norm.ppf(0.975))
    p = k / n
    return float((p + z * z / (2 * n) - z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n))


def test_accuracy_on_halueval_is_well_above_chance() -> None:
    path = shared_data() / "faithfulness" / "halueval_qa_dev.jsonl"
    if not path.exists():
        pytest.skip(f"shared data not found at {path} (set RAGMON_SHARED_DATA)")
    rows = [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]
    judge = HeuristicJudge()
    hits = {True: 0, False: 0}
    totals = {True: 0, False: 0}
    for row in rows:
        verdict = judge.verdict(row["question"], row["contexts"], row["answer"])
        label = bool(row["label_faithful"])
        totals[label] += 1
        hits[label] += (not verdict.unsupported) == label
    # Per-class 95 % Wilson lower bounds: both classes clearly better than a coin.
    assert wilson_lower(hits[True], totals[True]) > 0.9
    assert wilson_lower(hits[False], totals[False]) > 0.6
