"""Dead letters: `Store.insert_dead_letters` / `list_dead_letters`, the `dead_letters` table and its
read API (`service/api/dead_letters.py`), on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.api import dead_letters as dead_letters_api
from service.api.app import create_app
from service.config import load_config
from service.errors import InvalidInput
from service.model import Chunk, Feedback, ModelUsage, RagTrace, Retrieval
from service.store.rows import MAX_DEAD_LETTER_ERROR_CHARS, MAX_DEAD_LETTER_RECORD_CHARS
from service.store.trace_store import Store

T0 = datetime(2025, 6, 1, tzinfo=UTC)


def _trace(n: int, tenant: str = "acme", **fields: object) -> RagTrace:
    return RagTrace.model_validate(
        {"trace_id": f"{n:032x}", "tenant": tenant, "start_time": T0, "query": f"q {n}", **fields}
    )


def test_dead_letters_are_kept_once_per_record_and_paged_per_tenant(store: Store) -> None:
    poison = _trace(1, usage=(ModelUsage(model="m", input_tokens=10**30),))
    assert store.insert_dead_letters([poison], "InvalidInput: bigint out of range") == 1
    assert store.insert_dead_letters([poison], "InvalidInput: another try") == 0  # first row wins
    event = Feedback(event_id="ev-1", trace_id=f"{1:032x}", tenant="acme", kind="down", time=T0)
    assert store.insert_dead_letters([event, _trace(2), _trace(3, tenant="globex")], "boom") == 3

    first, cursor = store.list_dead_letters("acme", limit=2)
    assert [(d["kind"], d["record_id"]) for d in first] == [("trace", f"{2:032x}"), ("feedback", "ev-1")]
    assert cursor is not None
    rest, last = store.list_dead_letters("acme", limit=2, cursor=cursor)
    assert [d["record_id"] for d in rest] == [f"{1:032x}"] and last is None
    (letter,) = rest
    assert letter["error"] == "InvalidInput: bigint out of range" and letter["truncated"] is False
    assert letter["record"]["usage"][0]["input_tokens"] == 10**30 and letter["record"]["tenant"] == "acme"
    assert [d["record_id"] for d in store.list_dead_letters("acme", kind="feedback")[0]] == ["ev-1"]
    assert [d["record_id"] for d in store.list_dead_letters("globex")[0]] == [f"{3:032x}"]
    with pytest.raises(InvalidInput):
        store.list_dead_letters("acme", cursor="not-a-cursor")
    with pytest.raises(ValueError):
        store.list_dead_letters("acme", limit=0)


def test_any_record_content_can_be_kept_bounded(store: Store) -> None:
    """A record that failed to store may hold what the database refuses (NUL on PostgreSQL, lone
    surrogates), or be huge: the dead letter must still be written, within its bounds."""
    chunks = tuple(Chunk(id=f"c{i}", rank=i, content="x" * 5000) for i in range(40))
    big = _trace(4, query="nul \x00 and surrogate \ud800", retrieval=Retrieval(chunks=chunks))
    unserialisable = RagTrace.model_construct(trace_id=f"{5:032x}", tenant="acme", start_time=object())  # type: ignore[arg-type]
    assert store.insert_dead_letters([big, unserialisable], "e" * (10 * MAX_DEAD_LETTER_ERROR_CHARS)) == 2
    letters = {d["record_id"]: d for d in store.list_dead_letters("acme")[0]}
    kept = letters[f"{4:032x}"]
    assert kept["truncated"] is True and len(kept["error"]) == MAX_DEAD_LETTER_ERROR_CHARS
    assert kept["record"]["query"] == "nul \ufffd and surrogate ?"
    assert kept["record"]["retrieval"]["chunks"][0]["content"].endswith("... (5000 characters)")
    assert len(str(kept["record"])) < MAX_DEAD_LETTER_RECORD_CHARS
    assert letters[f"{5:032x}"]["record"] == {"unserialisable": "RagTrace"}


def test_retention_removes_old_dead_letters(store: Store) -> None:
    store.insert_dead_letters([_trace(6)], "boom")
    store.delete_older_than(datetime.now(UTC) - timedelta(days=1))
    assert len(store.list_dead_letters("acme")[0]) == 1
    store.delete_older_than(datetime.now(UTC) + timedelta(seconds=1))
    assert store.list_dead_letters("acme") == ([], None)


@pytest.fixture
def client(tmp_path: Path, store_url: str) -> Iterator[TestClient]:
    """The app as `create_app` builds it, with the dead-letter router included as `api/app.py` will."""
    config = load_config(
        environ={},
        overrides={
            "data_dir": str(tmp_path),
            "store": {"url": store_url},
            "server": {"grpc_port": 0, "ingest_processes": 0},
            "auth": {"api_keys": {"key-acme": "acme", "key-globex": "globex"}},
        },
    )
    app = create_app(config)
    app.include_router(dead_letters_api.router)
    with TestClient(app) as test_client:
        yield test_client


def test_get_dead_letters_is_tenant_scoped_and_paged(client: TestClient) -> None:
    store: Store = client.app.state.pipeline.store  # type: ignore[attr-defined]
    store.insert_dead_letters([_trace(n) for n in range(3)] + [_trace(9, tenant="globex")], "InvalidInput: x")
    acme = {"x-api-key": "key-acme"}
    page = client.get("/api/v1/dead-letters", params={"limit": 2}, headers=acme)
    assert page.status_code == 200, page.text
    body = page.json()
    assert [d["record_id"] for d in body["items"]] == [f"{2:032x}", f"{1:032x}"]
    assert body["items"][0]["error"] == "InvalidInput: x" and body["items"][0]["kind"] == "trace"
    rest = client.get("/api/v1/dead-letters", params={"cursor": body["next_cursor"]}, headers=acme).json()
    assert [d["record_id"] for d in rest["items"]] == [f"{0:032x}"] and rest["next_cursor"] is None
    globex = client.get("/api/v1/dead-letters", headers={"x-api-key": "key-globex"}).json()
    assert [d["record_id"] for d in globex["items"]] == [f"{9:032x}"]
    assert client.get("/api/v1/dead-letters", params={"kind": "feedback"}, headers=acme).json()["items"] == []
    assert client.get("/api/v1/dead-letters", params={"cursor": "x"}, headers=acme).status_code == 422
    assert client.get("/api/v1/dead-letters", params={"limit": 0}, headers=acme).status_code == 422
    assert client.get("/api/v1/dead-letters").status_code == 401
