"""`IngestPool`: OTLP bodies are decoded, and traces built, in worker processes.

Why processes: decoding a body and building a `RagTrace` from its spans are
pure-Python work (~0.29 ms and ~0.2 ms of CPU for a 4-span RAG trace, together
over half of all ingest CPU). In threads they share one core with the event
loop and the store through the GIL; in a worker process they run on another.
bench/RESULTS.md ("Decode and build in worker processes") has the numbers.

What crosses the process boundary is kept cheap, and the request's path short.
A decoder only screens a protobuf body (service/ingest/otlp_protobuf.py): it applies the rules
that reject spans and returns each accepted span as a `WireSpan`, the four
fields the assembler routes by plus the span's wire bytes. Converting the
attributes happens in a builder, with building the trace: screening costs
~0.09 ms of CPU a trace where a full decode cost ~0.19 ms (the decoder process,
pickling included, went from ~0.32 to ~0.19 ms a trace), and a request waits
for it. OTLP/JSON spans are decoded in the decoder and
come back as `PackedSpan`s (pickled). The server process never opens either:
it groups them by trace, hands the groups to a builder, and unpickles only the
finished `RagTrace`s, which cross as plain values (service/ingest/built_traces.py).
In distributed mode (`max_record_bytes` set) a decoder returns the spans-topic
records the replica publishes instead (service/ingest/span_records.py): the
spans cross once, framed, and the server only hands them to the producer.
Decoders and builders are separate pools: in one shared pool a build waited
behind queued decodes and a decode behind builds, and both idled half the time.
Builders run at a lower CPU priority, since a decode is on a request's path.

`processes` (config `server.ingest_processes`) is the number of workers per
role; 0 decodes and builds in threads of this process, which is what a one-core
machine should do; unset means one per usable CPU beyond the first, at most
`MAX_DEFAULT_PROCESSES`. Workers are forked from a forkserver that imported
this module once, and without the parent's `__main__`, so starting a pool
costs tens of milliseconds and no worker inherits the server's threads. The
event loop writes calls to them and reads their answers itself
(service/ingest/loop_pool.py says why).

Faults: a worker that dies (killed, out of memory) is replaced at once
(`ragmon_ingest_pool_restarts_total`); the calls it held run again in a thread
of this process (packed spans are unpacked here), so nothing is lost. A body
that cannot be decoded raises the same `DecodeError` as in-process decoding
(errors pickle with their state: service/errors.py); a trace that cannot be
built is logged and counted as an assembly failure, as in-process.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from service.assemble import SpanGroups, build_each
from service.conventions.pricing import PriceTable
from service.conventions.semconv import build_trace
from service.conventions.spans import AnySpan, LogEvent, PackedSpan, Span, WireSpan
from service.ingest import otlp, otlp_body, otlp_logs, otlp_protobuf, span_records
from service.ingest.built_traces import PackedTrace, pack_all, unpack_all
from service.ingest.drop_log import DropLog
from service.ingest.loop_pool import LoopProcessPool, WorkerDied
from service.ingest.span_redaction import SpanRedaction
from service.metrics import Metrics
from service.model import RagTrace
from service.processes import usable_cpus, worker_context
from service.runtime import GC_THRESHOLDS

log = logging.getLogger(__name__)

MAX_DEFAULT_PROCESSES = 4
# Traces per build call. The calls of one emission are sent together, so the server unpickles
# finished chunks while the builder works on the next; 8 instead of 32 measured no difference.
BUILD_CHUNK = 32

# Builders run at a lower CPU priority than decoders: a decode is on a request's path, a build
# only has to keep up on average.
BUILDER_NICENESS = 5

T = TypeVar("T")
U = TypeVar("U")


def default_processes() -> int:
    """One worker per role per CPU this process may use (`usable_cpus`), beyond the first (0 on one
    CPU)."""
    return max(0, min(MAX_DEFAULT_PROCESSES, usable_cpus() - 1))


def _unpacked(span: AnySpan, problems: otlp.DecodedBatch) -> Span | LogEvent:
    if isinstance(span, WireSpan):
        return otlp_protobuf.span_from_wire(span, problems)
    if isinstance(span, PackedSpan):
        return span.unpack()
    return span


# (a trace per group, None where building failed; what was dropped while decoding the spans)
BuiltGroups = tuple[list[RagTrace | None], otlp.DecodedBatch]
# the same out of a builder process: each trace as plain values (built_traces.py says why)
PackedGroups = tuple[list[PackedTrace | None], otlp.DecodedBatch]


def _build_groups(groups: SpanGroups, prices: PriceTable) -> BuiltGroups:
    """One trace per group, spans unpacked or decoded from the wire first: what a builder does,
    and what this process does in its place when there is no builder (or it died)."""

    def build(spans: Sequence[Span | LogEvent], partial: bool) -> RagTrace:
        return build_trace(spans, partial=partial, prices=prices)

    problems = otlp.DecodedBatch()
    unpacked = [([_unpacked(span, problems) for span in spans], partial) for spans, partial in groups]
    return build_each(build, unpacked), problems


# ---------------------------------------------------------------- in the worker process

_worker_prices: PriceTable | None = None


def _worker_init(prices: PriceTable, niceness: int) -> None:
    global _worker_prices
    _worker_prices = prices
    if niceness:
        os.nice(niceness)
    # Decoding and building allocate hundreds of containers a trace: the server's GC settings
    # (service/runtime.py) keep the collector from running every few traces here too.
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _decode_packed(
    body: bytes, *, json_body: bool, encoding: str, tenant: str, limit: int
) -> otlp.DecodedBatch:
    batch = otlp_body.decode_body(body, json_body=json_body, encoding=encoding, tenant=tenant, limit=limit)
    # protobuf spans come screened, as wire bytes; OTLP/JSON spans are decoded, and pickled here
    batch.spans = [PackedSpan.pack(span) if isinstance(span, Span) else span for span in batch.spans]
    return batch


def _decode_records(
    body: bytes,
    max_record_bytes: int,
    redaction: SpanRedaction | None,
    *,
    json_body: bool,
    encoding: str,
    tenant: str,
    limit: int,
) -> otlp.DecodedBatch:
    """Distributed mode: the body decoded (and redacted) as `_decode_packed` would, its accepted spans
    encoded into spans-topic records where they were decoded (`span_records.as_records`)."""
    decode = otlp_body.decode_body if redaction is None else redaction.decode_traces
    batch = decode(body, json_body=json_body, encoding=encoding, tenant=tenant, limit=limit)
    return span_records.as_records(batch, max_record_bytes)


def _build_in_worker(groups: SpanGroups) -> PackedGroups:
    assert _worker_prices is not None, "worker started without its initializer"
    traces, problems = _build_groups(groups, _worker_prices)
    return pack_all(traces), problems


# ---------------------------------------------------------------- in the server process


def _itself(answer: T) -> T:
    return answer


def _unpacked_groups(answer: PackedGroups) -> BuiltGroups:
    packed, problems = answer
    return unpack_all(packed), problems


class _Workers:
    """One role's worker processes and their fault handling: a call its worker could not answer
    (the worker died) runs in a thread of this process instead."""

    def __init__(
        self, role: str, processes: int, prices: PriceTable, metrics: Metrics, niceness: int = 0
    ) -> None:
        self.role = role
        self.niceness = niceness
        self.processes = processes
        self.prices = prices
        self.metrics = metrics
        self.pool: LoopProcessPool | None = None

    async def start(self) -> None:
        if self.processes > 0 and self.pool is None:
            pool = LoopProcessPool(
                self.processes,
                worker_context(),
                initializer=_worker_init,
                initargs=(self.prices, self.niceness),
                on_worker_died=self.metrics.ingest_pool_restarts.labels(role=self.role).inc,
                name=f"ingest {self.role}",
            )
            await pool.start()
            self.pool = pool

    def pids(self) -> set[int]:
        return self.pool.pids() if self.pool is not None else set()

    async def run(self, in_worker: Callable[[], T], here: Callable[[], T]) -> T:
        return await self.run_as(in_worker, here, _itself)

    async def run_as(
        self, in_worker: Callable[[], U], here: Callable[[], T], answered: Callable[[U], T]
    ) -> T:
        """`answered(in_worker())` as a worker answered it, or `here()` in a thread of this process
        when there is no worker or it died holding the call."""
        pool = self.pool
        if pool is not None:
            try:
                return answered(await pool.call(in_worker))
            except WorkerDied:
                pass  # logged and counted by the pool, which has started another
        return await asyncio.to_thread(here)

    async def stop(self) -> None:
        pool, self.pool = self.pool, None  # calls from now on run here
        if pool is not None:
            await pool.close()


class IngestPool:
    """Decodes OTLP bodies in `processes` decoder processes and builds traces in as many builder
    processes, or does both in threads when `processes` is 0."""

    def __init__(
        self,
        processes: int | None,
        prices: PriceTable,
        metrics: Metrics,
        redaction: SpanRedaction | None = None,
        max_record_bytes: int | None = None,
    ) -> None:
        self.processes = default_processes() if processes is None else processes
        # with redaction on, what a decoder returns is redacted there (span_redaction.py)
        self.redaction = redaction
        # distributed mode (the broker's `kafka.max_record_bytes`): a decoder returns spans-topic
        # records instead of spans, so they cross to this process once, framed, and this process does
        # not frame them (bench/RESULTS.md, "Session 36")
        self.max_record_bytes = max_record_bytes
        # Separate pools: a build waiting behind queued decodes (or a decode behind a build) in
        # one shared FIFO starved the other and left both processes half idle.
        self.decoders = _Workers("decoder", self.processes, prices, metrics)
        self.builders = _Workers("builder", self.processes, prices, metrics, niceness=BUILDER_NICENESS)
        self.prices = prices
        self.metrics = metrics
        self.drop_log = DropLog(log)

    def account(self, decoded: otlp.DecodedBatch) -> None:
        """Count what decoding a request (or building traces) refused, dropped and truncated, and log
        the dropped and truncated values (`DropLog`: at most once per interval)."""
        for reason, count in decoded.rejections.items():
            self.metrics.reject(reason, count)
        if decoded.truncated:
            self.metrics.ingest_truncated.inc(decoded.truncated)
        for kind, count in decoded.redactions.items():
            self.metrics.redactions.labels(kind=kind).inc(count)
        self.drop_log.note(decoded)

    @property
    def running(self) -> int:
        """Worker processes per role now (0 before start, after stop, or with `processes` 0)."""
        return self.processes if self.decoders.pool is not None else 0

    async def start(self) -> None:
        """Start the workers now rather than on the first request. Safe twice."""
        await self.decoders.start()
        await self.builders.start()

    def worker_pids(self) -> dict[str, set[int]]:
        """Process ids of the live workers by role; empty sets without pools."""
        return {"decoder": self.decoders.pids(), "builder": self.builders.pids()}

    async def decode(
        self, body: bytes, *, json_body: bool, encoding: str, tenant: str, limit: int
    ) -> otlp.DecodedBatch:
        """`otlp_body.decode_body`, in a worker (spans come back packed, or as spans-topic records with
        `max_record_bytes` set); raises what it raises (`DecodeError`, `PayloadTooLarge`,
        `UnsupportedMediaType`)."""
        kwargs: dict[str, Any] = {
            "json_body": json_body,
            "encoding": encoding,
            "tenant": tenant,
            "limit": limit,
        }
        if self.max_record_bytes is not None:
            to_records = functools.partial(
                _decode_records, body, self.max_record_bytes, self.redaction, **kwargs
            )
            return await self.decoders.run(to_records, to_records)
        if self.redaction is not None:
            return await self.decoders.run(
                functools.partial(self.redaction.decode_traces, body, packed=True, **kwargs),
                functools.partial(self.redaction.decode_traces, body, **kwargs),
            )
        return await self.decoders.run(
            functools.partial(_decode_packed, body, **kwargs),
            functools.partial(otlp_body.decode_body, body, **kwargs),
        )

    async def decode_logs(
        self, body: bytes, *, json_body: bool, encoding: str, tenant: str, limit: int
    ) -> otlp_logs.DecodedLogs:
        """`otlp_logs.decode_logs_body`, in a worker; raises what it raises. Log events come back
        decoded (they are few and small next to spans)."""
        kwargs: dict[str, Any] = {
            "json_body": json_body,
            "encoding": encoding,
            "tenant": tenant,
            "limit": limit,
        }
        if self.redaction is not None:
            decode = functools.partial(self.redaction.decode_logs, body, **kwargs)
        else:
            decode = functools.partial(otlp_logs.decode_logs_body, body, **kwargs)
        return await self.decoders.run(decode, decode)

    async def build_traces(self, groups: SpanGroups) -> list[RagTrace | None]:
        """One trace per (spans, partial) group, None where building failed (logged). Attribute
        values dropped while decoding spans from the wire are counted (and logged) here: those that
        screening did not see (`value_scan.py`)."""
        chunks = [groups[start : start + BUILD_CHUNK] for start in range(0, len(groups), BUILD_CHUNK)]
        # all at once: the builders work through them while this process unpickles finished ones
        results = await asyncio.gather(
            *(
                self.builders.run_as(
                    functools.partial(_build_in_worker, chunk),
                    functools.partial(_build_groups, chunk, self.prices),
                    _unpacked_groups,
                )
                for chunk in chunks
            )
        )
        for _, problems in results:
            self.account(problems)
        return [trace for traces, _ in results for trace in traces]

    async def stop(self) -> None:
        """Let calls in flight finish, then end the workers. Safe twice and before start."""
        await self.decoders.stop()
        await self.builders.stop()
