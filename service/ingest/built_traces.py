"""Built traces across the builder's pipe: a `RagTrace` as plain values, and back.

A builder process (service/ingest/pool.py) answers with the traces it built,
and the server unpickles them: ~10 records a trace (the trace, its retrieval,
five chunks, timings, usage, the query vector), each pickled through its own
`__reduce__` (service/model.py) and rebuilt by a Python call per record. That
crossing was the largest single cost of moving a trace between processes
(bench/RESULTS.md, "Session 25"). `pack` turns a trace into its field values
(dicts, tuples, the vector as one block of doubles), which pickle walks in C;
`unpack` makes the records from them without validation, as unpickling did:
the same field values, the same set of given fields (`__pydantic_fields_set__`),
so the server sees records equal in every respect to those the builder made
(tests/service/ingest/test_built_traces.py holds the two to each other).

A field `pack` does not know (a record type added to `RagTrace` later) stays a
record and is pickled as before: slower, never wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from service.model import (
    Chunk,
    ModelUsage,
    QueryEmbedding,
    RagTrace,
    Retrieval,
    Timings,
    vector_bytes,
    vector_from_bytes,
)

__all__ = ["PackedTrace", "pack", "pack_all", "unpack", "unpack_all"]

# (the trace's field values, its given fields: None when every field was given)
PackedTrace = tuple[dict[str, Any], set[str] | None]

_CHUNK_FIELDS = ("chunks", "reranker_input", "reranker_output")
_EVERY: dict[type[Any], frozenset[str]] = {
    cls: frozenset(cls.model_fields)
    for cls in (RagTrace, Retrieval, Chunk, Timings, ModelUsage, QueryEmbedding)
}
# One shared set per class for records whose every field was given, as unpickling shares it
# (service/model.py: frozen records never change theirs).
_SHARED: dict[type[Any], set[str]] = {cls: set(fields) for cls, fields in _EVERY.items()}
_new = object.__new__
_set = object.__setattr__


def _given(record: Any) -> set[str] | None:
    given: set[str] = record.__pydantic_fields_set__
    return None if len(given) == len(_EVERY[type(record)]) else given


def _packed(record: Any, cls: type[Any]) -> Any:
    """`record`'s values as they cross, or the record itself where it is not exactly `cls`."""
    if type(record) is not cls:
        return record
    return (record.__dict__, _given(record))


def _chunks(chunks: tuple[Any, ...]) -> Any:
    if any(type(chunk) is not Chunk for chunk in chunks):
        return chunks
    return [(chunk.__dict__, _given(chunk)) for chunk in chunks]


def pack(trace: RagTrace) -> PackedTrace:
    """The trace as plain values for `unpickle` + `unpack`; `trace` itself is not changed."""
    values = dict(trace.__dict__)
    embedding = values["query_embedding"]
    if type(embedding) is QueryEmbedding:
        values["query_embedding"] = (
            {"model": embedding.model, "vector": vector_bytes(embedding.vector)},
            _given(embedding),
        )
    retrieval = values["retrieval"]
    if type(retrieval) is Retrieval:
        fields = dict(retrieval.__dict__)
        for name in _CHUNK_FIELDS:
            fields[name] = _chunks(fields[name])
        values["retrieval"] = (fields, _given(retrieval))
    values["timings"] = _packed(values["timings"], Timings)
    usage = values["usage"]
    if all(type(call) is ModelUsage for call in usage):
        values["usage"] = [(call.__dict__, _given(call)) for call in usage]
    return (values, _given(trace))


def _record(cls: type[Any], values: dict[str, Any], given: set[str] | None) -> Any:
    record = _new(cls)
    _set(record, "__dict__", values)
    _set(record, "__pydantic_fields_set__", _SHARED[cls] if given is None else given)
    _set(record, "__pydantic_extra__", None)
    _set(record, "__pydantic_private__", None)
    return record


def _chunks_back(packed: Any) -> tuple[Any, ...]:
    if isinstance(packed, tuple):  # records, as they were
        return packed
    return tuple([_record(Chunk, values, given) for values, given in packed])


def unpack(packed: PackedTrace) -> RagTrace:
    """The trace `pack` was given, from its unpickled values (which it takes over)."""
    values, given = packed
    embedding = values["query_embedding"]
    if isinstance(embedding, tuple):
        fields, embedding_given = embedding
        fields["vector"] = vector_from_bytes(fields["vector"])
        values["query_embedding"] = _record(QueryEmbedding, fields, embedding_given)
    retrieval = values["retrieval"]
    if isinstance(retrieval, tuple):
        fields, retrieval_given = retrieval
        for name in _CHUNK_FIELDS:
            fields[name] = _chunks_back(fields[name])
        values["retrieval"] = _record(Retrieval, fields, retrieval_given)
    timings = values["timings"]
    if isinstance(timings, tuple):
        values["timings"] = _record(Timings, *timings)
    usage = values["usage"]
    if isinstance(usage, list):
        values["usage"] = tuple([_record(ModelUsage, fields, call_given) for fields, call_given in usage])
    trace: RagTrace = _record(RagTrace, values, given)
    return trace


def pack_all(traces: Sequence[RagTrace | None]) -> list[PackedTrace | None]:
    """`pack` of each trace; None stays None (a trace that could not be built)."""
    return [None if trace is None else pack(trace) for trace in traces]


def unpack_all(packed: Sequence[PackedTrace | None]) -> list[RagTrace | None]:
    return [None if values is None else unpack(values) for values in packed]
