"""Waiting, on a running event loop, for a condition that background tasks make true."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def eventually(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Return once `condition()` holds, checking every 10 ms of real time (timers and ticks run
    meanwhile); fail the test after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)
