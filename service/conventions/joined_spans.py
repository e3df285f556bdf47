"""The spans of one trace as `semconv.build_trace` reads them.

`with_log_events` adds the events that arrived as log records to their spans, `ancestors_of` is a
span's parent chain, and `revision_of` counts the distinct spans and events a trace is built from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from operator import attrgetter

from service.conventions.attributes import GenAIAttributes
from service.conventions.spans import LogEvent, Span, SpanEvent

__all__ = ["ancestors_of", "revision_of", "with_log_events"]


def ancestors_of(span: Span, by_id: dict[str, Span]) -> list[Span]:
    """The parent chain of `span`, nearest first; stops at a missing parent or a cycle."""
    seen = {span.span_id}
    chain: list[Span] = []
    parent = by_id.get(span.parent_span_id or "")
    while parent is not None and parent.span_id not in seen:
        seen.add(parent.span_id)
        chain.append(parent)
        parent = by_id.get(parent.parent_span_id or "")
    return chain


def revision_of(items: Sequence[Span | LogEvent]) -> int:
    """How many distinct spans (by span id) and events (by span, name and time) a trace is built
    from: a later version of the trace with more of them replaces the stored one."""
    spans = {item.span_id for item in items if isinstance(item, Span)}
    events = {(item.span_id, item.name, item.time_ns) for item in items if isinstance(item, LogEvent)}
    return len(spans) + len(events)


def with_log_events(spans: Sequence[Span | LogEvent]) -> list[Span]:
    """The spans with each `LogEvent` added to its span's events (by span id, in time order).

    A redelivered record (same span, name and time) is added once. Events
    whose span never arrived are kept on a span of their own (the span was
    dropped, or sampled out), a child of the root when there is one, so their
    content is not lost. The spans given are not changed: copies carry the
    events, so building the same spans twice gives the same trace.
    """
    events = [item for item in spans if isinstance(item, LogEvent)]
    plain = [item for item in spans if isinstance(item, Span)]
    if not events:
        return plain
    by_span: dict[str, list[SpanEvent]] = {}
    seen: set[tuple[str, str, int]] = set()
    carriers: dict[str, LogEvent] = {}
    for event in sorted(events, key=attrgetter("time_ns", "name")):
        key = (event.span_id, event.name, event.time_ns)
        if key in seen:
            continue
        seen.add(key)
        by_span.setdefault(event.span_id, []).append(event.as_span_event())
        carriers.setdefault(event.span_id, event)
    joined = [
        dataclasses.replace(span, events=[*span.events, *by_span[span.span_id]])
        if span.span_id in by_span
        else span
        for span in plain
    ]
    known = {span.span_id for span in plain}
    # what these events describe is a model call: its span is an LLM span, even if it never came
    root = next((span for span in plain if span.is_root), None)
    for span_id, first in carriers.items():
        if span_id in known:
            continue
        times = [e.time_ns for e in by_span[span_id]]
        joined.append(
            Span(
                trace_id=first.trace_id,
                span_id=span_id,
                parent_span_id=root.span_id if root is not None else None,
                name=first.name,
                start_ns=min(times),
                end_ns=max(times),
                attributes={GenAIAttributes.OPERATION_NAME: "chat"},
                events=by_span[span_id],
                resource=first.resource,
                tenant=first.tenant,
            )
        )
    return joined
