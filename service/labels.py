"""Closed sets of metric label values that ragmon's records carry too.

They live here, below both `metrics.py` and the capabilities that produce
them, so that declaring a metric's label children never imports a receiver or
a judge.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

__all__ = ["ATTRIBUTE_REASONS", "FailureReason", "RejectReason"]


class RejectReason(StrEnum):
    """Why a span, one attribute value (the reasons in `ATTRIBUTE_REASONS`) or one JSON-API record was
    not accepted; a metric label. The rules behind each are tabled in `service/ingest/otlp.py`."""

    INVALID_TRACE_ID = "invalid_trace_id"
    INVALID_SPAN_ID = "invalid_span_id"
    INVALID_PARENT_SPAN_ID = "invalid_parent_span_id"
    INVALID_TIME = "invalid_time"
    NAN_VECTOR = "nan_vector"
    VECTOR_DIMENSION_MISMATCH = "vector_dimension_mismatch"
    MALFORMED_SPAN = "malformed_span"
    INVALID_ATTRIBUTE = "invalid_attribute"
    OUT_OF_RANGE = "out_of_range"
    STRING_TOO_LONG = "string_too_long"
    VECTOR_TOO_LONG = "vector_too_long"
    INVALID_ATTRIBUTE_INDEX = "invalid_attribute_index"
    SPAN_TOO_LARGE = "span_too_large"


ATTRIBUTE_REASONS: frozenset[RejectReason] = frozenset(
    {
        RejectReason.INVALID_ATTRIBUTE,
        RejectReason.OUT_OF_RANGE,
        RejectReason.STRING_TOO_LONG,
        RejectReason.VECTOR_TOO_LONG,
        RejectReason.INVALID_ATTRIBUTE_INDEX,
    }
)
"""The reasons that, in OTLP, count dropped attribute values (the span is kept); the others count spans."""


FailureReason = Literal[
    "rate_limited",  # 429 after the retry budget
    "server_error",  # 5xx after the retry budget
    "timeout",  # no reply within the configured timeout, after the retry budget
    "connection_error",  # endpoint unreachable
    "malformed",  # reply is not the JSON object the schema asks for
    "partition_violation",  # supported/unsupported are not a complete, disjoint partition of the claims
    "inconsistent_verdict",  # outcome or failure_mode contradicts the claims and partition
    "refused",  # the model refused, or a content filter stopped it
    "truncated",  # the reply hit the output-token limit
    "rejected",  # the endpoint refused the request itself (4xx other than 429)
    "no_answer",  # the trace carries no answer text: nothing to judge
    "no_context",  # chunks were retrieved but the app sent none of their text
]
