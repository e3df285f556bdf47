"""Distributed mode under faults, with a real broker, real PostgreSQL and `ragmon worker` subprocesses.

Each test ends by asserting the exact number of traces stored (rows in
PostgreSQL) and counted (`ragmon_traces_total`, summed over the workers that
counted them), so a lost or doubled trace fails it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from service.bus.kafka_bus import KafkaBus
from service.config import KafkaConfig
from service.metrics import Metrics
from service.model import ModelUsage
from tests.distributed.conftest import (
    Broker,
    IngestProcess,
    Postgres,
    WorkerProcess,
    count_rows,
    distributed_settings,
    post_spans,
    stored_ids,
    until,
)
from tests.distributed.traffic import json_traces, trace_ids, traces
from tests.fake_openai import FakeOpenAI, Reply
from tests.live_server import free_port, live_server

pytestmark = pytest.mark.slow


def _publish(settings: dict[str, Any], n: int) -> None:
    async def run() -> None:
        bus = KafkaBus(KafkaConfig.model_validate(settings["kafka"]), Metrics())
        await bus.start()
        await bus.consume_traces(traces(n))
        if not await bus.drain(30):
            raise AssertionError("the test could not publish its traces")
        await bus.stop()

    asyncio.run(run())


def _counted(*workers: WorkerProcess) -> float:
    return sum(w.metric("ragmon_traces_total") for w in workers)


def _partitions(worker: WorkerProcess) -> int:
    """Partitions the worker owns; 0 while it is still starting (a worker that exited fails the test)."""
    if worker.proc is not None and worker.proc.poll() is not None:
        raise AssertionError(f"worker exited with {worker.proc.returncode}:\n{worker.log_tail()}")
    try:
        return len(worker.health()["partitions"])
    except httpx.HTTPError:
        return 0


def _until_both_own_partitions(a: WorkerProcess, b: WorkerProcess, total: int) -> None:
    """Wait until the two workers share all `total` partitions, each owning some."""
    until(
        lambda: _partitions(a) > 0 and _partitions(b) > 0 and _partitions(a) + _partitions(b) == total,
        what="both workers own partitions",
    )


def _lock_waiters(url: str) -> int:
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    sa.text(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                    )
                ).scalar_one()
            )
    finally:
        engine.dispose()


def test_worker_killed_mid_batch_another_takes_over_nothing_lost_or_doubled(
    kafka_bootstrap: str,
    pg_url: str,
    tmp_path: Path,
    workers: Callable[..., WorkerProcess],
    ingests: Callable[[dict[str, Any]], IngestProcess],
) -> None:
    n = 400
    # Every trace is sampled, so each batch writes the judge queue after storing its traces and before
    # counting them (writers first, counters last: service/pipeline.py); blocking that table stops both
    # workers between "stored" and "counted, offsets committed", where the fan-out outbox must carry it.
    settings = distributed_settings(
        kafka_bootstrap,
        pg_url,
        tmp_path,
        kafka={"max_poll_records": 50},
        # sink batches of 50 (a sinks worker's assembler hands on up to bus.batch_size at once): the
        # workers block with traces of later batches still to store
        bus={"batch_size": 50},
        store={"timeout_s": 60},
        judging={"enabled": True, "workers": 0},
        sampler={"rates": {"base": 1.0}},
    )
    ingest = ingests(settings)
    a = workers(settings, "sinks")
    b = workers(settings, "sinks")
    ingest.wait_ready()
    total_partitions = 3 * settings["kafka"]["partitions"]  # spans, traces and feedback topics
    _until_both_own_partitions(a, b, total_partitions)
    blocker = sa.create_engine(pg_url, poolclass=NullPool).connect()
    try:
        blocker.execute(sa.text("LOCK TABLE judge_queue IN EXCLUSIVE MODE"))
        # through ingest: a 200 is the broker's acknowledgement; the workers assemble the spans
        ids = trace_ids(n)
        post_spans(ingest.url, ids)
        until(lambda: _lock_waiters(pg_url) >= 2, what="both workers blocked mid-batch")
        killed_counted = a.metric("ragmon_traces_total")
        stored_before_kill = count_rows(pg_url)
        assert killed_counted == 0 and 0 < stored_before_kill < n
        a.kill()
    finally:
        blocker.rollback()
        blocker.close()
    until(lambda: _partitions(b) == total_partitions, what="the survivor takes over every partition")
    until(lambda: count_rows(pg_url) == n, what=f"{n} traces stored")
    until(lambda: killed_counted + b.metric("ragmon_traces_total") >= n, what=f"{n} traces counted")
    time.sleep(1.0)  # anything redelivered late would show up as a count above n
    assert stored_ids(pg_url) == dict.fromkeys(ids, 1)
    assert killed_counted + b.metric("ragmon_traces_total") == n
    until(lambda: b.metric("ragmon_kafka_consumer_lag") == 0, timeout=10, what="no lag")
    until(lambda: b.metric("ragmon_kafka_spans_held_records") == 0, timeout=10, what="nothing held")
    print(f"\nsinks worker SIGKILLed mid-batch: sent {n}, acked {n}, stored {count_rows(pg_url)}")


def test_a_dead_workers_backlog_is_measured_through_the_gap_and_drains_to_zero(
    kafka_bootstrap: str,
    pg_url: str,
    tmp_path: Path,
    workers: Callable[..., WorkerProcess],
    ingests: Callable[[dict[str, Any]], IngestProcess],
) -> None:
    """Issue #34.4: the per-worker lag read 0 while acknowledged traces were read but not stored, and
    nothing while their worker was dead. The backlog is measured from the broker (high watermark minus
    the group's committed offset) by ingest and by every sinks worker, so it equals the acknowledged
    traces not stored before the kill, during the gap while the dead worker's partitions have no
    owner, and drains to 0 once the survivor has stored them all."""
    settings = distributed_settings(
        kafka_bootstrap,
        pg_url,
        tmp_path,
        kafka={"backlog_interval_s": 0.5, "max_poll_records": 50},
        # a trace waits for its root up to timeout_s: long enough that none is flushed partial here
        assembler={"grace_s": 0.5, "timeout_s": 300},
    )
    spans_topic = settings["kafka"]["spans_topic"]
    ingest = ingests(settings)
    a = workers(settings, "sinks")
    b = workers(settings, "sinks")
    ingest.wait_ready()
    total_partitions = 3 * settings["kafka"]["partitions"]  # spans, traces and feedback topics
    _until_both_own_partitions(a, b, total_partitions)

    def backlog(process: IngestProcess | WorkerProcess) -> float | None:
        """The spans topic's backlog as `process` last measured it; None while it has no measurement."""
        values = process.samples("ragmon_kafka_backlog_records", topic=spans_topic)
        return sum(values) if values else None

    # 100 whole traces: stored, and their records committed
    stored_first = trace_ids(100)
    post_spans(ingest.url, stored_first, "all")
    until(lambda: count_rows(pg_url) == 100, what="the first traces stored")
    until(lambda: backlog(ingest) == 0 and backlog(b) == 0, timeout=20, what="their records committed")
    assert ingest.metric("ragmon_kafka_reachable") == 1.0

    # 400 traces whose root has not arrived: acknowledged, read by the workers, open, not stored
    open_ids = trace_ids(400)
    post_spans(ingest.url, open_ids, "children")  # one record per trace and request: 400 records
    acked = len(stored_first) + len(open_ids)
    held = "ragmon_kafka_spans_held_records"
    until(lambda: a.metric(held) + b.metric(held) == len(open_ids), what="every open trace read and held")
    # what the per-worker lag shows: nothing left to read ...
    assert a.metric("ragmon_kafka_consumer_lag") == 0 and b.metric("ragmon_kafka_consumer_lag") == 0
    # ... while the backlog is every acknowledged trace that is not stored
    until(
        lambda: backlog(ingest) == backlog(a) == backlog(b) == len(open_ids),
        timeout=10,
        what="ingest and both workers measure the backlog",
    )
    assert acked - count_rows(pg_url) == 400
    held_by_a = a.metric(held)
    counted_by_a = a.metric("ragmon_traces_total")
    assert 0 < held_by_a < len(open_ids)

    a.kill()  # SIGKILL: its partitions have no owner until the group's session timeout ends
    b_share = _partitions(b)
    gap_checks = 0
    # the group notices the death 4-6 s after the kill (session timeout 6 s, heartbeats every 2 s),
    # and the survivor owns the partitions a few seconds later; each check takes ~0.5 s here
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline:
        before = count_rows(pg_url)
        measured = (backlog(ingest), backlog(b))
        if _partitions(b) != b_share or count_rows(pg_url) != before:
            break  # the survivor took over: the gap is over
        assert measured == (acked - before, acked - before) == (400, 400), measured
        gap_checks += 1
        time.sleep(0.25)
    assert gap_checks >= 2, "the gap was not observed"

    # the roots arrive: the survivor completes its own traces, then the dead worker's once it owns them
    post_spans(ingest.url, open_ids, "root")
    acked_records = len(stored_first) + 2 * len(open_ids)
    recovery_checks = 0
    while count_rows(pg_url) < acked:
        latest = backlog(ingest)
        stored = count_rows(pg_url)  # after the measurement: it only grows
        # never below what is acknowledged and not stored (a record is committed only once stored)
        assert latest is not None and acked - stored <= latest <= acked_records, (latest, stored)
        recovery_checks += 1
        time.sleep(0.3)
    until(lambda: _partitions(b) == total_partitions, what="the survivor owns every partition")
    until(lambda: backlog(ingest) == 0 and backlog(b) == 0, timeout=20, what="the backlog drained")
    time.sleep(1.0)
    assert stored_ids(pg_url) == dict.fromkeys(stored_first + open_ids, 1)
    assert counted_by_a + b.metric("ragmon_traces_total") == acked
    print(
        f"\nsinks worker SIGKILLed holding {held_by_a:.0f} open traces: acked {acked}, backlog 400 before "
        f"the kill and in {gap_checks} measurements of the gap (per-worker lag 0); {recovery_checks} "
        f"bounded on the way; stored {count_rows(pg_url)}, backlog 0 after"
    )


def test_postgres_restart_workers_retry_and_resume(
    kafka_bootstrap: str,
    postgres: Postgres,
    pg_url: str,
    tmp_path: Path,
    workers: Callable[..., WorkerProcess],
    ingests: Callable[[dict[str, Any]], IngestProcess],
) -> None:
    settings = distributed_settings(kafka_bootstrap, pg_url, tmp_path)
    ingest = ingests(settings)
    a = workers(settings, "sinks")
    b = workers(settings, "sinks")
    ingest.wait_ready()
    _publish(settings, 150)
    until(lambda: count_rows(pg_url) == 150, what="first traces stored")
    assert a.readiness() == b.readiness() == (200, "ok")
    postgres.stop()
    try:
        _publish(settings, 250)
        # ingest in Kafka mode does not need the store to take spans: it stays ready and answers 200
        assert ingest.readiness() == (200, "ok")
        span_ids = trace_ids(100)
        post_spans(ingest.url, span_ids)
        until(
            lambda: (
                a.metric("ragmon_sink_failures_total", sink="kafka", kind="retryable")
                + b.metric("ragmon_sink_failures_total", sink="kafka", kind="retryable")
                > 0
            ),
            what="a worker notices the store is down",
        )
        # alive (nothing to restart), not ready: a load balancer or rollout should wait for it
        status, detail = a.readiness()
        assert (status, detail.split(":")[0]) == (503, "store unavailable"), detail
        assert a.health()["status"] == "ok"
    finally:
        postgres.start()
    until(lambda: a.readiness()[0] == b.readiness()[0] == 200, what="ready again after the restart")
    until(lambda: count_rows(pg_url) == 500, what="all traces stored after the restart")
    until(lambda: _counted(a, b) >= 500, what="all traces counted")
    time.sleep(1.0)
    stored = stored_ids(pg_url)
    assert len(stored) == 500 and set(span_ids) <= set(stored) and set(stored.values()) == {1}
    assert _counted(a, b) == 500
    print(f"\nPostgreSQL restart: sent 500 (100 as spans while it was down), acked 500, stored {len(stored)}")


def test_a_worker_stuck_on_a_frozen_postgres_fails_liveness_and_loses_nothing(
    kafka_bootstrap: str,
    private_postgres: Postgres,
    tmp_path: Path,
    workers: Callable[..., WorkerProcess],
) -> None:
    """A database that stops answering without closing its connections (a frozen VM or stuck
    storage: here SIGSTOP, so the kernel still acknowledges every byte and no timeout fires) leaves
    the worker's store call waiting for ever. The consume loop has not ended, so before this check
    /healthz said ok and the pod was never restarted; now a turn older than 2 x
    max_poll_interval_s fails liveness. Once the server resumes, every trace is stored once."""
    url = private_postgres.database()
    settings = distributed_settings(kafka_bootstrap, url, tmp_path, kafka={"max_poll_interval_s": 5})
    worker = workers(settings, "sinks")
    worker.wait(lambda h: bool(h["partitions"]), timeout=60)
    _publish(settings, 60)
    until(lambda: count_rows(url) == 60, what="first traces stored")
    assert worker.health()["status"] == "ok"
    frozen = private_postgres.processes()
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        _publish(settings, 90)  # Kafka takes them; the worker's batch then waits on the frozen server
        dead = worker.wait(lambda h: h["status"] == "dead", timeout=60)
        assert dead["detail"].startswith("kafka consume loop stuck: its current turn has run"), dead
        assert dead["consume_turn_s"] >= 2 * 5  # rounded to 0.1 s: 10.04 s reads 10.0
        with httpx.Client() as client:
            assert client.get(f"http://127.0.0.1:{worker.port}/healthz", timeout=5).status_code == 503
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    worker.wait(lambda h: h["status"] == "ok", timeout=60)
    until(lambda: count_rows(url) == 150, what="all traces stored once the server resumed")
    until(lambda: _counted(worker) >= 150, what="all traces counted")
    stored = stored_ids(url)
    assert len(stored) == 150 and set(stored.values()) == {1}
    assert _counted(worker) == 150
    print(f"\nfrozen PostgreSQL: sent 150 (90 while frozen), stored {len(stored)}; liveness failed meanwhile")


def test_ingest_starts_and_takes_spans_while_its_postgres_is_unreachable(
    kafka_bootstrap: str,
    pg_url: str,
    tmp_path: Path,
    workers: Callable[..., WorkerProcess],
    ingests: Callable[[dict[str, Any]], IngestProcess],
) -> None:
    # Distributed ingest only publishes: a PostgreSQL outage at its start (a rollout during a
    # database restart) must not keep it from answering 200 for what the brokers acknowledged.
    settings = distributed_settings(kafka_bootstrap, pg_url, tmp_path)
    nowhere = f"postgresql+psycopg://ragmon:secret-pw@127.0.0.1:{free_port()}/ragmon"
    ingest = ingests({**settings, "store": {**settings["store"], "url": nowhere}})
    ingest.wait_ready(timeout=60)
    assert ingest.readiness() == (200, "ok")
    ids = trace_ids(120)
    post_spans(ingest.url, ids, per_request=40)
    worker = workers(settings, "sinks")  # its store answers: it stores what ingest published
    until(lambda: count_rows(pg_url) == len(ids), what="every acknowledged trace stored")
    stored = stored_ids(pg_url)
    assert set(stored) == set(ids) and set(stored.values()) == {1}
    assert worker.metric("ragmon_traces_total") == len(ids)
    log_text = ingest.log_path.read_text(errors="replace")
    assert "store not reachable" in log_text and "secret-pw" not in log_text
    print(
        f"\ningest with its PostgreSQL unreachable: sent {len(ids)}, acked {len(ids)}, stored {len(stored)}"
    )


def test_broker_down_at_ingest_503_yet_ready_then_200_once_it_returns(
    broker_factory: Callable[[], Broker], pg_url: str, tmp_path: Path, workers: Callable[..., WorkerProcess]
) -> None:
    broker = broker_factory()  # its port is chosen; nothing listens there yet
    settings = distributed_settings(broker.bootstrap, pg_url, tmp_path, kafka={"publish_timeout_s": 2})
    ingest_settings = {k: v for k, v in settings.items() if k != "data_dir"}
    accepted = 0
    with live_server(tmp_path / "ingest", **ingest_settings) as server, server.client() as client:
        # a 200 would be a promise the broker never acknowledged: every request is refused instead
        for _ in range(3):
            response = client.post("/api/v1/traces", json={"traces": json_traces(100)})
            assert response.status_code == 503, response.text
            assert int(response.headers["Retry-After"]) >= 1
        # it answers (503 + Retry-After), so it stays in the Service: ready, with the reason
        ready = client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["detail"] == "degraded: kafka unavailable; answering 503 + Retry-After"
        assert client.get("/healthz").json() == {"status": "ok"}
        assert server.metric("ragmon_ingest_rejected_total", reason="queue_full") >= 3
        # nothing is kept for later: the refused records leave the buffer once the failed send returns
        until(lambda: server.metric("ragmon_kafka_buffer_records") == 0, timeout=30, what="buffer empty")

        broker.start()
        until(lambda: client.get("/readyz").json()["detail"] == "ok", what="ingest ok once it is back")
        for _ in range(2):
            response = client.post("/api/v1/traces", json={"traces": json_traces(50)})
            assert response.status_code == 200, response.text
            accepted += response.json()["accepted"]
        assert (
            server.metric("ragmon_kafka_produced_total", topic=settings["kafka"]["traces_topic"]) >= accepted
        )
        # distributed mode: ingest counts what it received and refused, never the traces themselves
        assert server.metric("ragmon_traces_total", app="shop") == 0

    worker = workers(settings, "sinks")
    until(lambda: count_rows(pg_url) >= accepted, what=f"{accepted} traces stored")
    until(lambda: _counted(worker) >= accepted, what="traces counted")
    time.sleep(1.0)
    # what was refused before its timeout may have reached the broker; nothing acknowledged is missing
    assert count_rows(pg_url) >= accepted
    assert _counted(worker) == count_rows(pg_url)


FAITHFUL = json.dumps(
    {
        "claims": ["Refunds are possible within 30 days."],
        "supported": [0],
        "unsupported": [],
        "outcome": "scored",
        "failure_mode": "none",
        "context_sufficient": True,
        "rationale": "stated in the context",
    }
)


def _queue_states(url: str) -> dict[str, int]:
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT state, count(*) FROM judge_queue GROUP BY state")).all()
            return {str(state): int(n) for state, n in rows}
    except sa.exc.ProgrammingError:
        return {}
    finally:
        engine.dispose()


def test_judge_endpoint_down_the_queue_holds_the_work_until_it_returns(
    kafka_bootstrap: str, pg_url: str, tmp_path: Path, workers: Callable[..., WorkerProcess]
) -> None:
    n = 30
    fake = FakeOpenAI()  # its port is bound but nothing answers until start(): the endpoint is down
    try:
        settings = distributed_settings(
            kafka_bootstrap,
            pg_url,
            tmp_path,
            judging={"enabled": True, "workers": 1, "poll_s": 0.1},
            sampler={"rates": {"base": 1.0}},
            budget={"calls_per_minute": 100000, "usd_per_day": 1000},
            judge={
                "base_url": fake.base_url,
                "api_key": "test",
                "model": "gpt-4o-mini",
                "backoff_base_s": 0.05,
                "backoff_max_s": 0.2,
                "timeout_s": 2,
                "connect_timeout_s": 1,
            },
        )
        worker = workers(settings, "sinks", "judge")
        _publish(settings, n)
        until(lambda: count_rows(pg_url) == n, what="traces stored")
        until(lambda: sum(_queue_states(pg_url).values()) == n, what="every trace queued for judging")
        until(
            lambda: worker.metric("ragmon_judge_failures_total") > 0,
            what="the worker meets the dead endpoint",
        )
        time.sleep(3.0)
        states = _queue_states(pg_url)
        assert count_rows(pg_url, "judgments") == 0
        assert states.get("failed", 0) == 0 and states.get("done", 0) == 0, states
        fake.start()
        fake.set_default(Reply(content=FAITHFUL))
        until(lambda: _queue_states(pg_url).get("done", 0) == n, what="every queued trace judged")
        assert count_rows(pg_url, "judgments") == n
        assert count_rows(pg_url) == n
        assert _counted(worker) == n
        assert worker.metric("ragmon_judge_completed_total") == n
    finally:
        if fake._thread.is_alive():
            fake.stop()
        else:
            fake._sock.close()
            fake._control.close()


def test_judge_worker_killed_mid_judgment_no_item_lost_or_judged_twice(
    kafka_bootstrap: str,
    pg_url: str,
    tmp_path: Path,
    workers: Callable[..., WorkerProcess],
    ingests: Callable[[dict[str, Any]], IngestProcess],
) -> None:
    n = 40
    with FakeOpenAI() as fake:
        # each judgment takes a while, so the killed worker dies holding leased items mid-call
        fake.set_default(Reply(content=FAITHFUL, delay_s=0.5))
        settings = distributed_settings(
            kafka_bootstrap,
            pg_url,
            tmp_path,
            judging={"enabled": True, "workers": 2, "poll_s": 0.1, "lease_s": 3},
            sampler={"rates": {"base": 1.0}},
            budget={"calls_per_minute": 100000, "usd_per_day": 1000},
            judge={"base_url": fake.base_url, "api_key": "test", "model": "gpt-4o-mini", "timeout_s": 5},
        )
        ingest = ingests(settings)
        sinks = workers(settings, "sinks")
        doomed = workers(settings, "judge")
        ingest.wait_ready()
        ids = trace_ids(n)
        post_spans(ingest.url, ids, per_request=10)
        until(lambda: count_rows(pg_url) == n, what="traces stored")
        until(lambda: _queue_states(pg_url).get("leased", 0) > 0, what="items leased by the doomed worker")
        until(lambda: count_rows(pg_url, "judgments") >= 5, what="the doomed worker judges")
        doomed.kill()
        judged_by_doomed = count_rows(pg_url, "judgments")
        assert judged_by_doomed < n
        survivor = workers(settings, "judge")
        until(lambda: _queue_states(pg_url).get("done", 0) == n, timeout=90, what="every item judged")
        time.sleep(1.0)
        states = _queue_states(pg_url)
        assert states == {"done": n}, states
        engine = sa.create_engine(pg_url, poolclass=NullPool)
        with engine.connect() as conn:
            per_trace = conn.execute(
                sa.text("SELECT trace_id, count(*) FROM judgments GROUP BY trace_id")
            ).all()
        engine.dispose()
        assert {str(t): int(c) for t, c in per_trace} == dict.fromkeys(ids, 1)
        # stored once each: the survivor's completions and the doomed worker's make exactly n
        assert judged_by_doomed + survivor.metric("ragmon_judge_completed_total") == n
        assert _counted(sinks) == n
        print(
            f"\njudge worker SIGKILLed: {n} queued, {judged_by_doomed} judged before the kill, "
            f"{n} judged once each, {len(fake.requests())} judge calls"
        )


def test_a_poison_record_on_kafka_costs_no_other_record(
    kafka_bootstrap: str, pg_url: str, tmp_path: Path, workers: Callable[..., WorkerProcess]
) -> None:
    """A trace that decodes but that PostgreSQL refuses (a token count past BIGINT) amid 199 good ones
    of two tenants: the sinks worker splits the batch, stores every good one and dead-letters the one."""
    settings = distributed_settings(kafka_bootstrap, pg_url, tmp_path, kafka={"max_poll_records": 500})
    good = traces(200)
    poison_id = good[100].trace_id
    mixed = [t.model_copy(update={"tenant": "other"}) if i % 2 else t for i, t in enumerate(good)]
    bad_usage = ModelUsage(model="gpt-4o-mini", kind="llm", input_tokens=1, output_tokens=0)
    mixed[100] = mixed[100].model_copy(
        update={"usage": (bad_usage.model_copy(update={"input_tokens": 10**30}),)}  # past the edge's check
    )

    async def publish() -> None:
        bus = KafkaBus(KafkaConfig.model_validate(settings["kafka"]), Metrics())
        await bus.start()
        await bus.consume_traces(mixed)
        assert await bus.drain(30), "the test could not publish its traces"
        await bus.stop()

    asyncio.run(publish())
    worker = workers(settings, "sinks")
    until(lambda: count_rows(pg_url) == 199, what="the 199 good traces stored")
    until(lambda: count_rows(pg_url, "dead_letters") == 1, what="the poison trace dead-lettered")
    engine = sa.create_engine(pg_url, poolclass=NullPool)
    with engine.connect() as conn:
        stored = set(conn.execute(sa.text("SELECT tenant, trace_id FROM traces")).all())
        dead = conn.execute(sa.text("SELECT tenant, record_id, kind FROM dead_letters")).one()
    engine.dispose()
    assert stored == {(t.tenant, t.trace_id) for t in mixed if t.trace_id != poison_id}
    assert tuple(dead) == (mixed[100].tenant, poison_id, "trace")
    assert worker.metric("ragmon_dead_letters_total", kind="trace") == 1


def test_a_worker_without_the_broker_says_so_once_and_consumes_once_it_appears(
    broker_factory: Callable[[], Broker], tmp_path: Path, workers: Callable[..., WorkerProcess]
) -> None:
    """The outage is one line (not one per retry, nor kafka-python's per attempt), its end one line,
    and the worker then consumes without a restart."""
    broker = broker_factory()  # its port is chosen; nothing listens there yet
    settings = distributed_settings(broker.bootstrap, f"sqlite:///{tmp_path / 'worker.db'}", tmp_path)
    worker = workers(settings, "sinks")

    def kafka_lines() -> list[str]:
        text = worker.log_path.read_text(errors="replace")
        return [line for line in text.splitlines() if "Kafka" in line or " kafka." in line]

    until(lambda: len(kafka_lines()) > 0, timeout=30, what="the outage reported")
    time.sleep(10)  # more retries: none of them may add a line (the next report is due after 30 s)
    down = kafka_lines()
    assert len(down) == 1 and "is unreachable" in down[0], worker.log_tail()

    broker.start()
    until(lambda: any("reachable again" in line for line in kafka_lines()), what="the recovery said")
    _publish(settings, 20)
    until(lambda: _counted(worker) >= 20, what="20 traces consumed after the broker appeared")
    lines = kafka_lines()
    # one start line; a "still unreachable" progress line is allowed only if the outage outlasted 30 s
    assert [line for line in lines if "is unreachable" in line] == down, worker.log_tail()
    assert len(lines) <= 3, worker.log_tail()
    assert sum("reachable again" in line for line in lines) == 1, worker.log_tail()
