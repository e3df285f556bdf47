"""Slow uploads are cut off (408) instead of holding connections forever, and `/metrics` can require
a scrape token; both through a real server."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.live_server import LiveServer, live_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = {"server": {"body_timeout_s": 1.0}, "metrics": {"scrape_token": "scrape-token-0123456789"}}
    with live_server(tmp_path_factory.mktemp("ragmon"), **settings) as live:
        yield live


def _slow_upload(server: LiveServer) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)), timeout=10)
    conn.sendall(
        b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
        b"Content-Length: 100000\r\n\r\n" + b"\x00" * 10
    )
    return conn


def test_slow_uploads_are_answered_408_and_counted(server: LiveServer) -> None:
    before = server.metric("ragmon_ingest_rejected_total", reason="body_timeout")
    started = time.monotonic()
    connections = [_slow_upload(server) for _ in range(20)]
    answers = []
    for conn in connections:
        with conn:
            answers.append(conn.recv(4096))
    elapsed = time.monotonic() - started
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers[0][:200]
    assert elapsed < 15  # cut off near the 1 s deadline, not held open
    assert server.metric("ragmon_ingest_rejected_total", reason="body_timeout") == before + 20


def test_metrics_need_the_scrape_token_when_one_is_set(server: LiveServer) -> None:
    url = f"{server.url}/metrics"
    assert httpx.get(url, timeout=10).status_code == 401
    assert httpx.get(url, headers={"authorization": "Bearer wrong"}, timeout=10).status_code == 401
    scraped = httpx.get(url, headers={"authorization": "Bearer scrape-token-0123456789"}, timeout=10)
    assert scraped.status_code == 200 and "ragmon_traces_total" in scraped.text


def test_metrics_answer_the_names_asked_for_and_still_need_the_token(server: LiveServer) -> None:
    url, asked = f"{server.url}/metrics", {"name[]": ["ragmon_traces_total", "ragmon_bus_queue_depth"]}
    assert httpx.get(url, params=asked, timeout=10).status_code == 401
    scraped = httpx.get(
        url, params=asked, headers={"authorization": "Bearer scrape-token-0123456789"}, timeout=10
    )
    assert scraped.status_code == 200
    names = {s.name for family in text_string_to_metric_families(scraped.text) for s in family.samples}
    # the queue gauge is read at scrape time; the counter has a series once an app was seen
    assert "ragmon_bus_queue_depth" in names and names <= {"ragmon_traces_total", "ragmon_bus_queue_depth"}


def test_without_a_token_metrics_stay_open(tmp_path: Path) -> None:
    with live_server(tmp_path) as live:
        assert httpx.get(f"{live.url}/metrics", timeout=10).status_code == 200


def test_oversized_grpc_messages_are_refused_and_counted(tmp_path: Path) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    with live_server(tmp_path, server={"max_body_bytes": 64 * 1024}) as live:
        request = ExportTraceServiceRequest()
        span = request.resource_spans.add().scope_spans.add().spans.add()
        span.trace_id, span.span_id, span.name = b"\x01" * 16, b"\x02" * 8, "x" * 100_000
        span.start_time_unix_nano, span.end_time_unix_nano = 1, 2
        with grpc.insecure_channel(live.grpc_target) as channel:
            export = channel.unary_unary(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                request_serializer=ExportTraceServiceRequest.SerializeToString,
                response_deserializer=ExportTraceServiceResponse.FromString,
            )
            with pytest.raises(grpc.RpcError) as refused:
                export(request, timeout=10)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "over the limit of 65536" in (refused.value.details() or "")
        assert live.metric("ragmon_ingest_rejected_total", reason="too_large") == 1
