"""`service/worker.py` without a broker: role checks and the judge-only worker on an embedded store."""

from __future__ import annotations

import asyncio
import threading
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
