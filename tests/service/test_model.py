"""The records' own behaviour: pickling (they cross process boundaries) keeps them whole and frozen."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime

import pydantic
import pytest

from service.model import Chunk, Feedback, ModelUsage, QueryEmbedding, RagTrace, Retrieval, Timings


def _trace() -> RagTrace:
    return RagTrace(
        trace_id="ab" * 16,
        tenant="acme",
        app="qa",
        start_time=datetime(2026, 11, 30, 12, 0, tzinfo=UTC),
        query="how long is the refund window?",
        query_embedding=QueryEmbedding(model="m", vector=(0.1, -0.2, 0.3)),
        retrieval=Retrieval(
            retriever="bm25",
            chunks=(
                Chunk(id="d1", rank=0, score=0.9, content="thirty days", metadata={"page": 3, "tags": ["a"]}),
                Chunk(id="d2", rank=1),
            ),
        ),
        answer="Thirty days.",
        timings=Timings(total_s=1.2, retrieval_s=0.1),
        usage=(
            ModelUsage(
                model="gpt-4o-mini", input_tokens=100, output_tokens=7, cost_usd=1e-5, cost_source="app"
            ),
        ),
    )


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_a_pickled_trace_comes_back_equal_typed_and_frozen(protocol: int) -> None:
    trace = _trace()
    back = pickle.loads(pickle.dumps(trace, protocol))
    assert back == trace
    assert back.model_dump() == trace.model_dump()
    # which fields were set explicitly survives (exclude_unset output depends on it)
    assert back.model_fields_set == trace.model_fields_set
    assert back.model_dump_json(exclude_unset=True) == trace.model_dump_json(exclude_unset=True)
    assert type(back.retrieval.chunks[0]) is Chunk and type(back.query_embedding) is QueryEmbedding
    assert back.cost_usd == trace.cost_usd and back.retrieval.top1_score == 0.9
    with pytest.raises(pydantic.ValidationError):
        back.app = "changed"  # type: ignore[misc]
    assert back.model_copy(update={"app": "other"}).app == "other"


def test_feedback_pickles_too() -> None:
    event = Feedback(event_id="e1", trace_id="cd" * 16, kind="down", reason="wrong", time=datetime.now(UTC))
    assert pickle.loads(pickle.dumps(event)) == event


def test_a_query_vector_comes_back_as_the_same_exact_floats() -> None:
    # pickled as one block of doubles: every bit of every float survives, and it is a tuple again
    vector = (0.1, -0.0, 1e-310, 1.7976931348623157e308, -2.5, 3.0000000000000004)
    embedding = QueryEmbedding.model_construct(model=None, vector=vector)
    back = pickle.loads(pickle.dumps(embedding, pickle.HIGHEST_PROTOCOL))
    assert type(back.vector) is tuple and all(type(x) is float for x in back.vector)
    assert [x.hex() for x in back.vector] == [x.hex() for x in vector]
    assert back.model is None and back.model_fields_set == embedding.model_fields_set == {"model", "vector"}
    # a model left unset stays unset
    assert pickle.loads(pickle.dumps(QueryEmbedding(vector=(1.0,)))).model_fields_set == {"vector"}


def test_records_with_every_field_given_share_no_state_that_changes() -> None:
    # Unpickled records whose fields were all given share one set of given fields; a copy with
    # changes (the one pydantic path that adds to that set) must not reach the others.
    full = Timings(total_s=1.0, embedding_s=0.1, retrieval_s=0.2, rerank_s=0.0, generation_s=0.5, ttft_s=0.3)
    assert full.model_fields_set == set(Timings.model_fields)
    a, b = pickle.loads(pickle.dumps([full, full.model_copy()], pickle.HIGHEST_PROTOCOL))
    changed = a.model_copy(update={"total_s": 2.0})
    assert changed.total_s == 2.0 and a.total_s == b.total_s == 1.0
    assert a.model_fields_set == b.model_fields_set == set(Timings.model_fields)
    partial = pickle.loads(pickle.dumps(Timings(total_s=1.0)))
    assert partial.model_fields_set == {"total_s"}
    assert partial.model_dump(exclude_unset=True) == {"total_s": 1.0}
    assert pickle.loads(pickle.dumps(partial.model_copy(update={"ttft_s": 0.1}))).model_fields_set == {
        "total_s",
        "ttft_s",
    }
    assert Timings.model_fields.keys() == a.model_fields_set  # the shared set itself is untouched
