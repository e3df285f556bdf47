"""The adversarial pass, as one module: a real ragmon with two tenants (an API key each) and a reviewer
per tenant, and every leak that pass found, tried again. Each check has a fuller test beside the code
it covers (named in its docstring); this module keeps the whole list in one place."""

from __future__ import annotations

import gzip
import json
import socket
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import httpx
import pytest

from service.cli import main as cli_main
from tests.live_server import LiveServer
from tests.review_server import API_KEYS, TOKENS, review_server, signed_in

JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # review_server: tenants acme and beta with judged items in their review queues, alice (acme) and
    # carol (beta) as reviewers; a 1 s body deadline and a scrape token on top
    extra = {"server": {"body_timeout_s": 1.0, "header_timeout_s": 1.0}}
    with review_server(tmp_path_factory.mktemp("security"), extra) as live:
        yield live


def client(server: LiveServer, tenant: str) -> httpx.Client:
    return server.client(headers={"x-api-key": API_KEYS[tenant]})


def test_one_tenant_never_reads_anothers_traces_or_reports(server: LiveServer, tmp_path: Path) -> None:
    """tests/service/report/test_weekly.py (reports), tests/service/review/test_api.py (review)."""
    with client(server, "acme") as acme, client(server, "beta") as beta:
        listed = acme.get("/api/v1/traces").json()["items"]
        assert listed and all(t["tenant"] == "acme" for t in listed)
        assert beta.get(f"/api/v1/traces/{listed[0]['trace_id']}").status_code == 404
        data_dir = str(server.config.data_dir)
        assert cli_main(["report", "--since", "1d", "--tenant", "beta", "--data-dir", data_dir]) == 0
        assert beta.get("/reports/latest.md").status_code == 200
        assert acme.get("/reports/latest.md").status_code == 404


def test_a_reviewer_acts_only_on_their_tenants_items(server: LiveServer) -> None:
    """Release of another tenant's item is 404, like every other action (tests/service/review)."""
    with client(server, "acme") as acme:
        acme_item = server.pipeline.reviews.find(
            "acme", "blind", acme.get("/api/v1/traces").json()["items"][0]["trace_id"]
        )
    assert acme_item is not None
    carol, csrf = signed_in(server, "carol")
    with closing(carol):
        for action in ("claim", "release"):
            response = carol.post(
                f"/api/v1/review/items/{acme_item.id}/{action}", headers={"x-csrf-token": csrf}
            )
            assert response.status_code == 404, (action, response.text)


def test_feedback_for_unknown_traces_makes_no_review_items(server: LiveServer) -> None:
    """tests/service/test_outbox.py: it waits for its trace and expires as an orphan."""
    events = [
        {"trace_id": f"{0xDEAD0000 + n:032x}", "kind": "down", "event_id": f"ghost-{n}"} for n in range(200)
    ]
    with client(server, "beta") as beta:
        assert beta.post("/api/v1/feedback", json=events).status_code == 200
    server.flush()
    ghosts = [server.pipeline.reviews.find("beta", "flagged", e["trace_id"]) for e in events]
    assert ghosts == [None] * 200
    assert server.metric("ragmon_feedback_total", app="none", rating="down") == 0


