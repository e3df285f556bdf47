"""`service/worker.py` without a broker: role checks and the judge-only worker on an embedded store."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from service.config import ConfigError, load_config
from service.pipeline import Pipeline
from service.worker import Worker, create_worker_app


def test_sinks_role_needs_the_kafka_bus(tmp_path: Path) -> None:
    config = load_config(environ={}, overrides={"data_dir": str(tmp_path)})
    with pytest.raises(ValueError, match="kafka"):
        Worker(config, ["sinks"])
    with pytest.raises(ValueError, match="role"):
        Worker(config, [])


def test_kafka_timeouts_the_client_would_refuse_are_refused_at_load() -> None:
    with pytest.raises(ConfigError, match="delivery_timeout_s"):
        load_config(environ={}, overrides={"kafka": {"request_timeout_s": 40, "delivery_timeout_s": 30}})
    with pytest.raises(ConfigError, match="heartbeat"):
        load_config(environ={}, overrides={"kafka": {"session_timeout_s": 6, "heartbeat_interval_s": 6}})


async def test_judge_and_drift_worker_starts_leads_and_stops(tmp_path: Path) -> None:
    config = load_config(environ={}, overrides={"data_dir": str(tmp_path), "judging": {"poll_s": 0.05}})
    worker = Worker(config, ["judge", "drift"])
    await worker.start()
    try:
        health = worker.health()
        assert health["status"] == "ok"
        assert health["roles"] == ["drift", "judge"]
        assert health["partitions"] == []
        assert worker.pipeline.drift.gate() is True
        assert worker.leader.held
        other = Worker(config, ["drift"])
        assert other.pipeline.drift is not worker.pipeline.drift
        assert other.leader.acquire() is False, "one drift leader per deployment"
        other.pipeline.store.close()
        await asyncio.sleep(0.1)
    finally:
        await worker.stop()
    assert not worker.leader.held
    assert worker.health()["status"] == "starting"


def test_readyz_follows_start_and_the_store(tmp_path: Path) -> None:
    config = load_config(environ={}, overrides={"data_dir": str(tmp_path), "judging": {"poll_s": 0.05}})
    app = create_worker_app(config, ["judge"])
    worker: Worker = app.state.worker
    assert asyncio.run(worker.ready()) == (False, "starting")
    with TestClient(app) as client:
        assert client.get("/readyz").json() == {"status": "ok", "detail": "ok"}
        worker.pipeline.store.close()
        response = client.get("/readyz")
        assert response.status_code == 503
        assert response.json()["detail"].startswith("store unavailable")
        assert client.get("/healthz").json()["status"] == "ok", "alive, only not ready"


@pytest.mark.postgres
def test_replicas_starting_together_create_the_schema_once_without_colliding(
    tmp_path: Path, postgres_url: str
) -> None:
    """Ingest replicas and workers all create the tables at start; on a fresh PostgreSQL database
    concurrent CREATE TABLEs of one table fail (duplicate pg_type row), so they take turns."""
    config = load_config(environ={}, overrides={"data_dir": str(tmp_path), "store": {"url": postgres_url}})
    replicas = [Pipeline(config) for _ in range(4)]
    start = threading.Barrier(len(replicas))
    errors: list[BaseException] = []

    def create(pipeline: Pipeline) -> None:
        start.wait()
        try:
            pipeline.create_schema()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(pipeline,)) for pipeline in replicas]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    try:
        assert errors == []
        tables = set(sa.inspect(replicas[0].store.engine).get_table_names())
        assert {"traces", "judgments", "reviews", "judge_queue"} <= tables, tables
    finally:
        for pipeline in replicas:
            pipeline.store.close()


def test_liveness_fails_once_the_consume_loop_has_ended(tmp_path: Path) -> None:
    """A sinks worker whose Kafka consume loop ended stays up (its HTTP server answers) but does no
    work; /healthz must fail so the kubelet restarts it. The loop here ends the way a bad broker
    address ends it: kafka-python raises ValueError for a port that is not a number, which the
    loop does not retry (only Kafka and network errors are retried)."""
    config = load_config(
        environ={},
        overrides={
            "data_dir": str(tmp_path),
            "bus": {"kind": "kafka"},
            "kafka": {"bootstrap_servers": ["127.0.0.1:notaport"], "create_topics": False},
        },
    )
    app = create_worker_app(config, ["sinks"])
    worker: Worker = app.state.worker
    assert worker.alive() == (True, "ok"), "not started yet: nothing to be dead"
    with TestClient(app) as client:
        deadline = time.monotonic() + 30
        while worker.receiver is not None and worker.receiver.running:
            assert time.monotonic() < deadline, "the consume loop did not end"
            time.sleep(0.05)
        response = client.get("/healthz")
        assert response.status_code == 503
        body = response.json()
        assert body["status"] == "dead"
        assert body["detail"].startswith("kafka consume loop ended (ValueError")
        ready = client.get("/readyz")
        assert (ready.status_code, ready.json()["detail"]) == (503, "kafka consumer stopped")


def test_liveness_stays_ok_while_the_broker_is_unreachable(tmp_path: Path) -> None:
    """A broker that is down is retried by the loop: alive (not ready is for the store and loop)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens here once closed
    config = load_config(
        environ={},
        overrides={
            "data_dir": str(tmp_path),
            "bus": {"kind": "kafka"},
            "kafka": {
                "bootstrap_servers": [f"127.0.0.1:{port}"],
                "create_topics": False,
                "request_timeout_s": 1,
            },
        },
    )
    app = create_worker_app(config, ["sinks"])
    worker: Worker = app.state.worker
    with TestClient(app) as client:
        for _ in range(3):  # across a few failed connection attempts
            time.sleep(1.0)
            response = client.get("/healthz")
            assert (response.status_code, response.json()["status"]) == (200, "ok")
        assert worker.receiver is not None and worker.receiver.running


