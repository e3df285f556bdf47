"""Built traces across the builder's pipe (`built_traces`): a trace packed, pickled and unpacked is the
trace pickled as before, in every respect: field values and their types, nested records, and each
record's set of given fields."""

from __future__ import annotations

import math
import pickle
from collections import defaultdict
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import BaseModel

from bench.ingest.payload import Batches
from service.conventions.pricing import PriceTable
from service.ingest.built_traces import pack, pack_all, unpack, unpack_all
from service.ingest.pool import _build_groups, _decode_packed
from service.model import Chunk, ModelUsage, QueryEmbedding, RagTrace, Retrieval, Timings

START = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def _shape(value: Any) -> Any:
    """Everything that makes two values the same: types, container kinds, float bits (NaN, -0.0),
    and for a record its class, given fields and field values."""
    if isinstance(value, BaseModel):
        assert value.__pydantic_extra__ is None and value.__pydantic_private__ is None
        return (
            type(value).__qualname__,
            sorted(value.__pydantic_fields_set__),
            {key: _shape(item) for key, item in value.__dict__.items()},
        )
    if isinstance(value, float):
        return ("float", math.copysign(1.0, value), repr(value))
    if isinstance(value, tuple | list):
        return (type(value).__name__, [_shape(item) for item in value])
    if isinstance(value, dict):
        return ("dict", [(key, _shape(item)) for key, item in value.items()])
    if isinstance(value, datetime):
        return ("datetime", value.isoformat(), value.tzinfo)
    return (type(value).__name__, value)


def _bench_traces() -> list[RagTrace]:
    """Traces of the ingest benchmark's payload, screened and built as the server does."""
    body = next(iter(Batches(seed=3, traces_per_request=12).bodies(1)))
    decoded = _decode_packed(body, json_body=False, encoding="", tenant="acme", limit=1 << 26)
    by_trace: dict[str, list[Any]] = defaultdict(list)
    for span in decoded.spans:
        by_trace[span.trace_id].append(span)
    groups = [(spans, n % 3 == 0) for n, spans in enumerate(by_trace.values())]
    built, _ = _build_groups(groups, PriceTable.default())
    assert all(trace is not None for trace in built)
    return [trace for trace in built if trace is not None]


class _MarkedChunk(Chunk):
    """A record type `pack` does not know: it must cross as a record."""


def _odd_traces() -> list[RagTrace]:
    trace_id = "0123456789abcdef0123456789abcdef"
    chunks = (
        Chunk(id="a", rank=0, score=0.5, content="first", metadata={"page": 3, "tags": ["x", None]}),
        Chunk(id="b", rank=1, score=float("nan"), content=None),
        Chunk(id="c", rank=2, score=-0.0, metadata={"nested": {"deep": [1.5, {"k": True}]}}),
        Chunk(id="d", rank=3),
    )
    full = RagTrace(
        trace_id=trace_id,
        tenant="tenant-ü",
        app="shop",
        release="2.1",
        intent="refund",
        session_id="s",
        user_hash="h" * 64,
        start_time=START,
        query="where is my parcel?",
        query_embedding=QueryEmbedding(model=None, vector=(0.1, -0.0, 1e308, 5e-324, float("inf"))),
        retrieval=Retrieval(
            retriever="bm25",
            k=4,
            chunks=chunks,
            filter="lang = 'en'",
            excluded_ids=("z",),
            reranker_input=chunks,
            reranker_output=(chunks[2], chunks[0]),
        ),
        answer="it is on its way",
        cited_chunk_ids=("a", "c"),
        timings=Timings(total_s=1.25, embedding_s=None, retrieval_s=0.0, ttft_s=0.3),
        usage=(
            ModelUsage(
                model="gpt-4o-mini", input_tokens=10, output_tokens=2, cost_usd=0.001, cost_source="app"
            ),
            ModelUsage(model="embed", kind="embedding", input_tokens=None, output_tokens=None),
        ),
        is_regeneration=True,
        regeneration_source="reask",
        probe_run_id="run",
        probe_question_id="q1",
        partial=True,
        span_count=7,
        revision=9,
        kind="other",
    )
    return [
        RagTrace(trace_id=trace_id, start_time=START),  # defaults only: few fields given
        RagTrace(trace_id=trace_id, start_time=datetime(2030, 1, 1, tzinfo=timezone(timedelta(hours=2)))),
        full,
        full.model_copy(update={"answer": "changed"}),  # the given fields grown by a copy
        RagTrace.model_construct(trace_id=trace_id, start_time=START, usage=()),
        RagTrace(
            trace_id=trace_id,
            start_time=START,
            query_embedding=QueryEmbedding(model="m", vector=tuple(float(i) / 7 for i in range(300))),
            retrieval=Retrieval(chunks=(_MarkedChunk(id="m", rank=0),)),
            source="json",
        ),
    ]


@pytest.mark.parametrize("traces", [_bench_traces(), _odd_traces()], ids=["bench", "odd"])
def test_a_packed_trace_crosses_as_the_pickled_trace_did(traces: list[RagTrace]) -> None:
    before = pickle.loads(pickle.dumps(traces, pickle.HIGHEST_PROTOCOL))
    after = unpack_all(pickle.loads(pickle.dumps(pack_all(traces), pickle.HIGHEST_PROTOCOL)))
    assert [_shape(t) for t in after] == [_shape(t) for t in before] == [_shape(t) for t in traces]
    for old, new in zip(before, after, strict=True):
        assert new is not None and old is not None
        assert new.model_dump_json(exclude_unset=True) == old.model_dump_json(exclude_unset=True)
        assert new.model_dump_json() == old.model_dump_json()


def test_none_stays_none_and_the_trace_packed_is_left_as_it_was() -> None:
    traces: list[RagTrace | None] = [None, *_odd_traces(), None]
    shapes = [_shape(t) for t in traces]
    packed = pack_all(traces)
    assert packed[0] is None and packed[-1] is None
    assert [_shape(t) for t in traces] == shapes
    # unpacked without crossing (in the same process): equal, and the originals still untouched
    assert [_shape(t) for t in unpack_all(packed)] == shapes
    assert [_shape(t) for t in traces] == shapes


def test_a_record_type_pack_does_not_know_crosses_as_a_record() -> None:
    trace = _odd_traces()[-1]
    values, _ = pack(trace)
    assert values["retrieval"][0]["chunks"] == trace.retrieval.chunks  # kept as records
    assert type(unpack(pickle.loads(pickle.dumps((values, None)))).retrieval.chunks[0]) is _MarkedChunk