def test_secrets_are_not_in_any_answer_or_in_config_output(
    server: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """tests/service/test_secrets.py."""
    with server.client() as anonymous:
        texts = [anonymous.get(path).text for path in ("/readyz", "/healthz", "/metrics", "/openapi.json")]
        texts.append(anonymous.post("/v1/traces", content=b"x", headers={"x-api-key": "nope"}).text)
    for text in texts:
        for secret in (*API_KEYS.values(), *TOKENS.values()):
            assert secret not in text
    config = server.config.model_dump_json()
    for secret in (*API_KEYS.values(), *TOKENS.values()):
        assert secret not in config and secret not in repr(server.config)


def test_bad_bodies_are_refused_naming_their_layer_and_counted(server: LiveServer) -> None:
    """tests/service/ingest/test_decompress.py, test_otlp_ranges.py."""
    body = json.dumps({"resourceSpans": []}).encode()
    with client(server, "acme") as acme:
        trailing = acme.post(
            "/v1/traces", content=gzip.compress(body) + b"junk", headers={**JSON, "content-encoding": "gzip"}
        )
        truncated = acme.post(
            "/v1/traces", content=gzip.compress(body)[:10], headers={**JSON, "content-encoding": "gzip"}
        )
        huge_index = {
            "resourceSpans": [
                {
                    "scopeSpans": [
                        {
                            "spans": [
                                {
                                    "traceId": "5b8efff798038103d269b633813fc60c",
                                    "spanId": "eee19b7ec3c1b174",
                                    "name": "retrieve",
                                    "startTimeUnixNano": "1700000000000000000",
                                    "endTimeUnixNano": "1700000000100000000",
                                    "attributes": [
                                        {
                                            "key": "openinference.span.kind",
                                            "value": {"stringValue": "RETRIEVER"},
                                        },
                                        {
                                            "key": f"retrieval.documents.{'9' * 5000}.document.id",
                                            "value": {"stringValue": "x"},
                                        },
                                    ],
                                },
                                {
                                    "traceId": "5b8efff798038103d269b633813fc60d",
                                    "spanId": "eee19b7ec3c1b175",
                                    "name": "far future",
                                    "startTimeUnixNano": 1e30,
                                    "endTimeUnixNano": 1e30,
                                },
                            ]
                        }
                    ]
                }
            ]
        }
        partial = acme.post("/v1/traces", content=json.dumps(huge_index), headers=JSON)
    assert trailing.status_code == 400 and "gzip" in trailing.text and "trailing" in trailing.text
    assert truncated.status_code == 400 and "gzip" in truncated.text
    assert partial.status_code == 200
    assert int(partial.json()["partialSuccess"]["rejectedSpans"]) == 1  # the 1e30 span, alone


def test_slow_uploads_do_not_hold_connections(server: LiveServer) -> None:
    """tests/service/ingest/test_slow_and_scrape.py (a 1 s deadline here; 30 s by default)."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        conn.sendall(
            f"POST /api/v1/traces HTTP/1.1\r\nHost: x\r\nx-api-key: {API_KEYS['acme']}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{".encode()
        )
        started = time.monotonic()
        answer = conn.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408")
    assert time.monotonic() - started < server.config.server.body_timeout_s + 10


def _trickle(conn: socket.socket, text: bytes, every_s: float, for_s: float) -> bool:
    """Send `text` a byte at a time; False as soon as the server has closed the connection."""
    deadline = time.monotonic() + for_s
    for byte in text:
        if time.monotonic() > deadline:
            break
        try:
            conn.sendall(bytes([byte]))
        except OSError:
            return False
        conn.settimeout(every_s)
        try:
            if conn.recv(4096) == b"":
                return False
        except TimeoutError:
            pass
        except ConnectionError:
            # closed with our unread bytes still in its buffer: the kernel answers with a reset, not a FIN
            return False
    return True


def test_slow_headers_do_not_hold_connections(server: LiveServer) -> None:
    """Slowloris: headers a byte every 0.3 s, on new connections and after a first request on a kept-alive
    one; each is closed after server.header_timeout_s (1 s here; 10 s by default) and counted."""
    host, port = server.url.removeprefix("http://").split(":")
    before = server.metric("ragmon_ingest_rejected_total", reason="header_timeout")
    header = f"GET /api/v1/traces HTTP/1.1\r\nHost: x\r\nx-api-key: {API_KEYS['acme']}\r\n".encode() * 20
    kept_alive = socket.create_connection((host, int(port)), timeout=10)
    kept_alive.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert kept_alive.recv(4096).startswith(b"HTTP/1.1 200")
    conns = [socket.create_connection((host, int(port)), timeout=10) for _ in range(5)] + [kept_alive]
    started = time.monotonic()
    try:
        still_open = [_trickle(conn, header, every_s=0.3, for_s=8.0) for conn in conns]
    finally:
        for conn in conns:
            conn.close()
    assert still_open == [False] * 6
    # trickled one after the other: the last was closed within its own deadline plus the others' time
    assert time.monotonic() - started < 6 * (server.config.server.header_timeout_s + 1.5)
    assert server.metric("ragmon_ingest_rejected_total", reason="header_timeout") - before == 6
    with client(server, "acme") as acme:
        assert acme.get("/api/v1/traces").status_code == 200


def test_untrusted_text_is_escaped_in_the_report(server: LiveServer, tmp_path: Path) -> None:
    """tests/service/report/test_weekly.py; the review page's escaping and bidi isolation: tests/ui."""
    record = {"trace_id": f"{0xBAD:032x}", "app": "<script>x</script>", "query": "q", "answer": "a"}
    with client(server, "beta") as beta:
        assert beta.post("/api/v1/traces", json={"traces": [record]}).status_code == 200
    server.flush()
    out = tmp_path / "report"
    data_dir = str(server.config.data_dir)
    assert (
        cli_main(["report", "--since", "1d", "--tenant", "beta", "--out", str(out), "--data-dir", data_dir])
        == 0
    )
    markdown = (out / "report.md").read_text()
    assert "<script>" not in markdown and "&lt;script&gt;" in markdown
    assert "<script>x</script>" not in (out / "report.html").read_text()
