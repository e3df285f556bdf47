"""`POST /api/v1/probes/golden` on a running server: a 10 MB upload holds nobody up, one over the body
limit is 413, bad bodies and rows are refused with what was wrong, and the parse runs in the request
worker process (service/api/request_pool.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.live_server import LiveServer, live_server

MIB = 1 << 20

# Uploads the body file in 64 KiB chunks (chunked transfer, no Content-Length), from a process of its
# own: the client's work must not share the test process's GIL with the server it measures.
UPLOADER = """
import sys, httpx
url, path = sys.argv[1], sys.argv[2]
def chunks():
    with open(path, "rb") as body:
        while chunk := body.read(65536):
            yield chunk
response = httpx.post(url, content=chunks(), headers={"content-type": "application/json"}, timeout=300)
print(response.status_code, response.text)
"""


def golden_body(min_bytes: int, name: str = "big") -> tuple[bytes, int]:
    """A `GoldenIn` body of at least `min_bytes`, of short rows: parsing cost grows with rows. 10 MB
    of them froze the event loop for 7 s before uploads were parsed in a worker process."""
    rows = []
    size = 0
    while size < min_bytes:
        n = len(rows)
        row = json.dumps(
            {
                "question_id": f"q{n}",
                "question": f"How do I reset password {n}?",
                "gold_chunks": [{"chunk_id": f"kb/{n}#1", "relevance": 2}],
                "category": f"c{n % 10}",
            }
        )
        rows.append(row)
        size += len(row) + 1
    return json.dumps({"name": name, "jsonl": "\n".join(rows), "source": f"{name}.jsonl"}).encode(), len(rows)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    # one worker process per role whatever the machine, so the upload's parse runs in one
    settings = {"server": {"ingest_processes": 1}, "judging": {"enabled": False}, "drift": {"enabled": False}}
    with live_server(tmp_path_factory.mktemp("probes-api"), **settings) as running:
        yield running


def _healthz_latencies(server: LiveServer, uploader: subprocess.Popen[str]) -> list[float]:
    latencies = []
    with httpx.Client(base_url=server.url, timeout=30) as client:
        while uploader.poll() is None:
            started = time.perf_counter()
            assert client.get("/healthz").status_code == 200
            latencies.append(time.perf_counter() - started)
            time.sleep(0.02)
    return latencies


@pytest.mark.slow
def test_healthz_answers_within_a_second_during_a_10_mb_upload(server: LiveServer, tmp_path: Path) -> None:
    body, rows = golden_body(10 * MIB)
    path = tmp_path / "golden.json"
    path.write_bytes(body)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        client.get("/healthz").raise_for_status()  # connected and warm before the upload starts
    uploader = subprocess.Popen(
        [sys.executable, "-c", UPLOADER, f"{server.url}/api/v1/probes/golden", str(path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        latencies = _healthz_latencies(server, uploader)
        out, _ = uploader.communicate(timeout=300)
    finally:
        uploader.kill()
    status, answer = out.split(" ", 1)
    assert status == "200", answer
    stored = json.loads(answer)
    assert (stored["name"], stored["questions"], stored["new"]) == ("big", rows, True)
    # the upload lasts seconds; /healthz was asked all along, and never waited for it
    assert len(latencies) >= 10, latencies
    assert max(latencies) < 1.0, sorted(latencies)[-5:]
    pool = server.server.config.app.state.request_pool  # type: ignore[attr-defined]
    assert pool.pids(), "the golden set was not parsed in the request worker process"


def test_a_body_over_the_limit_is_413_and_stores_nothing(server: LiveServer) -> None:
    body, _ = golden_body(16 * MIB + 1, name="too-large")
    before = server.metric("ragmon_ingest_rejected_total", reason="too_large")
    with server.client() as client:
        refused = client.post(
            "/api/v1/probes/golden", content=body, headers={"content-type": "application/json"}
        )
        assert refused.status_code == 413, refused.text
        names = [g["name"] for g in client.get("/api/v1/probes/golden").json()["items"]]
    assert server.metric("ragmon_ingest_rejected_total", reason="too_large") == before + 1
    assert "too-large" not in names


def test_bad_bodies_and_rows_are_refused_with_what_was_wrong(server: LiveServer) -> None:
    with server.client() as client:
        not_json = client.post(
            "/api/v1/probes/golden", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert not_json.status_code == 400
        assert "not valid JSON" in not_json.json()["detail"]
        unnamed = client.post("/api/v1/probes/golden", json={"jsonl": ""})
        assert unnamed.status_code == 422
        assert unnamed.json()["detail"].startswith("name:")
        rows = "\n".join(
            [json.dumps({"question_id": "q1", "question": "Why?"}), '{"question_id": 1}', "{broken"]
        )
        bad_rows = client.post("/api/v1/probes/golden", json={"name": "small", "jsonl": rows})
        assert bad_rows.status_code == 422
        message = bad_rows.json()["detail"]
        assert message.startswith("3 problem(s) in golden set small")
        assert "small:2: question_id: Input should be a valid string" in message
        assert "small:3: not valid JSON" in message
        good = client.post("/api/v1/probes/golden", json={"name": "small", "jsonl": rows.splitlines()[0]})
        assert good.status_code == 200 and good.json()["questions"] == 1
