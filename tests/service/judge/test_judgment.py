"""Verdict partition rule, diagnosis table and Judgment shape checks."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from service.judge.judgment import Judgment, Verdict, diagnose
from service.model import RagTrace

TRACE = RagTrace(trace_id="ab" * 16, app="shop", start_time=datetime(2026, 1, 1, tzinfo=UTC))


def make_verdict(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "claims": ["a", "b", "c"],
        "supported": [0, 2],
        "unsupported": [1],
        "outcome": "scored",
        "failure_mode": "fabrication",
        "context_sufficient": True,
        "rationale": "r",
    }
    return {**base, **overrides}


def error_types(raw: dict[str, Any]) -> set[str]:
    with pytest.raises(ValidationError) as caught:
        Verdict.model_validate(raw)
    return {e["type"] for e in caught.value.errors()}


def test_a_complete_disjoint_partition_validates() -> None:
    verdict = Verdict.model_validate(make_verdict())
    assert sorted([*verdict.supported, *verdict.unsupported]) == [0, 1, 2]


@pytest.mark.parametrize(
    ("supported", "unsupported"),
    [([0, 1], [1]), ([0], [1]), ([0, 1, 2], [3]), ([0, 0, 2], [1]), ([-1, 0, 2], [1]), ([], [])],
)
def test_any_broken_partition_is_a_partition_violation(supported: list[int], unsupported: list[int]) -> None:
    assert error_types(make_verdict(supported=supported, unsupported=unsupported)) == {"partition_violation"}


@pytest.mark.parametrize(
    "overrides",
    [
        {"outcome": "no_claims"},
        {"claims": [], "supported": [], "unsupported": [], "outcome": "scored", "failure_mode": "none"},
        {"failure_mode": "none"},
        {"supported": [0, 1, 2], "unsupported": [], "failure_mode": "wrong_entity"},
    ],
)
def test_labels_that_contradict_the_partition_are_inconsistent(overrides: dict[str, Any]) -> None:
    assert error_types(make_verdict(**overrides)) == {"inconsistent_verdict"}


def test_unknown_failure_mode_and_extra_keys_are_malformed() -> None:
    assert "literal_error" in error_types(make_verdict(failure_mode="vibes"))
    assert "extra_forbidden" in error_types({**make_verdict(), "score": 1})


@pytest.mark.parametrize(
    ("outcome", "sufficient", "unsupported", "expected"),
    [
        ("scored", True, 0, "ok"),
        ("scored", False, 0, "ok"),
        ("scored", False, 2, "retrieval_failure"),
        ("scored", True, 1, "generation_failure"),
        ("no_claims", False, 0, "correct_abstention"),
        ("no_claims", True, 0, "unnecessary_abstention"),
    ],
)
def test_diagnosis_table(outcome: Any, sufficient: bool, unsupported: int, expected: str) -> None:
    assert diagnose(outcome, sufficient, unsupported) == expected


def judgment_from(raw: dict[str, Any]) -> Judgment:
    return Judgment.from_verdict(
        TRACE,
        Verdict.model_validate(raw),
        judge="llm",
        judge_version="v",
        judge_model="m",
        calls=(),
        latency_s=0.1,
        judged_at=datetime(2026, 1, 2, tzinfo=UTC),
    )


def test_faithfulness_is_supported_over_claims() -> None:
    judgment = judgment_from(make_verdict())
    assert judgment.faithfulness == pytest.approx(2 / 3)
    assert (judgment.trace_id, judgment.app, judgment.diagnosis) == (
        TRACE.trace_id,
        "shop",
        "generation_failure",
    )
    assert Judgment.model_validate_json(judgment.model_dump_json()) == judgment


def test_no_claims_has_no_faithfulness() -> None:
    raw = make_verdict(claims=[], supported=[], unsupported=[], outcome="no_claims", failure_mode="none")
    judgment = judgment_from(raw)
    assert judgment.faithfulness is None and judgment.diagnosis == "unnecessary_abstention"


def test_judgment_shape_is_enforced() -> None:
    good = judgment_from(make_verdict()).model_dump()
    with pytest.raises(ValidationError):
        Judgment.model_validate({**good, "faithfulness": 1.0})  # not supported / claims
    with pytest.raises(ValidationError):
        Judgment.model_validate({**good, "failure_reason": "timeout"})  # a score with a failure
    with pytest.raises(ValidationError):
        Judgment.model_validate({**good, "outcome": "failed"})  # a failure with a verdict
    failed = Judgment.failed(
        TRACE,
        "server_error",
        judge="llm",
        judge_version="v",
        judge_model="m",
        calls=(),
        latency_s=0.0,
        judged_at=datetime(2026, 1, 2, tzinfo=UTC),
    )
    assert failed.retryable and failed.cost_usd is None and failed.prompt_tokens == 0
