"""`IngestPool`: OTLP bodies are decoded, and traces built, in worker processes.

Why processes: decoding a body and building a `RagTrace` from its spans are
pure-Python work (~0.29 ms and ~0.2 ms of CPU for a 4-span RAG trace, together
over half of all ingest CPU). In threads they share one core with the event
loop and the store through the GIL; in a worker process they run on another.
bench/RESULTS.md ("Decode and build in worker processes") has the numbers.

What crosses the process boundary is kept cheap, and the request's path short.
A decoder only screens a protobuf body (service/otlp.py): it applies the rules
that reject spans and returns each accepted span as a `WireSpan`, the four
fields the assembler routes by plus the span's wire bytes. Converting the
attributes happens in a builder, with building the trace: screening costs
~0.09 ms of CPU a trace where a full decode cost ~0.19 ms (the decoder process,
pickling included, went from ~0.32 to ~0.19 ms a trace), and a request waits
for it. OTLP/JSON spans are decoded in the decoder and
come back as `PackedSpan`s (pickled). The server process never opens either:
it groups them by trace, hands the groups to a builder, and unpickles only the
finished `RagTrace`s. Decoders and builders are separate pools: in one shared
pool a build waited behind queued decodes and a decode behind builds, and both
idled half the time. Builders run at a lower CPU priority, since a decode is
on a request's path.

`processes` (config `server.ingest_processes`) is the number of workers per
role; 0 decodes and builds in threads of this process, which is what a one-core
machine should do; unset means one per usable CPU beyond the first, at most
`MAX_DEFAULT_PROCESSES`. Workers are forked from a forkserver that imported
this module once, and without the parent's `__main__`, so starting a pool
costs tens of milliseconds and no worker inherits the server's threads.

Faults: a worker that dies (killed, out of memory) breaks its whole executor.
The calls that were in it run again in a thread of this process (packed spans
are unpacked here), nothing is lost, and the executor is replaced
(`ragmon_ingest_pool_restarts_total`). A body that cannot be decoded raises
the same `DecodeError` as in-process decoding (errors pickle with their state:
service/errors.py); a trace that cannot be built is logged and counted as an
assembly failure, as in-process.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import gc
import logging
import math
import multiprocessing
import os
import select
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from service import otlp
from service.assemble import SpanGroups, build_each
from service.metrics import Metrics
from service.model import RagTrace
from service.pricing import PriceTable
from service.runtime import GC_THRESHOLDS
from service.semconv import build_trace
from service.spans import AnySpan, PackedSpan, Span, WireSpan

log = logging.getLogger(__name__)

MAX_DEFAULT_PROCESSES = 4
# Traces per build call. The calls of one emission are sent together, so the server unpickles
# finished chunks while the builder works on the next; 8 instead of 32 measured no difference.
BUILD_CHUNK = 32

# Builders run at a lower CPU priority than decoders: a decode is on a request's path, a build
# only has to keep up on average.
BUILDER_NICENESS = 5

T = TypeVar("T")


def _cgroup_cpus(path: Path = Path("/sys/fs/cgroup/cpu.max")) -> int | None:
    """CPUs a cgroup v2 quota allows (a container's CPU limit), None without a quota."""
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, math.ceil(int(quota) / int(period)))


def default_processes() -> int:
    """One worker per role per CPU this process may use, beyond the first (0 on one CPU).

    "May use": the CPUs it is pinned to, and no more than a container's CPU quota allows
    (a pod limited to one CPU on a 64-core node must not start 4 decoders)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    quota = _cgroup_cpus()
    if quota is not None:
        cpus = min(cpus, quota)
    return max(0, min(MAX_DEFAULT_PROCESSES, cpus - 1))


def _context() -> multiprocessing.context.BaseContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["service.ingest_pool"])
    return context


def _unpacked(span: AnySpan, problems: otlp.DecodedBatch) -> Span:
    if isinstance(span, WireSpan):
        return otlp.span_from_wire(span, problems)
    if isinstance(span, PackedSpan):
        return span.unpack()
    return span


# (a trace per group, None where building failed; attribute values dropped, by reason)
BuiltGroups = tuple[list[RagTrace | None], dict[str, int]]


def _build_groups(groups: SpanGroups, prices: PriceTable) -> BuiltGroups:
    """One trace per group, spans unpacked or decoded from the wire first: what a builder does,
    and what this process does in its place when there is no builder (or it died)."""

    def build(spans: Sequence[Span], partial: bool) -> RagTrace:
        return build_trace(spans, partial=partial, prices=prices)

    problems = otlp.DecodedBatch()
    unpacked = [([_unpacked(span, problems) for span in spans], partial) for spans, partial in groups]
    return build_each(build, unpacked), problems.rejections


@contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Start workers without the parent's `__main__`.

    A forkserver child re-imports the parent's main module (pytest, a user's
    script, the CLI with FastAPI) before it runs anything: ~0.7 s and tens of MB
    per worker, for nothing a worker uses. Python 3.11 ignores "__main__" in the
    forkserver preload list, so the main module is swapped for a bare one while
    the workers are started; they are all started here, never later.
    """
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


