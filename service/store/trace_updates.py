"""A stored trace replaced by a fuller version of it, and the state of its fan-out after the store.

A trace flushed early is completed when its late spans arrive (service/assemble.py,
span_archive.py): the version built then has a higher `RagTrace.revision`
than the stored one (kept in its context) and replaces the row and context,
in the transaction of `Store.store_traces`; a version with a revision not
higher (a redelivery, or an older version that arrived last) changes
nothing. That is idempotent and independent of arrival order, on SQLite
and on PostgreSQL (the stored row is locked `FOR UPDATE` while it is
compared).

What the sinks after the store already counted for the trace is its
baseline (`service.corrections.Counted`, table `trace_counted`); an update
writes a `fanout_outbox` row of kind `update` in the same transaction, and
the fan-out of the update hands the sinks the version with that baseline,
then records what is counted now and deletes the row (`finish_updates`).
The baseline is written by the first update of a trace, from the row it
replaces, when that row's own fan-out is done; when it is not (the trace
was stored a moment before), the trace's first fan-out writes it as it
finishes (`finish_new`). The outbox rows are read `FOR UPDATE` for that, so
the two cannot miss each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from service.corrections import Counted
from service.model import RagTrace
from service.store.rows import rag_trace_from_record, storable_text, trace_context, trace_record, trace_row
from service.store.tables import fanout_outbox, trace_contexts, trace_counted, traces

__all__ = ["FanoutState", "finish_new", "finish_updates", "pending_fanouts", "replace_stored"]

TraceKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class FanoutState:
    """Where a stored trace's fan-out stands: its first one pending, an update pending (the time
    its outbox row was written), and what was counted for it."""

    new_pending: bool
    update_queued_at: datetime | None
    counted: Counted | None


def _by_tenant(keys: Iterable[TraceKey]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for tenant, trace_id in sorted(set(keys)):
        grouped.setdefault(tenant, []).append(trace_id)
    return grouped


def pending_fanouts(
    conn: Connection, keys: Iterable[TraceKey], *, lock: bool = False
) -> dict[TraceKey, dict[str, datetime]]:
    """(tenant, trace_id) -> {outbox kind ("trace", "update"): queued_at} of the rows pending."""
    o = fanout_outbox.c
    found: dict[TraceKey, dict[str, datetime]] = {}
    for tenant, ids in _by_tenant(keys).items():
        query = sa.select(o.record_id, o.kind, o.queued_at).where(
            o.tenant == tenant, o.kind.in_(("trace", "update")), o.record_id.in_(ids)
        )
        if lock:
            query = query.with_for_update()
        for record_id, kind, queued_at in conn.execute(query):
            found.setdefault((tenant, record_id), {})[kind] = queued_at
    return found


def counted_of(conn: Connection, keys: Iterable[TraceKey]) -> dict[TraceKey, Counted]:
    c = trace_counted.c
    found: dict[TraceKey, Counted] = {}
    for tenant, ids in _by_tenant(keys).items():
        for trace_id, text in conn.execute(
            sa.select(c.trace_id, c.counted).where(c.tenant == tenant, c.trace_id.in_(ids))
        ):
            found[(tenant, trace_id)] = Counted.from_json(text)
    return found


def write_counted(conn: Connection, dialect: Any, counted: Mapping[TraceKey, str], now: datetime) -> None:
    """Upsert the `trace_counted` rows of `counted` ((tenant, trace_id) -> `Counted` JSON)."""
    if not counted:
        return
    rows = [
        {"tenant": t, "trace_id": i, "counted": text, "updated_at": now}
        for (t, i), text in sorted(counted.items())
    ]
    insert = dialect.insert(trace_counted)
    conn.execute(
        insert.on_conflict_do_update(
            index_elements=["tenant", "trace_id"],
            set_={"counted": insert.excluded.counted, "updated_at": insert.excluded.updated_at},
        ),
        rows,
    )


def replace_stored(
    conn: Connection,
    dialect: Any,
    versions: Mapping[TraceKey, RagTrace],
    now: datetime,
    *,
    outbox: bool,
) -> list[TraceKey]:
    """Replace the stored traces of `versions` whose revision is higher than the stored one; returns
    their keys. With `outbox`, each gets an `update` outbox row (and its baseline, see the module
    docstring)."""
    t, x = traces.c, trace_contexts.c
    stored: dict[TraceKey, tuple[Any, dict[str, Any]]] = {}
    for tenant, ids in _by_tenant(versions).items():
        rows = conn.execute(
            sa.select(traces, x.context)
            .select_from(
                traces.outerjoin(trace_contexts, sa.and_(x.tenant == t.tenant, x.trace_id == t.trace_id))
            )
            .where(t.tenant == tenant, t.trace_id.in_(ids))
            .order_by(t.trace_id)
            .with_for_update(of=traces)
        ).mappings()
        for row in rows:
            stored[(row["tenant"], row["trace_id"])] = (row, dict(row["context"] or {}))
    replaced = [
        key
        for key, (row, context) in sorted(stored.items())
        if versions[key].revision > int(context.get("revision") or 0)
    ]
    if not replaced:
        return []
    if outbox:
        pending = pending_fanouts(conn, replaced, lock=True)
        known = counted_of(conn, replaced)
        baselines: dict[TraceKey, str] = {}
        for key in replaced:
            if key in known or pending.get(key):
                continue  # counted already, or the pending fan-out will say what it counted
            row, context = stored[key]
            old = rag_trace_from_record(trace_record(row, context=context))
            baselines[key] = Counted.of(old).to_json()
        write_counted(conn, dialect, baselines, now)
    for key in replaced:
        row, _ = stored[key]
        version = versions[key]
        values = trace_row(version, created_at=row["created_at"])
        if not version.is_regeneration and row["is_regeneration"]:
            # a flag the feedback or the re-ask detection set stays: the new version knows nothing of it
            values["is_regeneration"] = True
            values["regeneration_source"] = row["regeneration_source"]
        del values["tenant"], values["trace_id"]
        where = (t.tenant == key[0], t.trace_id == key[1])
        conn.execute(sa.update(traces).where(*where).values(**values))
        context_where = (x.tenant == key[0], x.trace_id == key[1])
        done = conn.execute(
            sa.update(trace_contexts).where(*context_where).values(context=trace_context(version))
        )
        if not done.rowcount:
            conn.execute(
                sa.insert(trace_contexts).values(
                    tenant=key[0], trace_id=key[1], context=trace_context(version)
                )
            )
    if outbox:
        insert = dialect.insert(fanout_outbox)
        conn.execute(
            insert.on_conflict_do_update(
                index_elements=["tenant", "kind", "record_id"],
                set_={"created_at": insert.excluded.created_at, "queued_at": insert.excluded.queued_at},
            ),
            [
                {"tenant": k[0], "kind": "update", "record_id": k[1], "created_at": now, "queued_at": now}
                for k in replaced
            ],
        )
    return replaced


def fanout_state(conn: Connection, keys: Iterable[TraceKey]) -> dict[TraceKey, FanoutState]:
    wanted = [(storable_text(t), i) for t, i in keys]
    pending = pending_fanouts(conn, wanted)
    counted = counted_of(conn, wanted)
    return {
        key: FanoutState(
            new_pending="trace" in pending.get(key, {}),
            update_queued_at=pending.get(key, {}).get("update"),
            counted=counted.get(key),
        )
        for key in wanted
    }


def finish_new(conn: Connection, dialect: Any, fanned: Sequence[RagTrace], now: datetime) -> None:
    """The first fan-out of these traces returned: delete their `trace` rows, and where an update
    of one is pending already, record what was counted for it (the update's baseline)."""
    keys = [(storable_text(t.tenant), t.trace_id) for t in fanned]
    pending = pending_fanouts(conn, keys)
    o = fanout_outbox.c
    for tenant, ids in _by_tenant(keys).items():
        conn.execute(
            sa.delete(fanout_outbox).where(o.tenant == tenant, o.kind == "trace", o.record_id.in_(ids))
        )
    write_counted(
        conn,
        dialect,
        {
            (storable_text(t.tenant), t.trace_id): Counted.of(t).to_json()
            for t in fanned
            if "update" in pending.get((storable_text(t.tenant), t.trace_id), {})
        },
        now,
    )


def finish_updates(
    conn: Connection, dialect: Any, done: Sequence[tuple[TraceKey, datetime, str]], now: datetime
) -> None:
    """The fan-out of these updates returned: ((tenant, trace_id), the queued_at of the outbox row it
    took, what is counted now). The row goes unless a newer update rewrote it meanwhile."""
    o = fanout_outbox.c
    for (tenant, trace_id), queued_at, _ in done:
        conn.execute(
            sa.delete(fanout_outbox).where(
                o.tenant == tenant, o.kind == "update", o.record_id == trace_id, o.queued_at == queued_at
            )
        )
    write_counted(conn, dialect, {key: text for key, _, text in done}, now)
