"""Fixtures for tests of `service/`: a fresh store on SQLite and on PostgreSQL.

`store_url` is parametrized over both databases. The SQLite case is a file in
the test's tmp_path. The PostgreSQL case needs `DATABASE_URL` (an admin URL,
e.g. what `.ci/start_postgres.sh` prints) and is skipped without it. Each
test module gets its own database and each test its own schema in it, both
dropped afterwards, so no rows leak between tests.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from service.store.engine import postgres_engine
from service.store.trace_store import Store

_NO_POSTGRES = (
    "DATABASE_URL is not set; to run the PostgreSQL cases: "
    'export DATABASE_URL="$(.ci/start_postgres.sh /tmp/ragmon-pg)"'
)


def _postgres_admin_url() -> sa.URL:
    raw = os.environ.get("DATABASE_URL")
    if not raw:
        pytest.skip(_NO_POSTGRES)
    url = sa.make_url(raw)
    if url.get_backend_name() != "postgresql":
        pytest.skip(f"DATABASE_URL is not a PostgreSQL URL: {url.render_as_string(hide_password=True)}")
    return url.set(drivername="postgresql+psycopg")


@pytest.fixture(scope="module")
def postgres_database() -> Iterator[sa.URL]:
    """A new PostgreSQL database for one test module, dropped after it."""
    admin_url = _postgres_admin_url()
    name = f"ragmon_test_{uuid.uuid4().hex[:20]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        yield admin_url.set(database=name)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture
def postgres_url(postgres_database: sa.URL) -> Iterator[str]:
    """The URL of an empty PostgreSQL schema of this test's own, dropped after the test.

    The schema lives in the module's database and is selected through
    `search_path` in the URL's `options`, so a test sees only its own tables.
    Creating a schema costs milliseconds; a database, a checkpoint.
    """
    schema = f"t_{uuid.uuid4().hex[:20]}"
    engine = sa.create_engine(postgres_database, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        url = postgres_database.update_query_dict({"options": f"-csearch_path={schema}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with engine.connect() as conn:
            # Any session a test left open (a blocker, a pool) would hold locks on the schema.
            conn.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        engine.dispose()


@pytest.fixture
def postgres_engines(postgres_url: str) -> Iterator[Callable[..., Engine]]:
    """Makes engines as the store makes them (`postgres_engine`) on this test's schema (or at `url`),
    with small pools and timeouts that keyword arguments override; each is disposed after the test."""
    made: list[Engine] = []

    def make(url: sa.URL | None = None, **overrides: Any) -> Engine:
        settings: dict[str, Any] = {
            "pool_size": 2,
            "max_overflow": 0,
            "pool_timeout_s": 5,
            "connect_timeout_s": 5,
            "statement_timeout_s": 5,
        }
        made.append(postgres_engine(url or sa.make_url(postgres_url), **{**settings, **overrides}))
        return made[-1]

    yield make
    for engine in made:
        engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A URL for an empty database: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp('store') / 'ragmon.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """A `Store` with its schema created on a database of its own; closed after the test."""
    opened = Store(store_url, statement_timeout_s=10.0, connect_timeout_s=5.0)
    opened.create_schema()
    try:
        yield opened
    finally:
        opened.close()
