"""Tests of service/probes/tagging.py: the helper apps call to tag probe traffic."""

from __future__ import annotations

from service.conventions.attributes import RagmonAttributes
from service.probes.tagging import (
    PROBE_QUESTION_ATTRIBUTE,
    PROBE_RUN_ATTRIBUTE,
    ragmon_probe_attributes,
    ragmon_probe_fields,
)


def test_attribute_names_are_ragmons() -> None:
    assert PROBE_RUN_ATTRIBUTE == RagmonAttributes.PROBE_RUN_ID
    assert PROBE_QUESTION_ATTRIBUTE == RagmonAttributes.PROBE_QUESTION_ID


def test_probe_headers_become_attributes_and_fields() -> None:
    headers = {"X-Ragmon-Probe-Run": " run-1 ", "x-ragmon-probe-question": "q7", "accept": "*/*"}
    assert ragmon_probe_attributes(headers) == {
        "ragmon.probe.run_id": "run-1",
        "ragmon.probe.question_id": "q7",
    }
    assert ragmon_probe_fields(list(headers.items())) == {"probe_run_id": "run-1", "probe_question_id": "q7"}


def test_ordinary_requests_are_left_alone() -> None:
    assert ragmon_probe_attributes({"accept": "*/*"}) == {}
    assert ragmon_probe_attributes({"x-ragmon-probe-run": "  "}) == {}
    assert ragmon_probe_attributes({"x-ragmon-probe-question": "q1"}) == {"ragmon.probe.question_id": "q1"}
    assert len(ragmon_probe_attributes({"x-ragmon-probe-run": "r" * 1000})["ragmon.probe.run_id"]) == 200
