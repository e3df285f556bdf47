"""`service/ingest/span_size.py`: an oversize span, log event or resource is cut to fit, never dropped."""

from __future__ import annotations

import pytest

from service.config import KafkaConfig
from service.conventions.spans import Attributes, LogEvent, Span, SpanEvent
from service.ingest.decoded import DecodedBatch
from service.ingest.otlp_encode import event_bytes, resource_bytes, span_bytes
from service.ingest.span_size import (
    MAX_RESOURCE_BYTES,
    MAX_SPAN_BYTES,
    MIN_RECORD_BYTES,
    cut_to_fit,
    fit_event,
    fit_resource,
    fit_span,
    truncation_note,
)

TRACE = "5b8efff798038103d269b633813fc60c"


def _span(attributes: Attributes, events: list[SpanEvent] | None = None) -> Span:
    return Span(TRACE, "eee19b7ec3c1b173", None, "llm", 1, 2, attributes, events or [])


def _kept(value: object, note_of: int) -> int:
    """Bytes of the original a cut value kept (its note taken off)."""
    assert isinstance(value, str) and value.endswith(truncation_note(note_of))
    return len(value[: -len(truncation_note(note_of))].encode())


def test_water_filling_cuts_the_longest_values_to_one_length() -> None:
    attributes: Attributes = {"a": "x" * 600_000, "b": "y" * 500_000, "c": "z" * 1_000}
    cut = cut_to_fit([attributes], 400_000)
    assert cut is not None and [key for key, _ in cut] == ["a", "b"]
    kept_a, kept_b = _kept(attributes["a"], 600_000), _kept(attributes["b"], 500_000)
    assert kept_a == kept_b  # one common length
    saved = 1_100_000 - kept_a - kept_b - len(truncation_note(600_000)) - len(truncation_note(500_000))
    assert 400_000 <= saved < 400_000 + 200  # no more than it must
    assert attributes["c"] == "z" * 1_000  # under the common length: untouched


def test_a_cut_never_splits_a_character_and_bytes_are_cut_too() -> None:
    attributes: Attributes = {"text": "é" * 100_000, "blob": b"\x00" * 100_000}
    cut = cut_to_fit([attributes], 150_001)
    assert cut is not None
    text, blob = attributes["text"], attributes["blob"]
    assert isinstance(text, str) and text.startswith("é") and "\ufffd" not in text
    assert isinstance(blob, bytes) and blob.endswith(truncation_note(100_000).encode())


def test_identifiers_are_never_cut_and_too_little_text_cuts_nothing() -> None:
    attributes: Attributes = {"session.id": "s" * 500, "input.value": "q" * 1_000, "n": 5}
    assert cut_to_fit([attributes], 2_000) is None
    assert attributes == {"session.id": "s" * 500, "input.value": "q" * 1_000, "n": 5}
    assert cut_to_fit([attributes], 0) == []


def test_an_oversize_span_fits_after_and_says_what_was_cut() -> None:
    event = SpanEvent("gen_ai.choice", 1, {"message.content": "m" * 600_000})
    span = _span({"output.value": "a" * 10 * 2**20, "llm.model_name": "gpt-4o-mini"}, [event])
    batch = DecodedBatch()
    size = fit_span(span, batch, f"span {TRACE}/eee19b7ec3c1b173")
    assert size is not None and size == len(span_bytes(span)) <= MAX_SPAN_BYTES
    assert span.attributes["ragmon.truncated"] == ["output.value", "message.content"]
    assert span.attributes["llm.model_name"] == "gpt-4o-mini"
    assert batch.truncated == 2 and batch.rejections == {}
    assert batch.drops[0] == (f"span {TRACE}/eee19b7ec3c1b173", "output.value", "truncated")
    assert "output.value of 10,485,760 bytes was truncated" in batch.error_message
    assert "truncated 2 oversize attribute values" in batch.error_message


def test_a_span_that_fits_is_left_alone() -> None:
    span = _span({"output.value": "a" * 1_000})
    batch = DecodedBatch()
    assert fit_span(span, batch, "here") == len(span_bytes(span))
    assert span.attributes == {"output.value": "a" * 1_000} and batch.truncated == 0


def test_a_span_of_nothing_but_numbers_cannot_fit() -> None:
    span = _span({f"custom.n{i}": i for i in range(100_000)})
    assert fit_span(span, DecodedBatch(), "here") is None


def test_log_events_and_resources_are_cut_to_their_limits() -> None:
    event = LogEvent(TRACE, "eee19b7ec3c1b173", "gen_ai.choice", 1, {"content": "c" * 2 * 2**20})
    batch = DecodedBatch()
    assert fit_event(event, batch, "log record") is not None
    assert len(event_bytes(event)) <= MAX_SPAN_BYTES and event.attributes["ragmon.truncated"] == ["content"]
    resource: Attributes = {"service.name": "shop", "process.command_line": "x" * 200_000}
    assert fit_resource(resource, batch, "resource 0") is not None
    assert len(resource_bytes(resource)) <= MAX_RESOURCE_BYTES and resource["service.name"] == "shop"
    assert batch.truncated == 2


def test_a_kafka_record_holds_the_largest_span_and_resource() -> None:
    """config.py cannot import ingest: its lower bound for `max_record_bytes` is a literal."""
    field = KafkaConfig.model_fields["max_record_bytes"]
    assert any(getattr(rule, "ge", None) == MIN_RECORD_BYTES for rule in field.metadata)
    with pytest.raises(ValueError, match="966560"):
        KafkaConfig(max_record_bytes=MIN_RECORD_BYTES - 1)
