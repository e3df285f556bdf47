"""`GoldenStore`: golden sets, probe runs with their scores, and pinned baselines, in the store's database.

Three tables of their own (own `MetaData`) on the engine the trace store
owns:

* `golden_sets`: one row per (tenant, name, version); `version` is the
  content hash of `service.probes.golden` and the row keeps the set as JSONL.
  Loading the same content again under the same name changes nothing.
* `probe_runs`: one row per (tenant, run_id): which golden set version it
  was sent from, when it started, and its latest score (JSON), if scored.
  Scoring again replaces the score; the run keeps its golden version.
* `probe_baselines`: the pinned baseline run of each (tenant, golden name).

Reads filter by tenant. Calls are blocking and thread-safe (callers in the
event loop use `asyncio.to_thread`). A database that does not answer raises
`StoreUnavailable`; a run registered twice with different golden sets, or a
baseline pinned on a run that was never scored, raises `InvalidInput`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from service.errors import InvalidInput, StoreUnavailable
from service.probes.golden import GoldenSet, GoldenText, parse_golden
from service.store.engine import transaction
from service.store.rows import trace_record
from service.store.tables import UtcDateTime, trace_contexts, traces

__all__ = ["GoldenInfo", "GoldenStore", "ProbeRun", "metadata"]

metadata = sa.MetaData()

golden_sets = sa.Table(
    "golden_sets",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("version", sa.String(80), primary_key=True),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("questions", sa.Integer, nullable=False),
    sa.Column("loaded_at", UtcDateTime, nullable=False),
    sa.Column("content", sa.Text, nullable=False),
)

probe_runs = sa.Table(
    "probe_runs",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("run_id", sa.Text, primary_key=True),
    sa.Column("golden_name", sa.Text, nullable=False),
    sa.Column("golden_version", sa.String(80), nullable=False),
    sa.Column("started_at", UtcDateTime, nullable=False),
    sa.Column("scored_at", UtcDateTime),
    sa.Column("result", sa.Text),
    # "the previous run" walks a golden set's runs by start time.
    sa.Index("ix_probe_runs_golden_time", "tenant", "golden_name", "started_at"),
)

probe_baselines = sa.Table(
    "probe_baselines",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("golden_name", sa.Text, primary_key=True),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("pinned_at", UtcDateTime, nullable=False),
)


@dataclass(frozen=True)
class GoldenInfo:
    """One stored golden set version, without its questions."""

    name: str
    version: str
    source: str
    questions: int
    loaded_at: datetime
    new: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "source": self.source,
            "questions": self.questions,
            "loaded_at": self.loaded_at.isoformat(),
            "new": self.new,
        }


@dataclass(frozen=True)
class ProbeRun:
    """A probe run as stored: its golden set version, start, and latest score (None until scored)."""

    run_id: str
    golden_name: str
    golden_version: str
    started_at: datetime
    scored_at: datetime | None
    result: dict[str, Any] | None

    def to_json(self, *, with_result: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {
            "run_id": self.run_id,
            "golden_name": self.golden_name,
            "golden_version": self.golden_version,
            "started_at": self.started_at.isoformat(),
            "scored_at": None if self.scored_at is None else self.scored_at.isoformat(),
        }
        if with_result:
            data["result"] = self.result
        return data


def _run(row: Any) -> ProbeRun:
    return ProbeRun(
        run_id=row.run_id,
        golden_name=row.golden_name,
        golden_version=row.golden_version,
        started_at=row.started_at,
        scored_at=row.scored_at,
        result=None if row.result is None else json.loads(row.result),
    )


def _info(row: Any, new: bool = False) -> GoldenInfo:
    return GoldenInfo(row.name, row.version, row.source, row.questions, row.loaded_at, new)


class GoldenStore:
    """Golden sets, probe runs and baselines on an engine the caller owns (the trace store's)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def create_schema(self) -> None:
        """Create the three tables if missing; safe to repeat."""
        with self._connect(writes=True) as conn:
            metadata.create_all(conn, checkfirst=True)

    @contextmanager
    def _connect(self, *, writes: bool = False) -> Iterator[Connection]:
        try:
            with transaction(self.engine, writes=writes) as conn:
                yield conn
        except (sa_exc.OperationalError, sa_exc.InterfaceError) as exc:
            raise StoreUnavailable(f"golden store unavailable: {type(exc.orig).__name__}") from exc

    def _insert(self, table: sa.Table) -> Any:
        dialect = postgresql if self.engine.dialect.name == "postgresql" else sqlite
        return dialect.insert(table).on_conflict_do_nothing()

    # golden sets

    def load(self, tenant: str, golden: GoldenSet | GoldenText, name: str) -> GoldenInfo:
        """Store a golden set under `name`; `new` is False when this tenant already had that version."""
        if not name.strip():
            raise ValueError("a golden set needs a non-blank name")
        text = golden.as_text() if isinstance(golden, GoldenSet) else golden
        row = {
            "tenant": tenant,
            "name": name,
            "version": text.version,
            "source": text.source,
            "questions": text.questions,
            "loaded_at": datetime.now(UTC),
            "content": text.jsonl,
        }
        g = golden_sets.c
        with self._connect(writes=True) as conn:
            # RETURNING, not rowcount: drivers differ in what rowcount says after ON CONFLICT
            inserted = (
                conn.execute(self._insert(golden_sets).values(row).returning(g.version)).first() is not None
            )
            stored = conn.execute(
                sa.select(g.name, g.version, g.source, g.questions, g.loaded_at).where(
                    g.tenant == tenant, g.name == name, g.version == text.version
                )
            ).one()
        return _info(stored, new=inserted)

    def golden(self, tenant: str, name: str, version: str | None = None) -> GoldenSet | None:
        """The golden set `name` at `version` (None: the one loaded last), or None when unknown."""
        g = golden_sets.c
        query = sa.select(g.content, g.source).where(g.tenant == tenant, g.name == name)
        if version is not None:
            query = query.where(g.version == version)
        with self._connect() as conn:
            row = conn.execute(query.order_by(g.loaded_at.desc()).limit(1)).first()
        if row is None:
            return None
        return parse_golden(row.content.splitlines(), source=row.source)

    def golden_sets(self, tenant: str) -> list[GoldenInfo]:
        """Every stored version of every golden set of the tenant, newest first."""
        g = golden_sets.c
        with self._connect() as conn:
            rows = conn.execute(
                sa.select(g.name, g.version, g.source, g.questions, g.loaded_at)
                .where(g.tenant == tenant)
                .order_by(g.loaded_at.desc(), g.name)
            ).all()
        return [_info(r) for r in rows]

    # probe runs

    def register_run(
        self, tenant: str, run_id: str, golden_name: str, golden_version: str, started_at: datetime
    ) -> ProbeRun:
        """Record that `run_id` is sent from this golden set version; the same call twice is harmless."""
        if not run_id.strip():
            raise ValueError("a probe run needs a non-blank run id")
        row = {
            "tenant": tenant,
            "run_id": run_id,
            "golden_name": golden_name,
            "golden_version": golden_version,
            "started_at": started_at,
        }
        with self._connect(writes=True) as conn:
            conn.execute(self._insert(probe_runs).values(row))
            stored = self._run_row(conn, tenant, run_id)
        if stored is None or (stored.golden_name, stored.golden_version) != (golden_name, golden_version):
            raise InvalidInput(f"probe run {run_id!r} is already registered with another golden set")
        return stored

    @staticmethod
    def _run_row(conn: Connection, tenant: str, run_id: str) -> ProbeRun | None:
        p = probe_runs.c
        row = conn.execute(sa.select(probe_runs).where(p.tenant == tenant, p.run_id == run_id)).first()
        return None if row is None else _run(row)

    def run(self, tenant: str, run_id: str) -> ProbeRun | None:
        with self._connect() as conn:
            return self._run_row(conn, tenant, run_id)

    def runs(self, tenant: str, golden_name: str | None = None, limit: int = 100) -> list[ProbeRun]:
        """Runs of the tenant (of one golden set when named), newest start first."""
        if not 1 <= limit <= 10_000:
            raise ValueError(f"limit must be within 1..10000, got {limit}")
        p = probe_runs.c
        query = sa.select(probe_runs).where(p.tenant == tenant)
        if golden_name is not None:
            query = query.where(p.golden_name == golden_name)
        with self._connect() as conn:
            rows = conn.execute(query.order_by(p.started_at.desc(), p.run_id.desc()).limit(limit)).all()
        return [_run(r) for r in rows]

    def save_score(self, tenant: str, run: ProbeRun) -> None:
        """Store a scored run (insert, or replace the earlier score of the same run)."""
        if run.scored_at is None or run.result is None:
            raise ValueError("save_score needs a scored run")
        p = probe_runs.c
        text = json.dumps(run.result, separators=(",", ":"), allow_nan=False)
        with self._connect(writes=True) as conn:
            conn.execute(
                self._insert(probe_runs).values(
                    tenant=tenant,
                    run_id=run.run_id,
                    golden_name=run.golden_name,
                    golden_version=run.golden_version,
                    started_at=run.started_at,
                )
            )
            conn.execute(
                sa.update(probe_runs)
                .where(p.tenant == tenant, p.run_id == run.run_id)
                .values(scored_at=run.scored_at, result=text)
            )

    def previous_run(self, tenant: str, run: ProbeRun) -> ProbeRun | None:
        """The last scored run of the same golden set that started before `run`."""
        p = probe_runs.c
        query = (
            sa.select(probe_runs)
            .where(
                p.tenant == tenant,
                p.golden_name == run.golden_name,
                p.run_id != run.run_id,
                p.scored_at.is_not(None),
                sa.or_(
                    p.started_at < run.started_at,
                    sa.and_(p.started_at == run.started_at, p.run_id < run.run_id),
                ),
            )
            .order_by(p.started_at.desc(), p.run_id.desc())
            .limit(1)
        )
        with self._connect() as conn:
            row = conn.execute(query).first()
        return None if row is None else _run(row)

    def latest_scored_runs(self, tenant: str | None = None) -> list[tuple[str, ProbeRun]]:
        """(tenant, run) of the newest scored run of every golden set, of one tenant or all (None).

        Runs that started at the same instant are told apart by run id, the larger one winning.
        """
        p = probe_runs.c
        scored = [p.scored_at.is_not(None)] + ([] if tenant is None else [p.tenant == tenant])
        newest = (
            sa.select(p.tenant, p.golden_name, sa.func.max(p.started_at).label("started_at"))
            .where(*scored)
            .group_by(p.tenant, p.golden_name)
            .subquery()
        )
        query = sa.select(probe_runs).join(
            newest,
            sa.and_(
                p.tenant == newest.c.tenant,
                p.golden_name == newest.c.golden_name,
                p.started_at == newest.c.started_at,
            ),
        )
        with self._connect() as conn:
            rows = conn.execute(query.where(*scored).order_by(p.tenant, p.run_id)).all()
        latest: dict[tuple[str, str], tuple[str, ProbeRun]] = {}
        for row in rows:
            latest[(row.tenant, row.golden_name)] = (row.tenant, _run(row))
        return list(latest.values())

    # baselines

    def pin_baseline(self, tenant: str, run_id: str) -> ProbeRun:
        """Make a scored run the baseline of its golden set (replacing the earlier pin)."""
        b = probe_baselines.c
        with self._connect(writes=True) as conn:
            run = self._run_row(conn, tenant, run_id)
            if run is None or run.scored_at is None:
                raise InvalidInput(f"probe run {run_id!r} has not been scored; score it before pinning it")
            conn.execute(
                sa.delete(probe_baselines).where(b.tenant == tenant, b.golden_name == run.golden_name)
            )
            conn.execute(
                sa.insert(probe_baselines).values(
                    tenant=tenant, golden_name=run.golden_name, run_id=run_id, pinned_at=datetime.now(UTC)
                )
            )
        return run

    def baseline(self, tenant: str, golden_name: str) -> ProbeRun | None:
        """The pinned baseline run of a golden set, or None when none is pinned."""
        b = probe_baselines.c
        with self._connect() as conn:
            run_id = conn.execute(
                sa.select(b.run_id).where(b.tenant == tenant, b.golden_name == golden_name)
            ).scalar_one_or_none()
            return None if run_id is None else self._run_row(conn, tenant, run_id)

    # the traces of a run

    def run_traces(self, tenant: str, run_id: str) -> list[dict[str, Any]]:
        """The stored traces of a probe run with their context, oldest first (shaped as `Store.get_trace`)."""
        t, c = traces.c, trace_contexts.c
        query = (
            sa.select(traces, c.context)
            .select_from(
                traces.outerjoin(trace_contexts, sa.and_(c.tenant == t.tenant, c.trace_id == t.trace_id))
            )
            .where(t.tenant == tenant, t.probe_run_id == run_id)
            .order_by(t.start_time, t.trace_id)
        )
        with self._connect() as conn:
            rows = conn.execute(query).mappings().all()
        return [trace_record(r, context=r["context"] or {}) for r in rows]
