"""Starting and stopping the background tasks every long-running component owns."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_task(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` and wait until it has finished; a no-op for None (stop before start, or twice)."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
