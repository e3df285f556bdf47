"""A 200 is a promise for late spans too (embedded mode): spans acknowledged after their trace was stored,
and not yet merged into it when `ragmon serve` is SIGKILLed, complete the stored trace after the restart
(the write-ahead log holds them until the version of the trace that carries them is stored:
service/ingest/ledger.py); nothing is counted twice."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.live_server import free_port
from tests.processes import descendants, wait_gone
from tests.rag_spans import RagRequest, body
from tests.serve_process import start_serve, wait_ready

pytestmark = pytest.mark.slow

PROTOBUF = {"content-type": "application/x-protobuf"}
N = 20


def _serve(data_dir: Path, port: int, wait_s: float) -> subprocess.Popen[str]:
    settings = {
        "RAGMON_SERVER__INGEST_PROCESSES": "0",
        "RAGMON_ASSEMBLER__GRACE_S": str(wait_s),
        "RAGMON_ASSEMBLER__IDLE_S": str(wait_s),
        # segments close and checkpoints run quickly: whatever the log may let go of, it does
        "RAGMON_WAL__SEGMENT_MAX_AGE_S": "0.2",
        "RAGMON_WAL__CHECKPOINT_S": "0.1",
        "RAGMON_JUDGING__ENABLED": "false",
    }
    return start_serve(data_dir, port, settings)


def _rows(db: Path) -> dict[str, tuple[int, bool, str | None, int]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT trace_id, span_count, partial, answer, input_tokens FROM traces"
        ).fetchall()
    return {r[0]: (r[1], bool(r[2]), r[3], r[4]) for r in rows}


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def _until(check: object, timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout}s")
        time.sleep(0.2)


def test_late_spans_acknowledged_and_killed_before_the_merge_complete_the_trace_after_restart(
    tmp_path: Path,
) -> None:
    data_dir, port = tmp_path / "data", free_port()
    url, db = f"http://127.0.0.1:{port}", tmp_path / "data" / "ragmon.db"
    requests = [RagRequest(duration_s=200) for _ in range(N)]
    server = _serve(data_dir, port, wait_s=0.5)  # the retrieval spans: flushed idle, stored partial
    try:
        wait_ready(url, server)
        with httpx.Client(base_url=url, timeout=30, headers=PROTOBUF) as client:
            assert client.post("/v1/traces", content=body(*(r.retrieve for r in requests))).status_code == 200
        _until(lambda: len(_rows(db)) == N, what="the partial traces stored")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    assert set(_rows(db).values()) == {(1, True, None, 0)}
    # waiting ten minutes for more spans: the late parts stay open until the kill
    server = _serve(data_dir, port, wait_s=600)
    try:
        wait_ready(url, server)
        late = body(*(s for r in requests for s in (r.generate, r.root)))
        with httpx.Client(base_url=url, timeout=30, headers=PROTOBUF) as client:
            assert client.post("/v1/traces", content=late).status_code == 200
        _until(lambda: _metric(url, "ragmon_open_traces") == N, what="the late parts open")
        time.sleep(1.0)  # checkpoints run meanwhile: they must not let go of the late spans
        workers = descendants(server.pid)
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=30)
    assert wait_gone(workers, timeout_s=20) == set()
    assert set(_rows(db).values()) == {(1, True, None, 0)}  # not merged before the kill

    server = _serve(data_dir, port, wait_s=0.5)
    try:
        wait_ready(url, server)
        whole = (3, False, requests[0].answer, 1000)
        _until(
            lambda: set(_rows(db).values()) == {whole}, what="the stored traces completed after the restart"
        )
        time.sleep(1.0)
        assert len(_rows(db)) == N
        assert _metric(url, "ragmon_traces_total{") == 0  # stored before: not counted again
        assert _metric(url, "ragmon_traces_updated_total{") == N
        assert _metric(url, "ragmon_late_spans_total") == 2 * N
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    assert list((data_dir / "wal").glob("*.wal")) == []  # a clean stop: everything stored, released
