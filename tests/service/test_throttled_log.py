"""`service/throttled_log.py`: the first line of a repeated condition at once, then one per interval."""

from __future__ import annotations

import logging

import pytest

from service.throttled_log import ThrottledLog


def test_a_line_is_due_at_first_then_once_the_last_is_every_s_old() -> None:
    now = [100.0]
    throttled = ThrottledLog(logging.getLogger("test.throttled"), every_s=30.0, clock=lambda: now[0])
    assert throttled.due(throttled.clock())
    throttled.said_at = 100.0
    assert [throttled.due(t) for t in (100.0, 129.9, 130.0, 200.0)] == [False, False, True, True]


@pytest.mark.parametrize("every_s", [0.0, -1.0])
def test_an_interval_that_is_not_positive_is_refused(every_s: float) -> None:
    with pytest.raises(ValueError, match="every_s must be positive"):
        ThrottledLog(logging.getLogger("test.throttled"), every_s=every_s)
