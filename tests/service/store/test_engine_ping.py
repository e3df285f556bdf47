"""The PostgreSQL engine pings a pooled connection only after it sat idle (`PING_AFTER_IDLE_S`).

Against a real PostgreSQL server (`DATABASE_URL`, skipped without it): the
server side of a pooled connection is ended with `pg_terminate_backend`, as a
server restart ends it, and the engine must hand out a working connection
after the idle window and recover on the next call within it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from service.store.engine import PING_AFTER_IDLE_S

pytestmark = pytest.mark.postgres

IDLE_S = 1.0  # the window these tests give the engine: back-to-back uses stay far inside it on a busy machine


class PingCount:
    """Counts the dialect's pings of one engine (a spy: the real ping still runs)."""

    def __init__(self, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = engine.dialect.do_ping

        def counted(dbapi_connection: Any) -> bool:
            self.count += 1
            return real(dbapi_connection)

        monkeypatch.setattr(engine.dialect, "do_ping", counted)


def _backend_pid(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())


def _terminate(url: str, pid: int) -> None:
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as conn:
            assert conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar_one()
        # the backend is gone once it leaves pg_stat_activity
        deadline = time.monotonic() + 5
        with admin.connect() as conn:
            while conn.execute(
                sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
            ).scalar_one():
                assert time.monotonic() < deadline, f"backend {pid} still running"
                time.sleep(0.02)
    finally:
        admin.dispose()


@pytest.fixture
def engine(postgres_engines: Callable[..., Engine]) -> Engine:
    return postgres_engines(ping_after_idle_s=IDLE_S)


def test_the_default_window_is_one_second() -> None:
    assert PING_AFTER_IDLE_S == 1.0


def test_a_connection_used_within_the_window_is_not_pinged_one_idle_longer_is(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    pings = PingCount(engine, monkeypatch)
    first = _backend_pid(engine)  # a new connection: not pinged
    for _ in range(20):  # back to back, as a worker's statements come
        assert _backend_pid(engine) == first
    assert pings.count == 0
    time.sleep(IDLE_S + 0.1)
    assert _backend_pid(engine) == first
    assert pings.count == 1
    assert _backend_pid(engine) == first  # used just now again
    assert pings.count == 1


def test_a_dead_connection_that_sat_idle_is_replaced_before_use(engine: Engine, postgres_url: str) -> None:
    first = _backend_pid(engine)
    _terminate(postgres_url, first)
    time.sleep(IDLE_S + 0.1)
    # the ping finds it dead: the pool connects anew and the statement never sees the dead one
    second = _backend_pid(engine)
    assert second != first
    assert _backend_pid(engine) == second


def test_a_dead_connection_used_within_the_window_fails_one_call_then_the_pool_reconnects(
    postgres_url: str, postgres_engines: Callable[..., Engine]
) -> None:
    """The price of not pinging every checkout: after a server restart, a connection used within
    the window fails its next statement once (a DBAPIError, which the store turns into
    `StoreUnavailable` and every caller retries); the pool then drops every connection older than
    the failure, so the next call connects anew."""
    engine = postgres_engines(ping_after_idle_s=60.0)  # no ping can happen within this test
    first = _backend_pid(engine)
    _terminate(postgres_url, first)
    with pytest.raises(sa.exc.DBAPIError) as failed:
        _backend_pid(engine)
    assert failed.value.connection_invalidated
    second = _backend_pid(engine)
    assert second != first
    assert _backend_pid(engine) == second


def test_connections_name_the_ragmon_process_unless_the_url_does(
    postgres_url: str, postgres_engines: Callable[..., Engine]
) -> None:
    """`application_name` is what pg_stat_activity shows a DBA for each connection."""

    def name_of(engine: Engine) -> str:
        with engine.connect() as conn:
            return str(conn.execute(sa.text("SELECT current_setting('application_name')")).scalar_one())

    assert name_of(postgres_engines()) == "ragmon"
    assert name_of(postgres_engines(application_name="ragmon-worker")) == "ragmon-worker"
    named = sa.make_url(postgres_url).update_query_dict({"application_name": "billing-rag"})
    assert name_of(postgres_engines(named, application_name="ragmon-worker")) == "billing-rag"
