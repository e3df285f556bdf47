"""Single-active-scheduler locks: at most one process of a deployment holds a named lock at a time.

`leader_lock(engine, name)` picks the implementation from the database:

* PostgreSQL: `AdvisoryLeaderLock`, a session-level advisory lock
  (`pg_try_advisory_lock`) held on one dedicated connection. The database
  releases it when that connection ends, so a worker that dies (even by
  SIGKILL) gives up leadership without help; another replica takes it on
  its next `acquire()`.
* anything else (SQLite, embedded mode): `ProcessLeaderLock`, a lock shared
  by the holders of the same name in this process, since an embedded
  deployment is one process.

Both are used the same way by a scheduler loop: call `acquire()` before
each run and run only when it returns True. `acquire()` never blocks on
another holder and never raises: a database error means "not leader now".
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

__all__ = ["AdvisoryLeaderLock", "LeaderLock", "ProcessLeaderLock", "exclusive", "leader_lock"]

log = logging.getLogger(__name__)


class LeaderLock(Protocol):
    name: str

    @property
    def held(self) -> bool: ...

    def acquire(self) -> bool: ...

    def release(self) -> None: ...


def _lock_key(name: str) -> int:
    """A stable signed 64-bit key for `name` (PostgreSQL advisory locks take a bigint)."""
    return int.from_bytes(hashlib.sha256(f"ragmon:{name}".encode()).digest()[:8], "big", signed=True)


class AdvisoryLeaderLock:
    """PostgreSQL advisory lock on a dedicated connection; leadership ends with that connection."""

    def __init__(self, engine: Engine, name: str) -> None:
        if engine.dialect.name != "postgresql":
            raise ValueError(f"advisory locks need PostgreSQL, not {engine.dialect.name}")
        self.engine = engine
        self.name = name
        self.key = _lock_key(name)
        self._conn: Connection | None = None
        self._guard = threading.Lock()

    @property
    def held(self) -> bool:
        return self._conn is not None

    def acquire(self) -> bool:
        """True when this process holds the lock now (checking that its connection is still alive)."""
        with self._guard:
            try:
                if self._conn is not None:
                    # still ours only while the session that took it lives
                    self._conn.execute(sa.text("SELECT 1"))
                    self._conn.commit()
                    return True
                conn = self.engine.connect()
                try:
                    got = bool(
                        conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": self.key}).scalar()
                    )
                    conn.commit()
                except BaseException:
                    conn.close()
                    raise
                if got:
                    self._conn = conn
                    log.info("leader lock %r acquired", self.name)
                else:
                    conn.close()
                return got
            except sa_exc.SQLAlchemyError as exc:
                log.warning("leader lock %r: database unavailable (%s); not leader", self.name, exc)
                self._drop()
                return False

    def _drop(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                conn.invalidate()
                conn.close()
            except sa_exc.SQLAlchemyError:
                pass

    def release(self) -> None:
        """Give the lock up (a no-op when not held)."""
        with self._guard:
            if self._conn is None:
                return
            try:
                self._conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": self.key})
                self._conn.commit()
                self._conn.close()
                self._conn = None
            except sa_exc.SQLAlchemyError:
                self._drop()  # closing the session releases the lock anyway


_process_holders: dict[str, object] = {}
_process_guard = threading.Lock()


class ProcessLeaderLock:
    """In-process lock by name: among holders of one name in this process, the first to acquire leads."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._token = object()

    @property
    def held(self) -> bool:
        return _process_holders.get(self.name) is self._token

    def acquire(self) -> bool:
        with _process_guard:
            owner = _process_holders.setdefault(self.name, self._token)
            return owner is self._token

    def release(self) -> None:
        with _process_guard:
            if _process_holders.get(self.name) is self._token:
                del _process_holders[self.name]


@contextmanager
def exclusive(engine: Engine, name: str, timeout_s: float = 60.0) -> Iterator[None]:
    """Run a block in one process of the deployment at a time (PostgreSQL); a no-op elsewhere.

    For one-off work that replicas would otherwise race on, such as creating
    tables at start. Waits up to `timeout_s` for the other holder.
    """
    if engine.dialect.name != "postgresql":
        yield
        return
    with engine.connect() as conn:
        conn.execute(
            sa.text("SELECT set_config('lock_timeout', :t, false)"), {"t": f"{int(timeout_s * 1000)}ms"}
        )
        conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": _lock_key(name)})
        conn.commit()
        try:
            yield
        finally:
            conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": _lock_key(name)})
            conn.commit()


def leader_lock(engine: Engine, name: str) -> AdvisoryLeaderLock | ProcessLeaderLock:
    """The lock for `name` that fits the store: advisory on PostgreSQL, in-process otherwise."""
    if engine.dialect.name == "postgresql":
        return AdvisoryLeaderLock(engine, name)
    return ProcessLeaderLock(name)
