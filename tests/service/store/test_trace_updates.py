"""Tests of a stored trace replaced by a fuller version (service/store/trace_updates.py, `Store.store_traces`)
on SQLite and PostgreSQL: the higher revision wins whatever the arrival order, idempotently, the row and
context are replaced, flags set from outside stay, and the fan-out state says what was counted."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime

from service.corrections import Counted, TraceUpdate
from service.model import Feedback, ModelUsage, RagTrace, Timings
from service.store.store_sink import StoreSink
from service.store.trace_store import Store

TRACE = "ab" * 16
STARTED = datetime(2026, 1, 5, 12, tzinfo=UTC)


def version(revision: int, **fields: object) -> RagTrace:
    values: dict[str, object] = {
        "trace_id": TRACE,
        "tenant": "t1",
        "app": "shop",
        "start_time": STARTED,
        "query": "how long do refunds take?",
        "partial": True,
        "span_count": revision,
        "revision": revision,
        "timings": Timings(total_s=0.2, retrieval_s=0.2),
    }
    values.update(fields)
    return RagTrace.model_validate(values)


WHOLE = version(
    3,
    partial=False,
    answer="five days",
    usage=(
        ModelUsage(
            model="gpt-4o-mini", input_tokens=1000, output_tokens=200, cost_usd=0.01, cost_source="app"
        ),
    ),
    timings=Timings(total_s=180.0, retrieval_s=0.2, generation_s=179.0),
)


def test_a_higher_revision_replaces_the_stored_trace_whatever_the_order(store: Store) -> None:
    assert store.store_traces([version(1)]).new == [TRACE]
    created = store.get_trace("t1", TRACE)["created_at"]  # type: ignore[index]
    result = store.store_traces([WHOLE])
    assert (result.new, result.updated) == ([], [("t1", TRACE)])
    record = store.get_trace("t1", TRACE)
    assert record is not None
    assert (record["answer"], record["span_count"], record["flags"]["partial"]) == ("five days", 3, False)
    assert (record["input_tokens"], record["output_tokens"], record["cost_usd"]) == (1000, 200, 0.01)
    assert record["timings"]["total_s"] == 180.0 and record["context"]["revision"] == 3
    assert record["created_at"] == created  # first stored then
    # an older version arriving last, or the same one again, changes nothing
    for stale in (version(1), version(2), WHOLE):
        assert store.store_traces([stale]).updated == []
    assert store.get_trace("t1", TRACE)["answer"] == "five days"  # type: ignore[index]
    # two versions in one batch: the higher one
    other = "cd" * 16
    result = store.store_traces([version(2, trace_id=other), version(5, trace_id=other, answer="x")])
    assert result.new == [other] and store.get_trace("t1", other)["answer"] == "x"  # type: ignore[index]


def test_a_regeneration_flag_set_by_feedback_stays_on_the_new_version(store: Store) -> None:
    store.store_traces([version(1)])
    regenerate = Feedback(event_id="e1", trace_id=TRACE, tenant="t1", kind="regenerate", time=STARTED)
    store.insert_feedback([regenerate])
    store.store_traces([WHOLE])
    flags = store.get_trace("t1", TRACE)["flags"]  # type: ignore[index]
    assert (flags["is_regeneration"], flags["regeneration_source"]) == (True, "feedback")


def test_json_api_traces_are_never_replaced(store: Store) -> None:
    json_trace = version(0, source="json", answer="a")
    store.store_traces([json_trace])
    assert store.store_traces([json_trace.model_copy(update={"answer": "b"})]).updated == []


class Recorder:
    def __init__(self) -> None:
        self.traces: list[RagTrace] = []
        self.updates: list[TraceUpdate] = []

    async def consume_traces(self, batch: Sequence[RagTrace]) -> None:
        self.traces.extend(batch)

    async def consume_feedback(self, batch: Sequence[Feedback]) -> None:
        pass

    async def consume_updates(self, batch: Sequence[TraceUpdate]) -> None:
        self.updates.extend(batch)


def test_the_sink_fans_out_an_update_once_with_what_was_counted_before(store: Store) -> None:
    downstream = Recorder()
    sink = StoreSink(store, new_traces=downstream, new_feedback=downstream, updated_traces=downstream)

    async def scenario() -> None:
        await sink.consume_traces([version(1)])
        await sink.consume_traces([version(2)])
        await sink.consume_traces([version(2)])  # a redelivery: no second update
        await sink.consume_traces([WHOLE])

    asyncio.run(scenario())
    assert [t.revision for t in downstream.traces] == [1]
    assert [(u.before.revision, u.trace.revision) for u in downstream.updates] == [(1, 2), (2, 3)]
    assert downstream.updates[0].before == Counted.of(version(1))
    assert store.fanout_state([("t1", TRACE)])[("t1", TRACE)].update_queued_at is None
    assert store.outboxed("trace", [("t1", TRACE)]) == set()


def test_an_update_stored_before_the_first_fan_out_finished_counts_from_what_it_counted(store: Store) -> None:
    store.store_traces([version(1)], outbox=True)  # stored; its fan-out has not run
    store.store_traces([WHOLE], outbox=True)
    state = store.fanout_state([("t1", TRACE)])[("t1", TRACE)]
    assert state.new_pending and state.update_queued_at is not None and state.counted is None
    store.finish_new([version(1)])  # the first fan-out counted version 1, and says so
    state = store.fanout_state([("t1", TRACE)])[("t1", TRACE)]
    assert not state.new_pending and state.counted == Counted.of(version(1))
    # a newer update while this one's fan-out runs keeps its row
    queued = state.update_queued_at
    assert queued is not None
    store.store_traces([version(4, answer="later")], outbox=True)
    store.finish_updates([(("t1", TRACE), queued, Counted.of(WHOLE, Counted.of(version(1))).to_json())])
    state = store.fanout_state([("t1", TRACE)])[("t1", TRACE)]
    assert state.update_queued_at is not None and state.counted is not None and state.counted.revision == 3


def test_trace_revision_reads_the_stored_versions_revision_alone(store: Store) -> None:
    assert store.trace_revision("t1", TRACE) is None
    store.store_traces([version(1)])
    assert store.trace_revision("t1", TRACE) == 1
    store.store_traces([WHOLE])
    assert store.trace_revision("t1", TRACE) == 3
    store.store_traces([version(2)])  # older: the stored version stays
    assert store.trace_revision("t1", TRACE) == 3
    assert store.trace_revision("t2", TRACE) is None  # another tenant has no such trace
    # it agrees with the whole record's revision, which a caller would otherwise parse for it
    assert store.get_trace("t1", TRACE)["context"]["revision"] == 3  # type: ignore[index]
