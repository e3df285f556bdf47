"""`service/api/app.py`'s probes in distributed mode, with no broker at all (nothing listens on its port).

Readiness: the replica answers (503 + Retry-After), so it stays ready and says what is wrong.
Liveness: a broker that is away is no reason to restart; a Kafka send loop that ended is, since
every request would then wait for an acknowledgement that never comes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tests.distributed.traffic import json_traces
from tests.live_server import LiveServer, free_port, live_server


def _until(check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.1)


def _kafka_without_broker() -> dict[str, object]:
    return {
        "bootstrap_servers": [f"127.0.0.1:{free_port()}"],
        "request_timeout_s": 1,
        "delivery_timeout_s": 3,
        "max_block_s": 1,
        "publish_timeout_s": 1,
        "backlog_interval_s": 0.2,
    }


def _cancel_send_loop(server: LiveServer) -> None:
    async def cancel() -> None:
        kafka = server.pipeline.kafka
        assert kafka is not None and kafka._task is not None
        kafka._task.cancel()  # stands in for a loop that ended on an error nobody expected

    server.call(cancel())


def test_without_the_broker_ingest_answers_503_stays_ready_and_live_until_its_send_loop_ends(
    tmp_path: Path,
) -> None:
    with (
        live_server(tmp_path, bus={"kind": "kafka"}, kafka=_kafka_without_broker()) as server,
        server.client() as client,
    ):
        refused = client.post("/api/v1/traces", json={"traces": json_traces(3)})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        ready = client.get("/readyz")
        assert (ready.status_code, ready.json()) == (
            200,
            {"status": "ok", "detail": "degraded: kafka unavailable; answering 503 + Retry-After"},
        )
        assert client.get("/healthz").json() == {"status": "ok"}
        # the broker is reported unreachable (never reached), and no backlog is made up
        watcher = server.pipeline.kafka_backlog
        assert watcher is not None
        _until(lambda: watcher.failures >= 2)
        assert server.metric("ragmon_kafka_reachable") == 0
        assert server.metric("ragmon_kafka_last_contact_timestamp_seconds") == 0
        assert "ragmon_kafka_backlog_records{" not in client.get("/metrics").text

        _cancel_send_loop(server)
        dead = client.get("/healthz")
        assert (dead.status_code, dead.json()) == (
            503,
            {"status": "dead", "detail": "kafka send loop ended (cancelled)"},
        )
