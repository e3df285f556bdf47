"""`DriftStore`: the observation sample, pinned references and drift runs, on the trace store's database.

Tables (own `MetaData` in `tables.py`, created on the store's engine):

* `drift_buckets` / `drift_observations`: per (tenant, app, embedding model,
  time bucket) a uniform sample of at most `bucket_capacity` observations and
  the count of traces it stands for. This is what `pin --from T --to T` and
  the rolling current window draw from. A bucket keeps up to
  `bucket_capacity` rows (default 2,000, the window's size: a day whose
  traffic all came in one hour still fills a window), and `compact` cuts
  buckets older than the current window down to `archive_capacity` (default
  250 per hour), so the bound is `bucket_capacity` rows per app and model
  per hour of the last day plus `archive_capacity` per hour before it (a row
  is ~1.6 kB with a 384-d float32 vector), deleted after `retention_days`.
  Draws filter rows by trace time, so a sample never holds a trace from
  outside the asked range even where a bucket straddles its edge.
* `drift_references` / `drift_reference_rows`: pinned references. Pinning
  again makes a new version; old versions stay listed. A reference keeps its
  own copy of the sample (vectors as float32 bytes, scores, hits), so it does
  not change when old observations are deleted.
* `drift_reference_embedders`: the query embedder fitted on a reference
  (`detectors.TextKnnDrift` over `TfidfEmbedder`), its name and its fitted
  state, so windows are embedded exactly as the reference was for as long
  as the reference lives.
* `drift_runs`: one row per detector result (every `DriftResult` field, the
  alarm after hysteresis, the outcome and the explanation JSON).
* `drift_monitor_state`: regeneration-band state per (tenant, app, intent), so
  a restarted process keeps its baseline.

Every call is blocking and thread-safe; database outages raise `StoreUnavailable`.
Merging a bucket reads then writes in one transaction that takes the write
lock first (SQLite `BEGIN IMMEDIATE`), so two writers cannot lose each other's rows.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from service.drift.records import BucketBatch as BucketBatch
from service.drift.records import ReferenceInfo as ReferenceInfo
from service.drift.records import RunRecord as RunRecord
from service.drift.records import _observation, _observation_values, _reference_info, _run_record
from service.drift.records import sample_hash as sample_hash
from service.drift.sample import Sample, draw_counts, merge_counts
from service.drift.tables import drift_buckets as drift_buckets
from service.drift.tables import drift_monitor_state as drift_monitor_state
from service.drift.tables import drift_observations as drift_observations
from service.drift.tables import drift_reference_embedders as drift_reference_embedders
from service.drift.tables import drift_reference_rows as drift_reference_rows
from service.drift.tables import drift_references as drift_references
from service.drift.tables import drift_runs as drift_runs
from service.drift.tables import metadata as metadata
from service.errors import StoreUnavailable

__all__ = ["BucketBatch", "DriftStore", "ReferenceInfo", "RunRecord", "bucket_start"]


def bucket_start(at: datetime, bucket_s: float) -> datetime:
    """The start of the bucket that holds `at` (buckets are aligned to the Unix epoch)."""
    if bucket_s <= 0:
        raise ValueError(f"bucket_s must be positive, got {bucket_s}")
    aware = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    seconds = math.floor(aware.timestamp() / bucket_s) * bucket_s
    return datetime.fromtimestamp(seconds, UTC)


class DriftStore:
    """Drift tables on an engine the caller owns (the trace store's)."""

    def __init__(self, engine: Engine, *, bucket_s: float = 3600.0, bucket_capacity: int = 250) -> None:
        if bucket_s <= 0:
            raise ValueError(f"bucket_s must be positive, got {bucket_s}")
        if bucket_capacity < 1:
            raise ValueError(f"bucket_capacity must be at least 1, got {bucket_capacity}")
        self.engine = engine
        self.bucket_s = bucket_s
        self.bucket_capacity = bucket_capacity

    def create_schema(self) -> None:
        with self._connect(write=True) as conn:
            metadata.create_all(conn, checkfirst=True)

    @contextmanager
    def _connect(self, *, write: bool = False) -> Iterator[Connection]:
        try:
            with self.engine.connect() as conn:
                if write:
                    # SQLite write lock at BEGIN (store/engine.py): read-then-write must not deadlock.
                    conn.execution_options(ragmon_writes=True)
                with conn.begin():
                    yield conn
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
            raise StoreUnavailable(f"drift store unavailable: {type(exc.orig).__name__}") from exc

    # -- observation sample ------------------------------------------------

    def add_observations(self, batches: Iterable[BucketBatch], *, seed: int = 0) -> int:
        """Merge each batch into its bucket's stored sample; return the rows written.

        The merged bucket stays a uniform sample of all traces it has seen,
        at most `bucket_capacity` rows (`merge_counts`).
        """
        written = 0
        b, o = drift_buckets.c, drift_observations.c
        with self._connect(write=True) as conn:
            for batch in batches:
                if batch.seen < len(batch.observations):
                    raise ValueError("a batch cannot hold more observations than it has seen")
                if not batch.observations:
                    continue
                start = bucket_start(batch.bucket_start, self.bucket_s)
                key = (b.tenant == batch.tenant, b.app == batch.app, b.model_key == batch.model_key)
                found = conn.execute(sa.select(b.seen, b.kept).where(*key, b.bucket_start == start)).first()
                seen_old, kept_old = (int(found.seen), int(found.kept)) if found else (0, 0)
                rng = np.random.default_rng([seed, written, seen_old, batch.seen])
                take_old, take_new = merge_counts(
                    seen_old, kept_old, batch.seen, len(batch.observations), self.bucket_capacity, rng
                )
                if take_old < kept_old:
                    ids = [
                        int(i)
                        for i in conn.execute(
                            sa.select(o.id).where(
                                o.tenant == batch.tenant,
                                o.app == batch.app,
                                o.model_key == batch.model_key,
                                o.bucket_start == start,
                            )
                        ).scalars()
                    ]
                    drop = rng.choice(len(ids), len(ids) - take_old, replace=False)
                    doomed = [ids[int(i)] for i in drop]
                    for chunk in range(0, len(doomed), 500):
                        conn.execute(
                            sa.delete(drift_observations).where(o.id.in_(doomed[chunk : chunk + 500]))
                        )
                chosen = rng.choice(len(batch.observations), take_new, replace=False)
                rows = [
                    {
                        "tenant": batch.tenant,
                        "app": batch.app,
                        "model_key": batch.model_key,
                        "bucket_start": start,
                        **_observation_values(batch.observations[int(i)]),
                    }
                    for i in sorted(chosen)
                ]
                if rows:
                    conn.execute(sa.insert(drift_observations), rows)
                values = {"seen": seen_old + batch.seen, "kept": take_old + take_new}
                if found:
                    conn.execute(sa.update(drift_buckets).where(*key, b.bucket_start == start).values(values))
                else:
                    conn.execute(
                        sa.insert(drift_buckets).values(
                            tenant=batch.tenant,
                            app=batch.app,
                            model_key=batch.model_key,
                            bucket_start=start,
                            **values,
                        )
                    )
                written += len(rows)
        return written

    def model_keys(self) -> dict[tuple[str, str], set[str]]:
        """Every embedding model key seen per (tenant, app), in observations or references."""
        keys: dict[tuple[str, str], set[str]] = defaultdict(set)
        with self._connect() as conn:
            for table in (drift_buckets, drift_references):
                for tenant, app, model in conn.execute(
                    sa.select(table.c.tenant, table.c.app, table.c.model_key).distinct()
                ):
                    keys[(tenant, app)].add(model)
        return dict(keys)

    def window_keys(
        self, tenant: str, *, app: str | None = None, since: datetime, until: datetime
    ) -> dict[tuple[str, str], int]:
        """(app, model_key) -> traces seen in buckets overlapping [since, until)."""
        b = drift_buckets.c
        query = (
            sa.select(b.app, b.model_key, sa.func.sum(b.seen))
            .where(b.tenant == tenant, b.bucket_start < until, b.bucket_start > since - self._bucket)
            .group_by(b.app, b.model_key)
        )
        if app is not None:
            query = query.where(b.app == app)
        with self._connect() as conn:
            return {(a, m): int(n) for a, m, n in conn.execute(query)}

    @property
    def _bucket(self) -> timedelta:
        return timedelta(seconds=self.bucket_s)

    def draw(
        self,
        tenant: str,
        app: str,
        model_key: str,
        *,
        since: datetime | None,
        until: datetime | None,
        capacity: int,
        release: str | None = None,
        exclude: Sequence[tuple[datetime, datetime]] = (),
        seed: int = 0,
    ) -> tuple[Sample, int, int]:
        """A uniform sample (`draw_counts`) of the buckets overlapping [since, until), minus `exclude`.

        Returns (sample, traces it stands for, buckets left out by `exclude`).
        Only rows whose trace time lies in [since, until) count: in a bucket
        that straddles an edge, the rows inside are a uniform sample of the
        bucket's traffic inside, so its traffic is scaled by their share of
        the bucket's rows. With `release`, only that release's rows count,
        scaled the same way.
        """
        b, o = drift_buckets.c, drift_observations.c
        where = [b.tenant == tenant, b.app == app, b.model_key == model_key]
        if since is not None:
            where.append(b.bucket_start > since - self._bucket)
        if until is not None:
            where.append(b.bucket_start < until)
        with self._connect() as conn:
            buckets = conn.execute(
                sa.select(b.bucket_start, b.seen, b.kept).where(*where).order_by(b.bucket_start)
            ).all()
            excluded = 0
            usable = []
            for row in buckets:
                end = row.bucket_start + self._bucket
                if any(row.bucket_start < x_end and x_start < end for x_start, x_end in exclude):
                    excluded += 1
                else:
                    usable.append(row)
            ids_by_bucket: list[list[int]] = []
            seen: list[int] = []
            for row in usable:
                query = sa.select(o.id).where(
                    o.tenant == tenant,
                    o.app == app,
                    o.model_key == model_key,
                    o.bucket_start == row.bucket_start,
                )
                filtered = release is not None
                if release is not None:
                    query = query.where(o.release == release)
                if since is not None and row.bucket_start < since:
                    query, filtered = query.where(o.trace_time >= since), True
                if until is not None and row.bucket_start + self._bucket > until:
                    query, filtered = query.where(o.trace_time < until), True
                ids = sorted(int(i) for i in conn.execute(query).scalars())
                ids_by_bucket.append(ids)
                share = len(ids) / row.kept if row.kept else 0.0
                seen.append(round(row.seen * share) if filtered else int(row.seen))
            rng = np.random.default_rng([seed, len(usable)])
            counts = draw_counts(seen, [len(ids) for ids in ids_by_bucket], capacity, rng)
            chosen: list[int] = []
            for ids, count in zip(ids_by_bucket, counts, strict=True):
                if count:
                    chosen.extend(ids[int(i)] for i in sorted(rng.choice(len(ids), count, replace=False)))
            rows: list[Any] = []
            for start in range(0, len(chosen), 500):
                rows.extend(
                    conn.execute(
                        sa.select(drift_observations)
                        .where(o.id.in_(chosen[start : start + 500]))
                        .order_by(o.id)
                    ).all()
                )
        sample = Sample(tuple(_observation(r) for r in rows))
        return sample, int(sum(seen)), excluded

    def compact(self, before: datetime, capacity: int, *, seed: int = 0) -> int:
        """Cut every bucket that ended before `before` down to at most `capacity` rows; return rows gone.

        The rows kept are a uniform subsample of the bucket's uniform sample,
        so the bucket stays a uniform sample of the traffic it has seen.
        """
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        b, o = drift_buckets.c, drift_observations.c
        gone = 0
        with self._connect(write=True) as conn:
            full = conn.execute(
                sa.select(b.tenant, b.app, b.model_key, b.bucket_start, b.kept)
                .where(b.bucket_start < before - self._bucket, b.kept > capacity)
                .order_by(b.tenant, b.app, b.model_key, b.bucket_start)
            ).all()
            for row in full:
                key = (o.tenant == row.tenant, o.app == row.app, o.model_key == row.model_key)
                ids = sorted(
                    int(i)
                    for i in conn.execute(sa.select(o.id).where(*key, o.bucket_start == row.bucket_start))
                    .scalars()
                    .all()
                )
                rng = np.random.default_rng([seed, len(ids), int(row.bucket_start.timestamp())])
                drop = rng.choice(len(ids), max(0, len(ids) - capacity), replace=False)
                doomed = [ids[int(i)] for i in drop]
                for chunk in range(0, len(doomed), 500):
                    conn.execute(sa.delete(drift_observations).where(o.id.in_(doomed[chunk : chunk + 500])))
                conn.execute(
                    sa.update(drift_buckets)
                    .where(
                        b.tenant == row.tenant,
                        b.app == row.app,
                        b.model_key == row.model_key,
                        b.bucket_start == row.bucket_start,
                    )
                    .values(kept=len(ids) - len(doomed))
                )
                gone += len(doomed)
        return gone

    def delete_older_than(self, cutoff: datetime) -> int:
        """Delete observation buckets that ended before `cutoff`, and runs older than it; return rows gone."""
        with self._connect(write=True) as conn:
            gone = conn.execute(
                sa.delete(drift_observations).where(drift_observations.c.bucket_start < cutoff - self._bucket)
            ).rowcount
            conn.execute(sa.delete(drift_buckets).where(drift_buckets.c.bucket_start < cutoff - self._bucket))
            conn.execute(sa.delete(drift_runs).where(drift_runs.c.ran_at < cutoff))
        return int(gone or 0)

    # -- references ----------------------------------------------------------

    def pin(
        self,
        tenant: str,
        app: str,
        model_key: str,
        sample: Sample,
        *,
        range_start: datetime | None,
        range_end: datetime | None,
        release: str | None,
        traces_represented: int,
        excluded_buckets: int,
        embedder: tuple[str, bytes] | None = None,
        now: datetime | None = None,
    ) -> ReferenceInfo:
        """Store `sample` as the next version of the (tenant, app, model) reference; ValueError if empty.

        `embedder` is the (name, state) of a query embedder fitted on this
        sample, stored with it in the same transaction.
        """
        if not len(sample):
            raise ValueError("cannot pin an empty reference")
        now = now or datetime.now(UTC)
        r = drift_references.c
        with self._connect(write=True) as conn:
            latest = conn.execute(
                sa.select(sa.func.max(r.version)).where(
                    r.tenant == tenant, r.app == app, r.model_key == model_key
                )
            ).scalar()
            version = int(latest or 0) + 1
            label = f"{app}/{model_key}/v{version}"
            values: dict[str, Any] = {
                "tenant": tenant,
                "app": app,
                "model_key": model_key,
                "version": version,
                "label": label,
                "created_at": now,
                "range_start": range_start,
                "range_end": range_end,
                "release": release,
                "n": len(sample),
                "traces_represented": traces_represented,
                "excluded_buckets": excluded_buckets,
                "content_hash": sample_hash(sample),
            }
            pk = conn.execute(sa.insert(drift_references).values(values).returning(r.id)).scalar_one()
            conn.execute(
                sa.insert(drift_reference_rows),
                [
                    {"reference_id": pk, "position": i, **_observation_values(o)}
                    for i, o in enumerate(sample.observations)
                ],
            )
            if embedder is not None:
                conn.execute(
                    sa.insert(drift_reference_embedders).values(
                        reference_id=pk, embedder_key=embedder[0], state=embedder[1]
                    )
                )
        return ReferenceInfo(
            id=int(pk),
            label=label,
            tenant=tenant,
            app=app,
            model_key=model_key,
            version=version,
            created_at=now,
            range_start=range_start,
            range_end=range_end,
            release=release,
            n=len(sample),
            traces_represented=traces_represented,
            excluded_buckets=excluded_buckets,
            content_hash=str(values["content_hash"]),
            embedder_key=None if embedder is None else embedder[0],
        )

    def references(self, tenant: str, *, app: str | None = None) -> list[ReferenceInfo]:
        """Every reference version of a tenant (optionally one app), newest version first."""
        r = drift_references.c
        e = drift_reference_embedders.c
        query = (
            sa.select(drift_references, e.embedder_key)
            .outerjoin(drift_reference_embedders, e.reference_id == r.id)
            .where(r.tenant == tenant)
        )
        if app is not None:
            query = query.where(r.app == app)
        query = query.order_by(r.app, r.model_key, r.version.desc())
        with self._connect() as conn:
            return [_reference_info(row) for row in conn.execute(query)]

    def latest_references(self, tenant: str, *, app: str | None = None) -> list[ReferenceInfo]:
        """The newest version per (app, model) of a tenant."""
        newest: dict[tuple[str, str], ReferenceInfo] = {}
        for info in self.references(tenant, app=app):
            newest.setdefault((info.app, info.model_key), info)
        return list(newest.values())

    def tenants(self) -> list[str]:
        """Tenants with observations or references."""
        with self._connect() as conn:
            found = set(conn.execute(sa.select(drift_buckets.c.tenant).distinct()).scalars())
            found |= set(conn.execute(sa.select(drift_references.c.tenant).distinct()).scalars())
        return sorted(found)

    def reference_embedder(self, reference_id: int) -> tuple[str, bytes] | None:
        """The (name, state) of the query embedder fitted on a reference, or None when it has none."""
        e = drift_reference_embedders.c
        with self._connect() as conn:
            row = conn.execute(
                sa.select(e.embedder_key, e.state).where(e.reference_id == reference_id)
            ).first()
        return None if row is None else (str(row.embedder_key), bytes(row.state))

    def reference_sample(self, reference_id: int) -> Sample:
        rows_table = drift_reference_rows.c
        with self._connect() as conn:
            rows = conn.execute(
                sa.select(drift_reference_rows)
                .where(rows_table.reference_id == reference_id)
                .order_by(rows_table.position)
            ).all()
        return Sample(tuple(_observation(row) for row in rows))

    # -- runs ------------------------------------------------------------------

    def add_runs(self, runs: Sequence[RunRecord]) -> None:
        if not runs:
            return
        rows = []
        for run in runs:
            result = run.result
            rows.append(
                {
                    "tenant": run.tenant,
                    "app": run.app,
                    "model_key": run.model_key,
                    "intent": run.intent,
                    "detector": result.detector,
                    "version": result.version,
                    "reference_id": result.reference_id,
                    "window_start": result.window_start,
                    "window_end": result.window_end,
                    "n_reference": result.n_reference,
                    "n_window": result.n_window,
                    "statistic": result.statistic if math.isfinite(result.statistic) else None,
                    "p_value": result.p_value,
                    "alpha": result.alpha,
                    "drifted": result.drifted,
                    "alarm": run.alarm,
                    "outcome": run.outcome,
                    "trigger": run.trigger,
                    "details": json.dumps(result.details, allow_nan=False, default=str),
                    "explanation": None if run.explanation is None else json.dumps(run.explanation),
                    "ran_at": run.ran_at,
                }
            )
        with self._connect(write=True) as conn:
            conn.execute(sa.insert(drift_runs), rows)

    def runs(
        self,
        tenant: str,
        *,
        app: str | None = None,
        detector: str | None = None,
        model_key: str | None = None,
        intent: str | None = None,
        alarm: bool | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
    ) -> list[RunRecord]:
        """Stored runs of a tenant matching the filters, newest first (at most `limit`, 1..10,000)."""
        if not 1 <= limit <= 10_000:
            raise ValueError(f"limit must be within 1..10000, got {limit}")
        c = drift_runs.c
        query = sa.select(drift_runs).where(c.tenant == tenant)
        for column, value in (
            (c.app, app),
            (c.detector, detector),
            (c.model_key, model_key),
            (c.intent, intent),
        ):
            if value is not None:
                query = query.where(column == value)
        if alarm is not None:
            query = query.where(c.alarm == alarm)
        if since is not None:
            query = query.where(c.ran_at >= since)
        if until is not None:
            query = query.where(c.ran_at < until)
        query = query.order_by(c.ran_at.desc(), c.id.desc()).limit(limit)
        with self._connect() as conn:
            return [_run_record(row) for row in conn.execute(query)]

    def alarming_ranges(self, tenant: str, app: str, model_key: str) -> list[tuple[datetime, datetime]]:
        """Window ranges of runs that alarmed on this (app, model); they must not feed a reference."""
        c = drift_runs.c
        query = sa.select(c.window_start, c.window_end).where(
            c.tenant == tenant,
            c.app == app,
            c.model_key == model_key,
            c.alarm.is_(True),
            c.window_start.is_not(None),
            c.window_end.is_not(None),
        )
        with self._connect() as conn:
            return [(start, end) for start, end in conn.execute(query)]

    # -- regeneration monitor state --------------------------------------------

    def save_monitor_states(self, states: dict[tuple[str, str, str], dict[str, Any]]) -> None:
        now = datetime.now(UTC)
        m = drift_monitor_state.c
        with self._connect(write=True) as conn:
            for (tenant, app, intent), state in states.items():
                conn.execute(
                    sa.delete(drift_monitor_state).where(m.tenant == tenant, m.app == app, m.intent == intent)
                )
                conn.execute(
                    sa.insert(drift_monitor_state).values(
                        tenant=tenant,
                        app=app,
                        intent=intent,
                        state=json.dumps(state, default=str),
                        updated_at=now,
                    )
                )

    def monitor_states(self) -> dict[tuple[str, str, str], dict[str, Any]]:
        with self._connect() as conn:
            return {
                (row.tenant, row.app, row.intent): json.loads(row.state)
                for row in conn.execute(sa.select(drift_monitor_state))
            }
