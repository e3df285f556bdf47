"""`service/ingest/value_scan.py`: which protobuf spans screening reads for numbers out of range."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from bench.ingest.payload import Batches
from service.ingest.protobuf_wire import span_slices
from service.ingest.value_scan import suspect_values


def _span(**attributes: Any) -> bytes:
    span = PbSpan(
        trace_id=bytes.fromhex("5b8efff798038103d269b633813fc60c"),
        span_id=bytes.fromhex("eee19b7ec3c1b173"),
        name="llm",
        start_time_unix_nano=1_764_400_000_000_000_000,
        end_time_unix_nano=1_764_400_000_500_000_000,
    )
    for key, value in attributes.items():
        kv = span.attributes.add()
        kv.key = key
        if isinstance(value, float):
            kv.value.double_value = value
        elif isinstance(value, int):
            kv.value.int_value = value
        else:
            kv.value.string_value = value
    raw: bytes = span.SerializeToString()
    return raw


@pytest.mark.parametrize(
    "value",
    [
        math.nan,
        -math.nan,
        math.inf,
        -math.inf,
        1e30,
        -0.5,
        -3.0,
        2.0**17,
        1e12,
        -1,
        -(2**63),
        2**35,
        2**42,
        2**49,
        2**56,
        2**63 - 1,
    ],
)
def test_a_number_no_count_score_cost_or_duration_in_range_has_is_suspect(value: float | int) -> None:
    assert suspect_values(_span(**{"llm.token_count.prompt": value}))
    assert suspect_values(_span(**{"retrieval.documents.0.document.score": value, "input.value": "q"}))


@pytest.mark.parametrize("value", [0.0, 0.83, 1.0, 131_071.9, 0, 1, 700, 2**35 - 1, "NaN", "1e30"])
def test_numbers_in_range_and_any_text_are_not(value: float | int | str) -> None:
    """Text ("1e30") is not seen here: the builder drops and counts it (the module docstring)."""
    assert not suspect_values(_span(**{"llm.token_count.prompt": value, "output.value": "an answer"}))


def test_the_benchmark_payload_has_no_suspect_span() -> None:
    """The usual request is not decoded at screening: none of its bytes match (ids and timestamps
    of every trace vary; 2,000 traces)."""
    for body in Batches(traces_per_request=100).bodies(20):
        assert not suspect_values(body)
        assert not any(suspect_values(raw) for raw in span_slices(body))


def test_random_span_ids_match_seldom() -> None:
    """A span id is field 2 of 8 bytes (0x12 0x08 ...), like an AnyValue of length 8: only a
    7-byte varint's shape after it matches, about 1 in 30,000 random ids."""
    rng = random.Random(7)
    matches = 0
    for _ in range(20_000):
        span = PbSpan(trace_id=rng.randbytes(16), span_id=rng.randbytes(8), name="x")
        matches += suspect_values(span.SerializeToString())
    assert matches <= 5
