"""Diagnosis evidence: which chunks hold which claim, and the question terms no chunk has."""

from __future__ import annotations

from datetime import UTC, datetime

from service.judge.evidence import diagnosis_evidence
from service.judge.heuristic import HeuristicJudge
from service.judge.judgment import Judgment, Verdict
from service.model import Chunk, RagTrace, Retrieval

CHUNKS = (
    Chunk(
        id="refunds",
        rank=0,
        content="Refunds take 30 days after delivery.",
        metadata={"title": "Refund policy"},
    ),
    Chunk(id="shipping", rank=1, content="Standard shipping takes five working days within Europe."),
    Chunk(id="empty", rank=2, content=None),
)


def trace(query: str, answer: str, chunks: tuple[Chunk, ...] = CHUNKS) -> RagTrace:
    return RagTrace(
        trace_id="ab" * 16,
        start_time=datetime(2026, 1, 1, tzinfo=UTC),
        query=query,
        retrieval=Retrieval(chunks=chunks),
        answer=answer,
    )


def test_each_claim_names_the_chunks_that_hold_it_and_the_words_none_has() -> None:
    evidence = diagnosis_evidence(
        "Do refunds and shipping take days?",
        CHUNKS,
        ["Refunds take 30 days after delivery", "Shipping takes five days in Europe", "Returns are free"],
        [0, 1],
        "generation_failure",
    )
    assert [(c.claim, c.supported, c.chunks) for c in evidence.claims] == [
        (0, True, ("refunds",)),
        (1, True, ("shipping",)),
        (2, False, ()),
    ]
    assert evidence.claims[2].missing_words == ("return", "free")
    assert evidence.missing_question_terms == ()
    assert evidence.summary.startswith("generation: the context covers the question (4 of 4 terms)")
    assert "return, free" not in evidence.summary and "free, return" in evidence.summary


def test_a_retrieval_failure_says_which_question_terms_no_chunk_has() -> None:
    evidence = diagnosis_evidence(
        "What is the warranty period for the espresso machine?",
        CHUNKS,
        ["The warranty lasts two years"],
        [],
        "retrieval_failure",
    )
    assert evidence.question_terms == ("warranty", "period", "espresso", "machine")
    assert evidence.missing_question_terms == ("warranty", "period", "espresso", "machine")
    assert evidence.summary == (
        "retrieval: 4 of 4 question terms are in none of the 2 chunks "
        "(warranty, period, espresso, machine); 1 of 1 claims unsupported"
    )


async def test_judgments_of_both_judges_carry_the_evidence_with_their_diagnosis() -> None:
    off_topic = trace(
        "What is the warranty period for the espresso machine?", "The warranty lasts two years."
    )
    judgment = await HeuristicJudge().judge(off_topic)
    assert judgment.diagnosis == "retrieval_failure" and judgment.evidence is not None
    assert judgment.evidence.missing_question_terms == ("warranty", "period", "espresso", "machine")
    # an LLM verdict names no chunks: its evidence is looked up the same way
    verdict = Verdict(
        claims=["Refunds take 30 days", "Refund policy refunds are instant after delivery"],
        supported=[0],
        unsupported=[1],
        outcome="scored",
        failure_mode="contradiction",
        context_sufficient=True,
        rationale="x",
    )
    llm = Judgment.from_verdict(
        trace("How long do refunds take?", "..."),
        verdict,
        judge="llm",
        judge_version="llm/test",
        judge_model="m",
        calls=(),
        latency_s=0.0,
        judged_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    assert llm.evidence is not None and llm.diagnosis == "generation_failure"
    assert [c.chunks for c in llm.evidence.claims] == [("refunds",), ("refunds",)]
    assert llm.evidence.claims[1].missing_words == ("instant",)
    # stored as JSON and read back (the trace API shows the stored record)
    assert Judgment.model_validate_json(llm.model_dump_json()) == llm