# ---------------------------------------------------------------- in the worker process

_worker_prices: PriceTable | None = None


def _exit_when_gone(pid: int) -> None:
    """End this worker as soon as process `pid` (the ragmon server) has ended, however it ended.

    A worker otherwise outlives a server that was killed or stopped by a signal it does not
    handle: it holds both ends of its own call queue, so the read it waits in never ends, and
    the forkserver and resource tracker it keeps open stay too (all orphans, found after
    `ragmon demo` was ended with SIGTERM).
    """
    try:
        handle = os.pidfd_open(pid)  # Linux 5.3+: readable once the process has exited
    except (AttributeError, OSError):
        handle = None

    def watch() -> None:
        if handle is not None:
            select.select([handle], [], [])
        else:
            while True:
                time.sleep(1.0)
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                except PermissionError:
                    continue  # exists, not ours to signal
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-server", daemon=True).start()


def _worker_init(prices: PriceTable, niceness: int, server_pid: int) -> None:
    global _worker_prices
    _worker_prices = prices
    _exit_when_gone(server_pid)
    if niceness:
        os.nice(niceness)
    # Decoding and building allocate hundreds of containers a trace: the server's GC settings
    # (service/runtime.py) keep the collector from running every few traces here too.
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _decode_packed(
    body: bytes, *, json_body: bool, encoding: str, tenant: str, limit: int
) -> otlp.DecodedBatch:
    batch = otlp.decode_body(body, json_body=json_body, encoding=encoding, tenant=tenant, limit=limit)
    # protobuf spans come screened, as wire bytes; OTLP/JSON spans are decoded, and pickled here
    batch.spans = [PackedSpan.pack(span) if isinstance(span, Span) else span for span in batch.spans]
    return batch


def _build_in_worker(groups: SpanGroups) -> BuiltGroups:
    assert _worker_prices is not None, "worker started without its initializer"
    return _build_groups(groups, _worker_prices)


# ---------------------------------------------------------------- in the server process

PIPE_BYTES = 4 << 20
"""Capacity asked for a pool's pipes; /proc/sys/fs/pipe-max-size (1 MiB by default) caps it."""


def _widen_pipes(executor: ProcessPoolExecutor) -> None:
    """Let a whole body, and a whole answer, sit in a pool's pipes at once.

    A pipe holds 64 KiB by default, so a 700 KB body or answer crossed in ten or more reads, and
    in the server each read took the GIL back from the event loop and the sink threads before
    the next could start. Decoding a 100-trace bench body in a decoder beside two GIL-busy
    threads took p50 52 / p99 74 ms with default pipes and 38 / 62 ms with 1 MiB ones
    (bench/ingest/pipe_size.py). Best effort: the pipes are the executor's own (CPython
    3.11-3.13 name them so), and a pipe that cannot grow works as before.
    """
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux only
    queues = (getattr(executor, "_call_queue", None), getattr(executor, "_result_queue", None))
    readers = [getattr(queue, "_reader", None) for queue in queues]
    if set_size is None or not all(readers):
        log.debug("process pool pipes left at their default size")
        return
    try:
        limit = int(Path("/proc/sys/fs/pipe-max-size").read_text())
    except (OSError, ValueError):
        limit = 1 << 20
    for reader in readers:
        try:
            fcntl.fcntl(reader.fileno(), set_size, min(PIPE_BYTES, limit))
        except OSError as exc:  # over the user's pipe-buffer quota (fs/pipe-user-pages-soft)
            log.debug("process pool pipe left at its default size: %s", exc)


