"""Waiting for a condition that background tasks make true: on a running event loop (`eventually`),
or from a test's thread while a live server runs in its own (`wait_until`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def eventually(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Return once `condition()` holds, checking every 10 ms of real time (timers and ticks run
    meanwhile); fail the test after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def wait_until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Return once `condition()` holds, checking every 50 ms; fail the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
