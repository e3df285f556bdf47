"""`service/ingest/drop_log.py`: dropped and truncated values are logged once, then once per interval,
by trace and key, never by value."""

from __future__ import annotations

import logging

import pytest

from service.ingest.decoded import DecodedBatch
from service.ingest.drop_log import DropLog
from service.labels import RejectReason

SECRET = "the user's question about their diagnosis"


def _dropped(trace: str) -> DecodedBatch:
    batch = DecodedBatch()
    where = f"span {trace}/eee19b7ec3c1b173"
    batch._drop(
        RejectReason.OUT_OF_RANGE,
        f"{where}: llm.token_count.prompt is {SECRET}",
        where,
        "llm.token_count.prompt",
    )
    return batch


def test_the_first_drop_is_logged_then_one_line_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    drops = DropLog(logging.getLogger("test.drops"), every_s=30, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, "test.drops"):
        drops.note(_dropped("a" * 32))
        for second in range(1, 30):  # a client sending a bad count every second
            now[0] = 100.0 + second
            drops.note(_dropped("b" * 32))
        now[0] = 130.0
        drops.note(_dropped("c" * 32))
        drops.note(DecodedBatch())  # nothing dropped: nothing said
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2
    assert "dropped or truncated 1 attribute value," in lines[0] and f"span {'a' * 32}/" in lines[0]
    assert "'llm.token_count.prompt'" in lines[0] and "out_of_range" in lines[0]
    assert "30 attribute values in the last 30 s" in lines[1] and f"span {'c' * 32}/" in lines[1]
    assert not any(SECRET in line for line in lines)


def test_a_long_key_is_cut_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    batch = DecodedBatch()
    batch._truncate("detail", "span x/y", "k" * 1000)
    with caplog.at_level(logging.WARNING, "test.drops"):
        DropLog(logging.getLogger("test.drops")).note(batch)
    (line,) = [record.getMessage() for record in caplog.records]
    assert "k" * 100 + "..." in line and "k" * 101 not in line and "(truncated)" in line
