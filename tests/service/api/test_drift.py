"""The drift API's answers to impossible input (a real server): 422 naming the field, never a 500."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.live_server import LiveServer, live_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("drift-api")) as running:
        yield running


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"from": "0001-01-01", "to": "2026-01-01"}, "from"),  # answered 500 (OverflowError) before
        ({"from": "0001-01-01T00:00:00+05:00", "to": "2026-01-01"}, "from"),  # before year 1 in UTC
        ({"from": "2026-01-01", "to": "9999-12-31T23:59:59"}, "to"),
    ],
)
def test_pinning_from_a_time_out_of_range_is_422_naming_the_field(
    body: dict[str, str], field: str, server: LiveServer
) -> None:
    counted = server.metric("ragmon_ingest_rejected_total", reason="invalid_input")
    with server.client() as client:
        answer = client.post("/api/v1/drift/references", json=body)
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert detail.startswith(f"{field}: time ") and "outside the range ragmon keeps" in detail
    assert server.metric("ragmon_ingest_rejected_total", reason="invalid_input") == counted + 1


@pytest.mark.parametrize("path", ["/api/v1/drift/runs", "/api/v1/traces"])
@pytest.mark.parametrize("query", ["since=0001-01-01T00:00:00%2B05:00", "until=9999-12-31T23:59:59-05:00"])
def test_a_time_filter_out_of_range_is_422_naming_the_parameter(
    path: str, query: str, server: LiveServer
) -> None:
    with server.client() as client:
        answer = client.get(f"{path}?{query}")
    assert answer.status_code == 422, answer.text
    name = query.split("=")[0]
    assert answer.json()["detail"].startswith(f"query.{name}: time ")


def test_a_pin_in_range_still_answers(server: LiveServer, tmp_path: Path) -> None:
    with server.client() as client:
        answer = client.post("/api/v1/drift/references", json={"from": "2026-01-01", "to": "2026-01-02"})
    assert answer.status_code == 200 and answer.json()["pinned"] == []
