"""Tests of service/probes/line_problems.py: one InvalidInput listing every bad line, capped."""

from __future__ import annotations

import pytest

from service.errors import InvalidInput, http_status
from service.probes.line_problems import MAX_LISTED, LineProblems


def test_no_problems_raises_nothing() -> None:
    LineProblems("f", "run", "bad_run").raise_if_any()


def test_problems_are_listed_with_source_and_line_then_capped() -> None:
    problems = LineProblems("data/run.txt", "run", "bad_run")
    for line in range(1, MAX_LISTED + 4):
        problems.add(line * 10, f"problem {line}")
    with pytest.raises(InvalidInput) as caught:
        problems.raise_if_any()
    lines = caught.value.message.splitlines()
    assert lines[0] == f"{MAX_LISTED + 3} problem(s) in run data/run.txt"
    assert lines[1] == "data/run.txt:10: problem 1"
    assert lines[MAX_LISTED] == f"data/run.txt:{MAX_LISTED * 10}: problem {MAX_LISTED}"
    assert lines[-1] == "... and 3 more"
    assert caught.value.reason == "bad_run"
    assert http_status(caught.value) == 422
