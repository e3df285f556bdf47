"""Kafka mode: the spans of one trace reach different ingest replicas minutes apart, and the trace is
completed from its stored state (issue 34, item 1). Real broker (tansu), real PostgreSQL, `ragmon serve`
replicas as subprocesses.

* A sinks worker in this process, its clock the test's: children to one replica, the trace flushed idle
  and stored partial, its root and LLM call to the other replica five minutes later: the stored trace is
  replaced by the whole one, counted once, corrected exactly.
* A sinks worker SIGKILLed while the late spans it read were still open (held, not committed): its
  successor reads them again and completes the trace another worker stored, from the span archive;
  nothing is lost and nothing counted twice.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from service.config import load_config
from service.worker import Worker
from tests.distributed.conftest import (
    PROTOBUF,
    IngestProcess,
    WorkerProcess,
    count_rows,
    distributed_settings,
    stored_ids,
    until,
)
from tests.rag_spans import RagRequest, body

pytestmark = pytest.mark.slow

N = 12
ASSEMBLER = {"grace_s": 0.5, "idle_s": 120, "max_age_s": 900, "late_window_s": 1800}


def _send(replica: IngestProcess, *bodies: bytes) -> None:
    with httpx.Client(timeout=30) as client:
        for data in bodies:
            response = client.post(f"{replica.url}/v1/traces", content=data, headers=PROTOBUF)
            assert response.status_code == 200, response.text


def _rows(url: str) -> dict[str, tuple[int, bool, str | None, int]]:
    """trace id -> (span_count, partial, answer, input tokens)."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT trace_id, span_count, partial, answer, input_tokens FROM traces")
            ).all()
    except sa.exc.ProgrammingError:
        return {}
    finally:
        engine.dispose()
    return {str(r[0]): (int(r[1]), bool(r[2]), r[3], int(r[4])) for r in rows}


class Clock:
    def __init__(self) -> None:
        self.now = 50_000.0
        self.origin = datetime.now(UTC)

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return self.origin + timedelta(seconds=self.now - 50_000.0)


@contextmanager
def in_process_worker(
    settings: dict[str, Any], clock: Clock
) -> Iterator[tuple[Worker, Callable[[Any], Any]]]:
    """A sinks worker on an event loop of its own thread, its assembler and span archive on `clock`."""
    config = load_config(environ={}, overrides=settings)
    worker = Worker(config, ["sinks"])
    worker.pipeline.assembler.clock = clock.monotonic
    worker.pipeline.span_archive.clock = clock.wall
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def call(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(60)

    try:
        call(worker.start())
        yield worker, call
    finally:
        call(worker.stop())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _metric(worker: Worker, name: str, **labels: str) -> float:
    return float(worker.metrics.registry.get_sample_value(name, labels) or 0.0)


def test_a_trace_over_two_ingest_replicas_minutes_apart_is_completed_from_its_stored_state(
    kafka_bootstrap: str,
    pg_url: str,
    tmp_path: Path,
    ingests: Callable[[dict[str, Any]], IngestProcess],
) -> None:
    settings = distributed_settings(kafka_bootstrap, pg_url, tmp_path, assembler=ASSEMBLER)
    a, b = ingests(settings), ingests(settings)
    clock = Clock()
    requests = [RagRequest(duration_s=300) for _ in range(N)]
    with in_process_worker(settings, clock) as (worker, call):
        a.wait_ready()
        b.wait_ready()
        assembler = worker.pipeline.assembler
        _send(a, body(*(r.retrieve for r in requests)))  # the retriever's service exports to replica a
        until(lambda: assembler.open_traces == N, what="the retrieval spans read by the worker")
        clock.now += 121  # five minutes of LLM call: nothing comes; the traces go idle
        call(assembler.flush_due())
        until(lambda: len(_rows(pg_url)) == N, what="the partial traces stored")
        assert set(_rows(pg_url).values()) == {(1, True, None, 0)}
        assert _metric(worker, "ragmon_partial_traces_total", app="shop") == N
        clock.now += 179
        _send(b, body(*(s for r in requests for s in (r.generate, r.root))))  # the frontend: replica b
        until(lambda: assembler.open_traces == N, what="the late spans read by the worker")
        clock.now += 0.6
        call(assembler.flush_due())
        until(
            lambda: set(_rows(pg_url).values()) == {(3, False, requests[0].answer, 1000)},
            what="the stored traces completed",
        )
        assert stored_ids(pg_url) == dict.fromkeys((r.trace_id for r in requests), 1)
        # counted once, corrected by exactly the difference
        assert _metric(worker, "ragmon_traces_total", app="shop") == N
        assert _metric(worker, "ragmon_traces_updated_total", app="shop") == N
        assert _metric(worker, "ragmon_partial_traces_completed_total", app="shop") == N
        tokens = {"app": "shop", "model": "gpt-4o-mini"}
        assert _metric(worker, "ragmon_tokens_total", **tokens, kind="input") == 1000 * N
        assert _metric(worker, "ragmon_tokens_total", **tokens, kind="output") == 200 * N
        assert _metric(worker, "ragmon_stage_duration_seconds_count", app="shop", stage="total") == N
        assert _metric(worker, "ragmon_late_spans_total") == 2 * N
        # every record of the spans topic is committed once its trace is stored
        until(lambda: worker.pipeline.span_offsets.held == 0, what="nothing held")  # type: ignore[union-attr]


def test_a_worker_killed_before_merging_late_spans_loses_nothing_and_counts_nothing_twice(
    kafka_bootstrap: str,
    pg_url: str,
    tmp_path: Path,
    ingests: Callable[[dict[str, Any]], IngestProcess],
    workers: Callable[..., WorkerProcess],
) -> None:
    base = distributed_settings(kafka_bootstrap, pg_url, tmp_path, assembler=ASSEMBLER)
    # the first worker flushes a trace whose root has not come after 1 s, and then waits a minute
    # after a root: it holds the late spans open when it is killed
    first = workers({**base, "assembler": {**base["assembler"], "idle_s": 1, "grace_s": 60}}, "sinks")
    a, b = ingests(base), ingests(base)
    a.wait_ready()
    b.wait_ready()
    requests = [RagRequest(duration_s=200) for _ in range(N)]
    _send(a, body(*(r.retrieve for r in requests)))
    until(lambda: len(_rows(pg_url)) == N, what="the partial traces stored by the first worker")
    assert first.metric("ragmon_traces_total") == N
    _send(b, body(*(s for r in requests for s in (r.generate, r.root))))
    until(lambda: first.metric("ragmon_open_traces") == N, what="the late spans read and held open")
    first.kill()  # SIGKILL: acknowledged by the broker, read, not merged, not committed
    assert set(_rows(pg_url).values()) == {(1, True, None, 0)}
    second = workers(base, "sinks")
    until(
        lambda: set(_rows(pg_url).values()) == {(3, False, requests[0].answer, 1000)},
        timeout=90,
        what="the stored traces completed by the successor",
    )
    time.sleep(1.0)  # a redelivery arriving late would show as a row or a count too many
    assert stored_ids(pg_url) == dict.fromkeys((r.trace_id for r in requests), 1)
    assert count_rows(pg_url) == N
    # the successor did not count the traces again: it corrected them
    assert second.metric("ragmon_traces_total") == 0
    assert second.metric("ragmon_traces_updated_total") == N
    assert second.metric("ragmon_tokens_total", kind="input") == 1000 * N
    until(lambda: second.metric("ragmon_kafka_spans_held_records") == 0, timeout=20, what="nothing held")
