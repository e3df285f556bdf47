"""`service/bus/outage_log.py`: one line when a dependency goes, one per interval, one when it is back."""

from __future__ import annotations

import logging

import pytest

from service.bus.outage_log import OutageLog


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_outage_is_said_once_then_once_per_interval_then_its_end(caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    outage = OutageLog(logging.getLogger("test.outage"), "Kafka", every_s=30.0, clock=clock)
    outage.recovered()  # reachable all along: nothing to say
    with caplog.at_level(logging.INFO, logger="test.outage"):
        for _ in range(70):  # a retry every second for 70 s
            outage.failed(ConnectionRefusedError("refused"))
            clock.now += 1.0
        outage.recovered()
        outage.recovered()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines == [
        ("WARNING", "Kafka is unreachable (refused); retrying with backoff, next report in 30 s"),
        ("WARNING", "Kafka still unreachable after 30 s and 30 retries (refused)"),
        ("WARNING", "Kafka still unreachable after 60 s and 60 retries (refused)"),
        ("INFO", "Kafka is reachable again after 70 s and 69 retries"),
    ]
    assert not outage.down


def test_a_new_outage_starts_over(caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    outage = OutageLog(logging.getLogger("test.outage"), "the store", every_s=10.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="test.outage"):
        outage.failed("down")
        clock.now += 5
        outage.recovered()
        clock.now += 100
        outage.failed("down again")
    assert [r.getMessage() for r in caplog.records] == [
        "the store is unreachable (down); retrying with backoff, next report in 10 s",
        "the store is reachable again after 5 s and 0 retries",
        "the store is unreachable (down again); retrying with backoff, next report in 10 s",
    ]
    with pytest.raises(ValueError, match="every_s"):
        OutageLog(logging.getLogger("x"), "x", every_s=0)
