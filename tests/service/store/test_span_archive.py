"""Tests of service/store/span_archive.py with the OTLP codec (service/ingest/span_codec.py), on SQLite and
PostgreSQL: what flushes keep of a trace, merged idempotently and in nested sets even when two merges of
one trace race, closed after the late window."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from service.conventions.spans import AnySpan, LogEvent, WireSpan
from service.ingest import otlp_logs, otlp_protobuf
from service.ingest.span_codec import OtlpSpanCodec
from service.store.span_archive import SpanArchive
from service.store.trace_store import Store
from tests.rag_spans import RagRequest, body


class WallClock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 5, 12, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def spans(*pb: object, tenant: str = "t1") -> list[WireSpan]:
    return list(otlp_protobuf.screen_protobuf(body(*pb), tenant).spans)  # type: ignore[arg-type]


def events(request: RagRequest, tenant: str = "t1") -> list[LogEvent]:
    return list(otlp_logs.decode_protobuf(request.choice_body(), tenant).log_events)


def names(items: Sequence[AnySpan] | None) -> list[int]:
    """The items' identities, comparable (hashes of them, within this process)."""
    codec = OtlpSpanCodec()
    return sorted(hash(codec.identity(i)) for i in items or ())


def test_flushes_of_a_trace_are_merged_once_each_and_events_are_kept_with_spans(store: Store) -> None:
    clock = WallClock()
    archive = SpanArchive(store, OtlpSpanCodec(), late_window_s=600, clock=clock)
    request = RagRequest(duration_s=200, genai=True)
    retrieve, generate, root = spans(request.retrieve), spans(request.generate), spans(request.root)
    [first] = archive.merge([retrieve])
    assert (first.first, first.late, first.duplicates, first.too_late) == (True, 0, 0, False)
    assert len(first.items) == 1
    clock.now += timedelta(seconds=200)
    # the late part, with the retrieval span again (a retry) and the answer as a log event
    [second] = archive.merge([[*generate, *root, *retrieve, *events(request)]])
    assert (second.first, second.late, second.duplicates, second.too_late) == (False, 3, 1, False)
    assert names(second.items) == names([*retrieve, *generate, *root, *events(request)])
    assert any(isinstance(i, LogEvent) for i in second.items)
    [third] = archive.merge([[*generate, *generate]])  # a redelivery adds nothing
    assert (third.late, third.duplicates) == (0, 2) and names(third.items) == names(second.items)
    assert names(archive.kept("t1", request.trace_id)) == names(second.items)


def test_two_merges_of_one_trace_racing_keep_both_and_return_nested_sets(store: Store) -> None:
    archive = SpanArchive(store, OtlpSpanCodec(), late_window_s=600)
    request = RagRequest(duration_s=30)
    parts = [spans(request.retrieve, request.step(n, 1)) for n in range(1, 7)]
    results: list[list[AnySpan]] = []
    start = threading.Barrier(len(parts))

    def merge(part: list[WireSpan]) -> None:
        start.wait()
        [merged] = archive.merge([part])
        results.append(list(merged.items))

    threads = [threading.Thread(target=merge, args=(p,)) for p in parts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    sizes = sorted(results, key=len)
    # each merge returns what was kept at its commit: a chain of nested sets, the last one whole
    for smaller, larger in itertools.pairwise(sizes):
        assert set(names(smaller)) <= set(names(larger))
    whole = names([s for part in parts for s in part])
    assert sorted(set(whole)) == names(sizes[-1]) == names(archive.kept("t1", request.trace_id))


def test_after_the_late_window_new_spans_are_too_late_and_expiry_clears_once(store: Store) -> None:
    clock = WallClock()
    archive = SpanArchive(store, OtlpSpanCodec(), late_window_s=600, clock=clock)
    early, other = RagRequest(duration_s=5), RagRequest(duration_s=5)
    archive.merge([spans(early.retrieve), spans(other.retrieve, tenant="t2")])
    clock.now += timedelta(seconds=601)
    [late] = archive.merge([spans(early.root)])
    assert (late.too_late, late.items, late.late) == (True, (), 0)
    assert sorted(archive.expire()) == sorted([("t1", early.trace_id), ("t2", other.trace_id)])
    assert archive.expire() == []  # each trace is claimed by one expiry
    assert archive.kept("t1", early.trace_id) is None
    [tombstoned] = archive.merge([spans(early.generate)])
    assert tombstoned.too_late
    # a tenant's trace id is its own: the same id in another tenant starts afresh
    [fresh] = archive.merge([spans(early.root, tenant="t3")])
    assert fresh.first and len(fresh.items) == 1
