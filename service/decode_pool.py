"""`DecodePool`: OTLP bodies are decompressed and decoded in worker processes.

Why processes: decoding is pure-Python work (~0.29 ms of CPU for a 4-span RAG
trace, a quarter of all ingest CPU), and a thread shares one core with the
event loop, the trace builder and the store through the GIL. A worker process
decodes on another core; the server pays only for unpickling the spans it gets
back (~0.06 ms a trace). bench/RESULTS.md ("Decoding in worker processes") has
the measurements.

`processes` (config `server.decode_processes`): 0 decodes in a thread of this
process, which is what a one-core machine should do; unset means one process
per CPU beyond the first, at most `MAX_DEFAULT_PROCESSES`.

Workers are forked from a forkserver that imported `service.otlp` once, so
starting a pool costs milliseconds and no worker inherits the server's threads.

Faults: a worker that dies (killed, out of memory) breaks its whole executor.
The requests that were in it are decoded again in a thread of this process,
nothing is lost, and the executor is replaced
(`ragmon_decode_pool_restarts_total`). A body that cannot be decoded raises
the same `DecodeError` as it would in-process (errors pickle with their
state: service/errors.py).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from service import otlp
from service.metrics import Metrics
from service.runtime import GC_THRESHOLDS

log = logging.getLogger(__name__)

MAX_DEFAULT_PROCESSES = 4


def default_processes() -> int:
    """One decode process per CPU this process may run on, beyond the first (0 on one CPU)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(0, min(MAX_DEFAULT_PROCESSES, cpus - 1))


def _context() -> multiprocessing.context.BaseContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["service.otlp"])
    return context


def _worker_init() -> None:
    # Decoding allocates hundreds of containers a trace: the same GC settings as the server
    # (service/runtime.py) keep the collector from running every few traces.
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


class DecodePool:
    """Decodes OTLP bodies in `processes` worker processes, or in a thread when that is 0."""

    def __init__(self, processes: int | None, metrics: Metrics) -> None:
        self.processes = default_processes() if processes is None else processes
        self.metrics = metrics
        self._executor: ProcessPoolExecutor | None = None

    def _new_executor(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(self.processes, mp_context=_context(), initializer=_worker_init)

    async def start(self) -> None:
        """Start the workers now rather than on the first request. Safe twice."""
        if self.processes > 0 and self._executor is None:
            self._executor = self._new_executor()
            await self.worker_pids()

    async def worker_pids(self) -> set[int]:
        """Process ids of the live workers (asking each until all have answered); empty without a pool."""
        executor = self._executor
        if executor is None:
            return set()
        loop = asyncio.get_running_loop()
        pids: set[int] = set()
        # A pool spawns workers as calls wait, so ask in rounds until every worker has answered.
        for _ in range(10 * self.processes):
            answers = await asyncio.gather(
                *(loop.run_in_executor(executor, os.getpid) for _ in range(self.processes))
            )
            pids.update(answers)
            if len(pids) >= self.processes:
                break
        return pids

    async def decode(
        self, body: bytes, *, json_body: bool, encoding: str, tenant: str, limit: int
    ) -> otlp.DecodedBatch:
        """`otlp.decode_body` in a worker; raises what it raises (`DecodeError`, `PayloadTooLarge`, ...)."""
        call = functools.partial(
            otlp.decode_body, body, json_body=json_body, encoding=encoding, tenant=tenant, limit=limit
        )
        executor = self._executor
        if executor is None:
            return await asyncio.to_thread(call)
        try:
            return await asyncio.get_running_loop().run_in_executor(executor, call)
        except BrokenProcessPool:
            self._replace(executor)
        except RuntimeError:
            if self._executor is executor:
                raise
            # shut down under us (stop() while this request was in flight): decode here
        return await asyncio.to_thread(call)

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        if self._executor is not broken:
            return  # another request already replaced it
        log.error(
            "a decode worker process died; its requests are decoded in the server process "
            "and a new pool is started"
        )
        self.metrics.decode_pool_restarts.inc()
        broken.shutdown(wait=False, cancel_futures=True)
        self._executor = self._new_executor()

    async def stop(self) -> None:
        """Let calls in flight finish, then end the workers. Safe twice and before start."""
        executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.to_thread(executor.shutdown, True)