class _Workers:
    """One process pool and its fault handling: a call that finds it broken runs here instead."""

    def __init__(
        self, role: str, processes: int, prices: PriceTable, metrics: Metrics, niceness: int = 0
    ) -> None:
        self.role = role
        self.niceness = niceness
        self.processes = processes
        self.prices = prices
        self.metrics = metrics
        self.executor: ProcessPoolExecutor | None = None

    def _new_executor(self) -> ProcessPoolExecutor:
        """A pool with all its workers started (a pool starts one per call while none is idle)."""
        executor = ProcessPoolExecutor(
            self.processes,
            mp_context=_context(),
            initializer=_worker_init,
            initargs=(self.prices, self.niceness, os.getpid()),
        )
        _widen_pipes(executor)
        with _main_module_hidden():
            for _ in range(self.processes):
                executor.submit(os.getpid)
        return executor

    async def start(self) -> None:
        if self.processes > 0 and self.executor is None:
            self.executor = self._new_executor()

    async def pids(self) -> set[int]:
        """Process ids of the workers, asked until each has answered once."""
        executor = self.executor
        if executor is None:
            return set()
        loop = asyncio.get_running_loop()
        pids: set[int] = set()
        for _ in range(10 * self.processes):
            answers = await asyncio.gather(
                *(loop.run_in_executor(executor, os.getpid) for _ in range(self.processes))
            )
            pids.update(answers)
            if len(pids) >= self.processes:
                break
        return pids

    async def run(self, in_worker: Callable[[], T], here: Callable[[], T]) -> T:
        executor = self.executor
        if executor is None:
            return await asyncio.to_thread(here)
        try:
            return await asyncio.get_running_loop().run_in_executor(executor, in_worker)
        except BrokenProcessPool:
            self._replace(executor)
        except RuntimeError:
            if self.executor is executor:
                raise
            # shut down under us (stop() while this call was in flight): run it here
        return await asyncio.to_thread(here)

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        if self.executor is not broken:
            return  # another call already replaced it
        log.error(
            "an ingest %s process died; the calls it held run in the server process "
            "and a new pool is started",
            self.role,
        )
        self.metrics.ingest_pool_restarts.labels(role=self.role).inc()
        broken.shutdown(wait=False, cancel_futures=True)
        self.executor = self._new_executor()

    async def stop(self) -> None:
        executor, self.executor = self.executor, None
        if executor is not None:
            await asyncio.to_thread(executor.shutdown, True)


class IngestPool:
    """Decodes OTLP bodies in `processes` decoder processes and builds traces in as many builder
    processes, or does both in threads when `processes` is 0."""

    def __init__(self, processes: int | None, prices: PriceTable, metrics: Metrics) -> None:
        self.processes = default_processes() if processes is None else processes
        # Separate pools: a build waiting behind queued decodes (or a decode behind a build) in
        # one shared FIFO starved the other and left both processes half idle.
        self.decoders = _Workers("decoder", self.processes, prices, metrics)
        self.builders = _Workers("builder", self.processes, prices, metrics, niceness=BUILDER_NICENESS)
        self.prices = prices
        self.metrics = metrics

    @property
    def running(self) -> int:
        """Worker processes per role now (0 before start, after stop, or with `processes` 0)."""
        return self.processes if self.decoders.executor is not None else 0

    async def start(self) -> None:
        """Start the workers now rather than on the first request. Safe twice."""
        await self.decoders.start()
        await self.builders.start()

    async def worker_pids(self) -> dict[str, set[int]]:
        """Process ids of the live workers by role; empty sets without pools."""
        return {"decoder": await self.decoders.pids(), "builder": await self.builders.pids()}

    async def decode(
        self, body: bytes, *, json_body: bool, encoding: str, tenant: str, limit: int
    ) -> otlp.DecodedBatch:
        """`otlp.decode_body`, in a worker (spans come back packed); raises what it raises
        (`DecodeError`, `PayloadTooLarge`, `UnsupportedMediaType`)."""
        kwargs: dict[str, Any] = {
            "json_body": json_body,
            "encoding": encoding,
            "tenant": tenant,
            "limit": limit,
        }
        return await self.decoders.run(
            functools.partial(_decode_packed, body, **kwargs),
            functools.partial(otlp.decode_body, body, **kwargs),
        )

    async def build_traces(self, groups: SpanGroups) -> list[RagTrace | None]:
        """One trace per (spans, partial) group, None where building failed (logged). Attribute
        values dropped while decoding spans from the wire are counted as rejections here."""
        chunks = [groups[start : start + BUILD_CHUNK] for start in range(0, len(groups), BUILD_CHUNK)]
        # all at once: the builders work through them while this process unpickles finished ones
        results = await asyncio.gather(
            *(
                self.builders.run(
                    functools.partial(_build_in_worker, chunk),
                    functools.partial(_build_groups, chunk, self.prices),
                )
                for chunk in chunks
            )
        )
        for _, rejections in results:
            for reason, count in rejections.items():
                self.metrics.reject(reason, count)
        return [trace for traces, _ in results for trace in traces]

    async def stop(self) -> None:
        """Let calls in flight finish, then end the workers. Safe twice and before start."""
        await self.decoders.stop()
        await self.builders.stop()
