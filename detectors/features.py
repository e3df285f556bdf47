"""What each drift detector reads from a `RagTrace`: one value per trace, or None when the trace lacks it.

The service's drift windows call these on every trace and keep the values in
reservoirs; detectors never see traces. One value per trace keeps the
observations of a window independent, which every test here assumes.
"""

from __future__ import annotations

from detectors.model_change import embedding_model_key
from service.model import RagTrace

__all__ = [
    "empty_retrieval",
    "query_model_key",
    "query_text",
    "query_vector",
    "top1_score",
    "top_hit",
    "topk_mean_score",
]


def query_text(trace: RagTrace) -> str | None:
    """The query text, stripped; None when absent or blank."""
    if trace.query is None or not trace.query.strip():
        return None
    return trace.query.strip()


def query_vector(trace: RagTrace) -> tuple[float, ...] | None:
    """The app's own query embedding, when the trace carries one."""
    return trace.query_embedding.vector if trace.query_embedding is not None else None


def query_model_key(trace: RagTrace) -> str | None:
    """The embedding-model key ("name@dim") of the app's query vector; None without a vector."""
    embedding = trace.query_embedding
    if embedding is None or embedding.dim == 0:
        return None
    return embedding_model_key(embedding.model, embedding.dim)


def top1_score(trace: RagTrace) -> float | None:
    """The score of the first retrieved chunk; None when nothing was retrieved or it had no score."""
    return trace.retrieval.top1_score


def topk_mean_score(trace: RagTrace, k: int = 5) -> float | None:
    """The mean score of the first `k` retrieved chunks that have scores; None when none has one."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    scores = [chunk.score for chunk in trace.retrieval.chunks[:k] if chunk.score is not None]
    return sum(scores) / len(scores) if scores else None


def empty_retrieval(trace: RagTrace) -> bool | None:
    """True when a retrieval ran and returned nothing; None when the trace shows no retrieval at all."""
    retrieval = trace.retrieval
    ran = (
        retrieval.retriever is not None
        or retrieval.k is not None
        or bool(retrieval.chunks)
        or trace.timings.retrieval_s is not None
    )
    if not ran:
        return None
    return not retrieval.chunks


def top_hit(trace: RagTrace, by: str | None = None) -> str | None:
    """The top hit's category: its document id, or `metadata[by]` (e.g. "collection") when given."""
    if not trace.retrieval.chunks:
        return None
    chunk = trace.retrieval.chunks[0]
    if by is None:
        return chunk.id
    value = (chunk.metadata or {}).get(by)
    return None if value is None else str(value)
