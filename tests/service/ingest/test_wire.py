"""`service/ingest/wire.py`: the JSON API's records are held to the OTLP decoder's limits, at the
limit accepted and one past it rejected, each with the reason `rejection_reason` names."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from service.ingest.otlp import (
    MAX_COST_USD,
    MAX_COUNT,
    MAX_IDENTIFIER_CHARS,
    MAX_SECONDS,
    MAX_TEXT_CHARS,
    MAX_VECTOR_LENGTH,
)
from service.ingest.wire import MAX_METADATA_DEPTH, FeedbackIn, TraceIn, rejection_reason

TRACE_ID = "a" * 32


def _nested(lists: int) -> Any:
    value: Any = 1
    for _ in range(lists):
        value = [value]
    return value


# (field values at the limit, the same one past it, the reason); metadata levels: its object and each list
CASES: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    (
        "tokens",
        {"usage": [{"model": "m", "input_tokens": MAX_COUNT}]},
        {"usage": [{"model": "m", "input_tokens": 10**30}]},
        "out_of_range",
    ),
    (
        "cost",
        {"usage": [{"model": "m", "cost_usd": MAX_COST_USD}]},
        {"usage": [{"model": "m", "cost_usd": MAX_COST_USD * 2}]},
        "out_of_range",
    ),
    ("k", {"retrieval": {"k": MAX_COUNT}}, {"retrieval": {"k": MAX_COUNT + 1}}, "out_of_range"),
    ("seconds", {"timings": {"total_s": MAX_SECONDS}}, {"timings": {"generation_s": 1e300}}, "out_of_range"),
    ("query", {"query": "q" * MAX_TEXT_CHARS}, {"query": "q" * (MAX_TEXT_CHARS + 1)}, "string_too_long"),
    (
        "answer",
        {"answer": "a" * MAX_TEXT_CHARS},
        {"answer": "a" * (MAX_TEXT_CHARS + 1)},
        "string_too_long",
    ),
    (
        "chunk id",
        {"retrieval": {"chunks": [{"id": "c" * MAX_IDENTIFIER_CHARS}]}},
        {"retrieval": {"chunks": [{"id": "c" * (MAX_IDENTIFIER_CHARS + 1)}]}},
        "string_too_long",
    ),
    (
        "cited id",
        {"cited_chunk_ids": ["c" * MAX_IDENTIFIER_CHARS]},
        {"cited_chunk_ids": ["c" * (MAX_IDENTIFIER_CHARS + 1)]},
        "string_too_long",
    ),
    (
        "model",
        {"usage": [{"model": "m" * MAX_IDENTIFIER_CHARS}]},
        {"usage": [{"model": "m" * (MAX_IDENTIFIER_CHARS + 1)}]},
        "string_too_long",
    ),
    (
        "vector",
        {"query_embedding": {"vector": [0.5] * MAX_VECTOR_LENGTH}},
        {"query_embedding": {"vector": [0.5] * (MAX_VECTOR_LENGTH + 1)}},
        "vector_too_long",
    ),
    (
        "metadata depth",
        {"retrieval": {"chunks": [{"id": "c", "metadata": {"a": _nested(MAX_METADATA_DEPTH - 1)}}]}},
        {"retrieval": {"chunks": [{"id": "c", "metadata": {"a": _nested(MAX_METADATA_DEPTH)}}]}},
        "out_of_range",
    ),
    (
        "metadata integer",
        {"retrieval": {"chunks": [{"id": "c", "metadata": {"n": 2**63 - 1}}]}},
        {"retrieval": {"chunks": [{"id": "c", "metadata": {"n": 2**63}}]}},
        "out_of_range",
    ),
    (
        "metadata string",
        {"retrieval": {"chunks": [{"id": "c", "metadata": {"s": ["x" * MAX_TEXT_CHARS]}}]}},
        {"retrieval": {"chunks": [{"id": "c", "metadata": {"s": ["x" * (MAX_TEXT_CHARS + 1)]}}]}},
        "string_too_long",
    ),
    (
        "start time",
        {"start_time": "2262-04-11T23:47:16Z"},
        {"start_time": "2262-04-11T23:47:17Z"},
        "invalid_time",
    ),
    (
        "early time",
        {"start_time": "1970-01-01T00:00:00Z"},
        {"start_time": "1969-12-31T23:59:59Z"},
        "invalid_time",
    ),
    (
        "year one",
        {"start_time": "1970-01-01T01:00:00+01:00"},
        {"start_time": "0001-01-01T00:00:00+05:00"},
        "invalid_time",
    ),
    (
        "nan vector",
        {"query_embedding": {"vector": [0.0]}},
        {"query_embedding": {"vector": [float("nan")]}},
        "nan_vector",
    ),
    ("wrong type", {"timings": {"total_s": 1.0}}, {"timings": {"total_s": "slow"}}, "invalid_input"),
]


@pytest.mark.parametrize(
    ("at_limit", "past_limit", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_each_limit_accepts_its_value_and_rejects_one_past_it(
    at_limit: dict[str, Any], past_limit: dict[str, Any], reason: str
) -> None:
    TraceIn.model_validate({"trace_id": TRACE_ID, **at_limit})
    with pytest.raises(ValidationError) as caught:
        TraceIn.model_validate({"trace_id": TRACE_ID, **past_limit})
    assert rejection_reason(caught.value) == reason


def test_feedback_time_and_app_are_bounded() -> None:
    FeedbackIn.model_validate(
        {"trace_id": TRACE_ID, "kind": "up", "time": "2030-01-01T00:00:00Z", "app": "a" * 200}
    )
    for bad in ({"time": "0001-01-01T00:00:00+05:00"}, {"time": "9999-01-01T00:00:00Z"}, {"app": "a" * 201}):
        with pytest.raises(ValidationError):
            FeedbackIn.model_validate({"trace_id": TRACE_ID, "kind": "up", **bad})
