"""How a tenant's stored traces are listed and counted: the filters, and the page cursor.

`Store.list_traces` pages by keyset on (start_time, trace_id), newest first; its
cursor is that pair, opaque to the caller (`encode_cursor`). A trace counts as a
regeneration when its row says so or a `regenerate` feedback event names it
(`regenerate_feedback`): the two may be stored in either order.
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime
from typing import TypedDict

import sqlalchemy as sa

from service.errors import InvalidInput
from service.model import FeedbackKind
from service.store.rows import to_utc
from service.store.tables import feedback, traces

__all__ = [
    "MAX_PAGE_SIZE",
    "TraceFilters",
    "decode_cursor",
    "encode_cursor",
    "regenerate_feedback",
    "trace_conditions",
]

MAX_PAGE_SIZE = 1000
_FEEDBACK_KINDS: frozenset[str] = frozenset({"up", "down", "regenerate"})


class TraceFilters(TypedDict, total=False):
    """Filters shared by `Store.list_traces` and `Store.count_traces`; all are ANDed.

    `since` is inclusive and `until` exclusive, on the trace start time.
    `regeneration` counts regenerate feedback as well as the row flag.
    `has_feedback`: True any feedback, False none, or a feedback kind.
    `probe`: True only golden-set probe traffic, False only real traffic.
    """

    app: str
    release: str
    intent: str
    session_id: str
    since: datetime
    until: datetime
    regeneration: bool
    partial: bool
    has_feedback: bool | FeedbackKind
    probe: bool


def encode_cursor(start_time: datetime, trace_id: str) -> str:
    """The opaque page cursor that resumes a listing after (start_time, trace_id)."""
    raw = json.dumps([to_utc(start_time).isoformat(), trace_id], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The (start_time, trace_id) inside a cursor; raises `InvalidInput` for a malformed one."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        start, trace_id = json.loads(raw)
        if not isinstance(start, str) or not isinstance(trace_id, str):
            raise TypeError("cursor fields are not strings")
        return to_utc(datetime.fromisoformat(start)), trace_id
    except (binascii.Error, UnicodeDecodeError, ValueError, TypeError) as exc:
        raise InvalidInput(f"malformed page cursor: {cursor[:64]!r}") from exc


def regenerate_feedback() -> sa.Exists:
    """EXISTS a `regenerate` feedback event for the current `traces` row."""
    return sa.exists().where(
        feedback.c.tenant == traces.c.tenant,
        feedback.c.trace_id == traces.c.trace_id,
        feedback.c.kind == "regenerate",
    )


def trace_conditions(tenant: str, filters: TraceFilters) -> list[sa.ColumnElement[bool]]:
    """The WHERE conditions of a tenant's traces matching `filters`; TypeError on an unknown filter."""
    unknown = set(filters) - set(TraceFilters.__annotations__)
    if unknown:
        raise TypeError(f"unknown trace filters: {sorted(unknown)}")
    c = traces.c
    where: list[sa.ColumnElement[bool]] = [c.tenant == tenant]
    for name in ("app", "release", "intent", "session_id"):
        if name in filters:
            where.append(c[name] == filters[name])
    if "since" in filters:
        where.append(c.start_time >= filters["since"])
    if "until" in filters:
        where.append(c.start_time < filters["until"])
    if "regeneration" in filters:
        flagged = sa.or_(c.is_regeneration == sa.true(), regenerate_feedback())
        where.append(flagged if filters["regeneration"] else sa.not_(flagged))
    if "partial" in filters:
        where.append(c.partial == filters["partial"])
    if "probe" in filters:
        where.append(c.probe_run_id.is_not(None) if filters["probe"] else c.probe_run_id.is_(None))
    if "has_feedback" in filters:
        wanted = filters["has_feedback"]
        any_feedback = sa.exists().where(feedback.c.tenant == c.tenant, feedback.c.trace_id == c.trace_id)
        if wanted is True:
            where.append(any_feedback)
        elif wanted is False:
            where.append(sa.not_(any_feedback))
        elif wanted in _FEEDBACK_KINDS:
            where.append(any_feedback.where(feedback.c.kind == wanted))
        else:
            raise ValueError(f"has_feedback must be a bool or one of {sorted(_FEEDBACK_KINDS)}")
    return where
