"""`RequestPool`: CPU-heavy work a request asks for runs in a worker process, never on the event loop.

Parsing an uploaded 10 MB golden set is seconds of pure-Python work. On the
event loop it froze every request of every tenant (`/healthz` took 6.7 s);
in a thread it still shares the GIL with the loop, so every step the loop
takes waits for the parser to give the GIL up (up to the 5 ms switch
interval, for each of the loop's dozens of GIL hand-offs a request). In a
process of its own it shares nothing: the loop only writes the body into a
pipe and reads a few strings back (`LoopProcessPool`, the ingest pools'
machinery). The worker runs at a lower CPU priority, so a tenant's upload
takes the CPU the others leave.

One worker process, started at the first call: most servers never take an
upload. With `server.ingest_processes` at 0 (a one-core machine: no worker
processes at all) and when the worker died during a call, the call runs in a
thread of this process instead, as the ingest pools do.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import TypeVar

from service.ingest.loop_pool import LoopProcessPool, WorkerDied
from service.processes import worker_context

__all__ = ["REQUEST_WORKER_NICENESS", "RequestPool"]

log = logging.getLogger(__name__)

T = TypeVar("T")

REQUEST_WORKER_NICENESS = 10
"""Below the ingest builders (5): an upload must not slow down the traces of every tenant."""


def _worker_init(niceness: int) -> None:
    if niceness:
        os.nice(niceness)


class RequestPool:
    """One worker process for requests' CPU-heavy calls (`run`), or threads when `processes` is 0."""

    def __init__(self, processes: int) -> None:
        if processes not in (0, 1):
            raise ValueError(f"a request pool has 0 or 1 worker process, got {processes}")
        self.processes = processes
        self._pool: LoopProcessPool | None = None
        self._starting = asyncio.Lock()
        self._stopped = False

    async def run(self, fn: Callable[[], T]) -> T:
        """`fn()` (a picklable zero-argument callable, as `functools.partial` of a module function
        makes) in the worker process, or in a thread; raises what `fn` raises."""
        pool = await self._started()
        if pool is not None:
            try:
                return await pool.call(fn)
            except WorkerDied:
                log.warning("request worker process died during a call; running it in a thread")
        return await asyncio.to_thread(fn)

    async def _started(self) -> LoopProcessPool | None:
        if self.processes == 0 or self._stopped:
            return None
        async with self._starting:
            if self._pool is None:
                pool = LoopProcessPool(
                    1,
                    worker_context(),
                    initializer=_worker_init,
                    initargs=(REQUEST_WORKER_NICENESS,),
                    name="request worker",
                )
                await pool.start()
                self._pool = pool
        return self._pool

    def pids(self) -> set[int]:
        """The worker's process id once started; empty before, after `stop` and with threads."""
        return self._pool.pids() if self._pool is not None else set()

    async def stop(self) -> None:
        """Let calls in flight finish, then end the worker; later calls run in threads. Safe twice."""
        self._stopped = True
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
