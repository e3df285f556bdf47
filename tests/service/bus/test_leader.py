"""`service/bus/leader.py`: one holder per name, and leadership that ends with the holder's session."""

from __future__ import annotations

import time
import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from service.bus.leader import AdvisoryLeaderLock, ProcessLeaderLock, exclusive, leader_lock


def test_process_lock_has_one_holder_until_released() -> None:
    name = f"test-{uuid.uuid4().hex}"
    first, second = ProcessLeaderLock(name), ProcessLeaderLock(name)
    assert first.acquire() and first.held
    assert first.acquire(), "acquiring again while holding is still True"
    assert not second.acquire() and not second.held
    first.release()
    assert not first.held
    assert second.acquire() and second.held
    second.release()


def test_sqlite_gets_the_in_process_lock_and_exclusive_is_a_no_op(tmp_path: object) -> None:
    engine = sa.create_engine("sqlite://")
    lock = leader_lock(engine, "x")
    assert isinstance(lock, ProcessLeaderLock)
    ran = []
    with exclusive(engine, "x"):
        ran.append(True)
    assert ran == [True]
    with pytest.raises(ValueError, match="PostgreSQL"):
        AdvisoryLeaderLock(engine, "x")


@pytest.mark.postgres
def test_advisory_lock_moves_to_another_replica_when_the_holder_session_dies(postgres_url: str) -> None:
    name = f"test-{uuid.uuid4().hex}"
    engines = [sa.create_engine(postgres_url) for _ in range(2)]
    admin = sa.create_engine(postgres_url, poolclass=NullPool)
    try:
        a, b = (leader_lock(e, name) for e in engines)
        assert isinstance(a, AdvisoryLeaderLock)
        assert a.acquire()
        assert not b.acquire()
        # the holder dies without releasing (as under SIGKILL): its session ends on the server
        with admin.connect() as conn:
            conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_locks "
                    "WHERE locktype = 'advisory' AND granted AND objid = (:k & 4294967295)"
                ),
                {"k": a.key},
            )
            conn.commit()
        # pg_terminate_backend only signals the backend; the lock goes when that process has exited
        deadline = time.monotonic() + 10
        while not b.acquire() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b.held
        assert not a.acquire(), "the old holder must notice it lost the lock"
        b.release()
        assert a.acquire()
        a.release()
    finally:
        for e in engines:
            e.dispose()
        admin.dispose()


@pytest.mark.postgres
def test_exclusive_serializes_holders(postgres_url: str) -> None:
    engine = sa.create_engine(postgres_url)
    try:
        with exclusive(engine, "schema"):
            other = AdvisoryLeaderLock(engine, "schema")
            assert not other.acquire(), "the block holds the same advisory key"
        assert other.acquire()
        other.release()
    finally:
        engine.dispose()
