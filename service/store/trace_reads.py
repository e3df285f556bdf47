"""`TraceReads`: what `Store` reads back: traces, their feedback, dead letters.

One trace in full (`get_trace`); a page, or the count, of a tenant's traces (`list_traces`,
`count_traces`: their filters and page cursor are trace_query.py's); the labels and the
partial ones among stored traces; feedback events by trace or by event id, and those still
waiting in the fan-out outbox for their trace; a page of a tenant's dead letters. Every read
filters by the tenant it is given (batch reads by (tenant, id) keys) and runs on a connection
with the store's error translation (`StoreBase._read`, store_base.py). `Store`
(trace_store.py) derives from this class and writes what it reads.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, Unpack

import sqlalchemy as sa

from service.errors import InvalidInput
from service.model import Feedback, RagTrace
from service.store.keys import keys_by_group, keys_in
from service.store.rows import dead_letter_record, rag_trace_from_record, storable_text, to_utc, trace_record
from service.store.store_base import StoreBase
from service.store.tables import dead_letters, fanout_outbox, feedback, trace_contexts, traces
from service.store.trace_query import (
    MAX_PAGE_SIZE,
    TraceFilters,
    decode_cursor,
    encode_cursor,
    regenerate_feedback,
    trace_conditions,
)

__all__ = ["TraceReads"]


def _feedback_of(row: Any) -> Feedback:
    return Feedback(
        event_id=row["event_id"],
        trace_id=row["trace_id"],
        tenant=row["tenant"],
        app=row["app"],
        kind=row["kind"],
        reason=row["reason"],
        text=row["text"],
        time=to_utc(row["time"]),
    )


# compiled once (see `keys_by_group`)
_FEEDBACK_OF_TRACES = (
    sa.select(feedback)
    .where(
        feedback.c.tenant == sa.bindparam("for_tenant"),
        feedback.c.trace_id.in_(sa.bindparam("keys", expanding=True)),
    )
    .order_by(feedback.c.time, feedback.c.event_id)
)


# a trace's row with its `trace_contexts` payload (NULL where none), in one statement
_WITH_CONTEXT = sa.select(traces, trace_contexts.c.context).select_from(
    traces.outerjoin(
        trace_contexts,
        sa.and_(trace_contexts.c.tenant == traces.c.tenant, trace_contexts.c.trace_id == traces.c.trace_id),
    )
)


class TraceReads(StoreBase):
    """The reads of `Store`; each filters by tenant and raises `StoreUnavailable` when the
    database cannot answer."""

    def stored_partial(self, keys: Iterable[tuple[str, str]]) -> list[RagTrace]:
        """The stored traces among `keys` that are partial (no root span), as records."""
        found: list[RagTrace] = []
        with self._read("read partial traces") as conn:
            for tenant, ids in keys_by_group((storable_text(t), i) for t, i in keys):
                rows = conn.execute(
                    _WITH_CONTEXT.where(
                        traces.c.tenant == tenant, traces.c.trace_id.in_(ids), traces.c.partial == sa.true()
                    )
                ).mappings()
                for row in rows:
                    found.append(rag_trace_from_record(trace_record(row, context=row["context"] or {})))
        return found

    def waiting_feedback(self, keys: Iterable[tuple[str, str]]) -> list[Feedback]:
        """Feedback events about these traces ((tenant, trace_id)) whose fan-out is still to come:
        they arrived before their trace and wait in the outbox for it."""
        events: list[Feedback] = []
        with self._read("read waiting feedback") as conn:
            for tenant, ids in keys_by_group((storable_text(t), i) for t, i in keys):
                rows = conn.execute(
                    sa.select(feedback)
                    .join(
                        fanout_outbox,
                        sa.and_(
                            fanout_outbox.c.tenant == feedback.c.tenant,
                            fanout_outbox.c.kind == "feedback",
                            fanout_outbox.c.record_id == feedback.c.event_id,
                        ),
                    )
                    .where(feedback.c.tenant == tenant, feedback.c.trace_id.in_(ids))
                ).mappings()
                events += [_feedback_of(row) for row in rows]
        return events

    def feedback_events(self, keys: Iterable[tuple[str, str]]) -> list[Feedback]:
        """Stored feedback events by (tenant, event id), as records."""
        events: list[Feedback] = []
        with self._read("read feedback") as conn:
            for tenant, ids in keys_by_group((storable_text(t), i) for t, i in keys):
                rows = conn.execute(
                    sa.select(feedback).where(feedback.c.tenant == tenant, feedback.c.event_id.in_(ids))
                ).mappings()
                events += [_feedback_of(row) for row in rows]
        return events

    def list_dead_letters(
        self,
        tenant: str,
        *,
        limit: int = 50,
        cursor: str | None = None,
        kind: Literal["trace", "feedback"] | None = None,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of a tenant's dead letters, newest first, and the cursor of the next page (None on
        the last). A malformed cursor raises `InvalidInput`; a limit outside 1..`MAX_PAGE_SIZE`,
        `ValueError`."""
        if not 1 <= limit <= MAX_PAGE_SIZE:
            raise ValueError(f"limit must be within 1..{MAX_PAGE_SIZE}, got {limit}")
        where: list[sa.ColumnElement[bool]] = [dead_letters.c.tenant == tenant]
        if kind is not None:
            where.append(dead_letters.c.kind == kind)
        if cursor is not None:
            if not cursor.isdigit() or len(cursor) > 19:
                raise InvalidInput(f"malformed page cursor: {cursor[:64]!r}")
            where.append(dead_letters.c.id < int(cursor))
        query = sa.select(dead_letters).where(*where).order_by(dead_letters.c.id.desc()).limit(limit + 1)
        with self._read("list dead letters") as conn:
            rows = conn.execute(query).mappings().all()
        page = rows[:limit]
        next_cursor = str(page[-1]["id"]) if len(rows) > limit else None
        return [dead_letter_record(r) for r in page], next_cursor

    def get_trace(self, tenant: str, trace_id: str) -> dict[str, Any] | None:
        """One trace as JSON-ready data (row, `context` and `feedback` oldest first), or None.

        None when the tenant has no such trace, even if feedback for it exists.
        """
        where = (traces.c.tenant == tenant, traces.c.trace_id == trace_id)
        with self._read("get trace") as conn:
            row = conn.execute(_WITH_CONTEXT.where(*where)).mappings().first()
            if row is None:
                return None
            context = row["context"]
            events = (
                conn.execute(
                    sa.select(feedback)
                    .where(feedback.c.tenant == tenant, feedback.c.trace_id == trace_id)
                    .order_by(feedback.c.time, feedback.c.event_id)
                )
                .mappings()
                .all()
            )
        return trace_record(
            row,
            regenerate_feedback=any(e["kind"] == "regenerate" for e in events),
            context=context if context is not None else {},
            feedback=events,
        )

    def trace_revision(self, tenant: str, trace_id: str) -> int | None:
        """The revision of the stored version of a trace (`RagTrace.revision`), or None when the tenant
        has no such trace: one value read in the database, for a caller that only asks whether a
        later version was stored (the judge, after judging: judging.py) and would otherwise parse
        the whole context."""
        c = trace_contexts.c
        query = sa.select(c.context["revision"].as_integer()).where(
            c.tenant == tenant, c.trace_id == trace_id
        )
        with self._read("read a trace's revision") as conn:
            row = conn.execute(query).first()
        if row is None:
            return None
        return int(row[0] or 0)  # a context written before revisions were kept: revision 0

    def feedback_for(self, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], list[Feedback]]:
        """(tenant, trace_id) -> its stored feedback, oldest first; keys without feedback are absent."""
        wanted = list(dict.fromkeys(keys))
        found: dict[tuple[str, str], list[Feedback]] = {}
        if not wanted:
            return found
        with self._read("read feedback") as conn:
            for tenant, trace_ids in keys_by_group(wanted):
                params = {"for_tenant": tenant, "keys": trace_ids}
                rows = conn.execute(_FEEDBACK_OF_TRACES, params).mappings().all()
                for row in rows:
                    found.setdefault((row["tenant"], row["trace_id"]), []).append(_feedback_of(row))
        return found

    def trace_labels(self, keys: Iterable[tuple[str, str]]) -> dict[str, tuple[str, str | None]]:
        """(app, intent) of the stored traces among `keys` ((tenant, trace_id) pairs), by trace id.

        Keys with no stored trace are absent. For labelling feedback metrics
        with the app and intent of the trace the feedback is about.
        """
        wanted = set(keys)
        if not wanted:
            return {}
        query = sa.select(traces.c.trace_id, traces.c.app, traces.c.intent).where(
            keys_in(traces.c.tenant, traces.c.trace_id, wanted)
        )
        with self._read("read trace labels") as conn:
            return {trace_id: (app, intent) for trace_id, app, intent in conn.execute(query)}

    def list_traces(
        self,
        tenant: str,
        *,
        limit: int = 50,
        cursor: str | None = None,
        **filters: Unpack[TraceFilters],
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of a tenant's traces, newest first, and the cursor of the next page.

        Ordered by (start_time, trace_id) descending and paged by keyset, so
        rows with equal start times are neither repeated nor skipped across
        pages. Items are compact records without context or feedback lists.
        The next cursor is None on the last page. A malformed cursor raises
        `InvalidInput`; a limit outside 1..`MAX_PAGE_SIZE`, `ValueError`.
        """
        if not 1 <= limit <= MAX_PAGE_SIZE:
            raise ValueError(f"limit must be within 1..{MAX_PAGE_SIZE}, got {limit}")
        where = trace_conditions(tenant, filters)
        if cursor is not None:
            after_time, after_id = decode_cursor(cursor)
            where.append(
                sa.or_(
                    traces.c.start_time < after_time,
                    sa.and_(traces.c.start_time == after_time, traces.c.trace_id < after_id),
                )
            )
        query = (
            sa.select(traces, regenerate_feedback().label("regenerate_feedback"))
            .where(*where)
            .order_by(traces.c.start_time.desc(), traces.c.trace_id.desc())
            .limit(limit + 1)
        )
        with self._read("list traces") as conn:
            rows = conn.execute(query).mappings().all()
        page = rows[:limit]
        items = [trace_record(r, regenerate_feedback=bool(r["regenerate_feedback"])) for r in page]
        next_cursor = None
        if len(rows) > limit:
            last = page[-1]
            next_cursor = encode_cursor(last["start_time"], last["trace_id"])
        return items, next_cursor

    def count_traces(self, tenant: str, **filters: Unpack[TraceFilters]) -> int:
        """How many of a tenant's traces match the filters (the same ones as `list_traces`)."""
        query = sa.select(sa.func.count()).select_from(traces).where(*trace_conditions(tenant, filters))
        with self._read("count traces") as conn:
            return int(conn.execute(query).scalar_one())