def test_a_worker_without_kafka_says_so_once_instead_of_a_line_per_retry(tmp_path: Path) -> None:
    """A real `ragmon worker` pointed at a closed port for 10 s, retrying about every second: its log
    holds one line about Kafka (the outage report is due again only after 30 s) and none of
    kafka-python's per-attempt lines; before, the same run printed 129 lines."""
    pytest.importorskip("kafka", reason="kafka-python (pip install 'ragmon[kafka]')")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGMON_")}
    env |= {
        "RAGMON_BUS__KIND": "kafka",
        "RAGMON_KAFKA__BOOTSTRAP_SERVERS": json.dumps([f"127.0.0.1:{closed.getsockname()[1]}"]),
        "RAGMON_KAFKA__REQUEST_TIMEOUT_S": "1",  # a bootstrap gives up after 1 s: ~10 retries
        "RAGMON_DATA_DIR": str(tmp_path / "data"),
    }
    root = Path(__file__).resolve().parents[2]
    args = [sys.executable, "-m", "service.cli", "worker", "--role", "sinks", "--metrics-port", "0"]
    try:
        proc = subprocess.Popen(args, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            time.sleep(10)  # the duration of the observation, not a timing assertion
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=30)
    finally:
        closed.close()
    lines = out.decode().splitlines()
    # uvicorn stops in order, then re-raises the signal it caught: -SIGTERM is a clean stop here
    assert proc.returncode in (0, -signal.SIGTERM), "\n".join(lines)
    about_kafka = [line for line in lines if "Kafka" in line or " kafka." in line]
    assert len(about_kafka) == 1, "\n".join(lines)
    assert (
        "WARNING service.bus.kafka: Kafka (sinks worker, group ragmon-sinks) is unreachable" in about_kafka[0]
    )
    assert "Unable to bootstrap" in about_kafka[0]  # the client's own error, said once
    # the rest is the start line and uvicorn's start and stop lines
    assert len(lines) <= 12, "\n".join(lines)
