"""Tests of service/judge/correctness.py: the offline fact match and the LLM check on a fake endpoint."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from service.config import JudgeConfig
from service.judge.correctness import (
    CorrectnessVerdict,
    HeuristicCorrectness,
    LlmCorrectness,
    build_correctness,
)
from tests.fake_openai import FakeOpenAI, Reply

FACTS = ("Refunds take 5 business days", "Refunds go back to the original card")


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


def _llm(fake: FakeOpenAI) -> LlmCorrectness:
    return LlmCorrectness(
        JudgeConfig(base_url=fake.base_url, model="fake-model", max_attempts=1, timeout_s=5)
    )


def _verdict(found: list[int], missing: list[int], contradicted: list[int]) -> Reply:
    body = {"found": found, "missing": missing, "contradicted": contradicted, "rationale": "checked"}
    return Reply(content=json.dumps(body))


async def test_heuristic_finds_states_and_contradictions() -> None:
    judge = HeuristicCorrectness()
    answer = "Your refund takes 7 business days and goes back to the original card you paid with."
    result = await judge.check(
        "How long do refunds take?", answer, ["Refund takes 5 business days", *FACTS[1:]]
    )
    assert result.judge == "heuristic" and result.outcome == "scored"
    assert result.found == (1,)
    assert result.contradicted == (0,)  # the same statement with another number
    assert result.correct is False


async def test_heuristic_correct_answer_and_missing_fact() -> None:
    judge = HeuristicCorrectness()
    right = await judge.check("q", "Refunds take 5 business days and go back to the original card.", FACTS)
    assert right.correct is True and right.found == (0, 1) and right.found_ratio == 1.0
    partial = await judge.check("q", "Refunds take 5 business days.", FACTS)
    assert partial.found == (0,) and partial.missing == (1,) and partial.correct is False


async def test_no_facts_and_no_answer_need_no_call(fake: FakeOpenAI) -> None:
    fake.reset()
    judge = _llm(fake)
    try:
        assert (await judge.check("q", "anything", [])).outcome == "no_facts"
        empty = await judge.check("q", "  ", FACTS)
        assert empty.outcome == "scored" and empty.missing == (0, 1) and empty.correct is False
    finally:
        await judge.aclose()
    assert fake.requests() == []


async def test_llm_verdict_is_parsed_and_the_document_travels_as_data(fake: FakeOpenAI) -> None:
    fake.reset()
    fake.script(_verdict([0], [], [1]))
    judge = _llm(fake)
    try:
        result = await judge.check("How long?", "Five days, and it goes to store credit.", FACTS)
    finally:
        await judge.aclose()
    assert result.judge == "llm" and result.judge_version == "llm/fake-model/c1"
    assert (result.found, result.missing, result.contradicted) == ((0,), (), (1,))
    assert result.correct is False and result.rationale == "checked"
    (request,) = fake.requests()
    body = request["body"]
    assert body["temperature"] == 0 and body["response_format"]["type"] == "json_schema"
    user = json.loads(body["messages"][-1]["content"])
    assert user == {
        "question": "How long?",
        "answer": "Five days, and it goes to store credit.",
        "expected_facts": {"0": FACTS[0], "1": FACTS[1]},
    }


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (_verdict([0], [0], [1]), "partition_violation"),
        (_verdict([0], [], []), "partition_violation"),
        (Reply(content="not json"), "malformed"),
        (Reply(status=500), "server_error"),
        (Reply(status=429), "rate_limited"),
        (Reply(status=400), "rejected"),
        (Reply(content="{}", finish_reason="length"), "truncated"),
    ],
)
async def test_bad_replies_are_recorded_failures(fake: FakeOpenAI, reply: Reply, reason: str) -> None:
    fake.reset()
    fake.script(reply)
    judge = _llm(fake)
    try:
        result = await judge.check("q", "an answer", FACTS)
    finally:
        await judge.aclose()
    assert result.outcome == "failed" and result.failure_reason == reason
    assert result.correct is None


async def test_unreachable_endpoint_is_a_connection_error() -> None:
    judge = LlmCorrectness(JudgeConfig(base_url="http://127.0.0.1:9/v1", max_attempts=1, timeout_s=2))
    try:
        result = await judge.check("q", "an answer", FACTS)
    finally:
        await judge.aclose()
    assert result.failure_reason == "connection_error"


def test_partition_check_and_judge_choice(fake: FakeOpenAI) -> None:
    assert CorrectnessVerdict(found=[1], missing=[0], contradicted=[], rationale="").is_partition_of(2)
    assert not CorrectnessVerdict(found=[1, 1], missing=[], contradicted=[], rationale="").is_partition_of(2)
    assert isinstance(
        build_correctness("heuristic", JudgeConfig(base_url=fake.base_url)), HeuristicCorrectness
    )
    assert isinstance(build_correctness("auto", JudgeConfig(base_url=fake.base_url)), LlmCorrectness)
    with pytest.raises(ValueError):
        HeuristicCorrectness(min_overlap=0)
