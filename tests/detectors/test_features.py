from __future__ import annotations

from datetime import UTC, datetime

import pytest

from detectors.features import (
    empty_retrieval,
    query_model_key,
    query_text,
    query_vector,
    top1_score,
    top_hit,
    topk_mean_score,
)
from service.model import Chunk, QueryEmbedding, RagTrace, Retrieval, Timings

T = datetime(2024, 1, 1, tzinfo=UTC)


def _trace(**fields: object) -> RagTrace:
    return RagTrace(trace_id="0" * 32, start_time=T, **fields)  # type: ignore[arg-type]


def test_query_features() -> None:
    trace = _trace(query="  where is my card ", query_embedding=QueryEmbedding(model="m", vector=(0.1, 0.2)))
    assert query_text(trace) == "where is my card"
    assert query_vector(trace) == (0.1, 0.2)
    assert query_model_key(trace) == "m@2"
    assert query_text(_trace(query="   ")) is None
    assert query_model_key(_trace()) is None


def test_retrieval_features() -> None:
    chunks = (
        Chunk(id="a", rank=0, score=0.9, metadata={"collection": "faq"}),
        Chunk(id="b", rank=1, score=0.7),
        Chunk(id="c", rank=2),
    )
    trace = _trace(retrieval=Retrieval(chunks=chunks))
    assert top1_score(trace) == 0.9
    assert topk_mean_score(trace, k=3) == pytest.approx(0.8)
    assert top_hit(trace) == "a"
    assert top_hit(trace, by="collection") == "faq"
    assert empty_retrieval(trace) is False
    with pytest.raises(ValueError):
        topk_mean_score(trace, k=0)


def test_empty_retrieval_needs_evidence_that_retrieval_ran() -> None:
    assert empty_retrieval(_trace()) is None
    assert empty_retrieval(_trace(retrieval=Retrieval(retriever="bm25"))) is True
    assert empty_retrieval(_trace(timings=Timings(retrieval_s=0.01))) is True
    assert top1_score(_trace()) is None
