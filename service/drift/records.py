"""What the drift store takes and returns (`BucketBatch`, `ReferenceInfo`, `RunRecord`), and their rows.

Vectors are stored as little-endian float32 bytes; `sample_hash` is the content hash of a pinned sample.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from detectors import DriftResult
from service.drift.sample import Observation, Sample


@dataclass(frozen=True, slots=True)
class BucketBatch:
    """New observations of one bucket since the last write: a uniform sample of `seen` traces."""

    tenant: str
    app: str
    model_key: str
    bucket_start: datetime
    seen: int
    observations: Sequence[Observation]


@dataclass(frozen=True, slots=True)
class ReferenceInfo:
    """A pinned reference as listed (without its sample)."""

    id: int
    label: str
    tenant: str
    app: str
    model_key: str
    version: int
    created_at: datetime
    range_start: datetime | None
    range_end: datetime | None
    release: str | None
    n: int
    traces_represented: int
    excluded_buckets: int
    content_hash: str
    embedder_key: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.label,
            "tenant": self.tenant,
            "app": self.app,
            "model_key": self.model_key,
            "version": self.version,
            "created_at": self.created_at.isoformat(),
            "from": None if self.range_start is None else self.range_start.isoformat(),
            "to": None if self.range_end is None else self.range_end.isoformat(),
            "release": self.release,
            "n": self.n,
            "traces_represented": self.traces_represented,
            "excluded_buckets": self.excluded_buckets,
            "content_hash": self.content_hash,
            "embedder": self.embedder_key,
        }


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One detector result as stored: the `DriftResult`, where it ran, and what it concluded."""

    tenant: str
    app: str
    model_key: str | None
    intent: str | None
    result: DriftResult
    alarm: bool
    outcome: str
    trigger: str
    ran_at: datetime
    explanation: list[dict[str, Any]] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "app": self.app,
            "model_key": self.model_key,
            "intent": self.intent,
            **self.result.model_dump(mode="json"),
            "alarm": self.alarm,
            "outcome": self.outcome,
            "trigger": self.trigger,
            "ran_at": self.ran_at.isoformat(),
            "explanation": self.explanation,
        }


def _vector_bytes(vector: np.ndarray[Any, Any] | None) -> bytes | None:
    return None if vector is None else np.asarray(vector, dtype="<f4").tobytes()


def _vector_from(raw: bytes | None) -> np.ndarray[Any, np.dtype[np.float32]] | None:
    if raw is None:
        return None
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)


def _observation_values(o: Observation) -> dict[str, Any]:
    return {
        "trace_id": o.trace_id,
        "trace_time": o.time,
        "release": o.release,
        "intent": o.intent,
        "query": o.query,
        "vector": _vector_bytes(o.vector),
        "top1": o.top1,
        "topk": o.topk,
        "empty": o.empty,
        "hit": o.hit,
    }


def _observation(row: Any) -> Observation:
    return Observation(
        trace_id=row.trace_id,
        time=row.trace_time,
        release=row.release,
        intent=row.intent,
        query=row.query,
        vector=_vector_from(row.vector),
        top1=row.top1,
        topk=row.topk,
        empty=row.empty,
        hit=row.hit,
    )


def sample_hash(sample: Sample) -> str:
    """sha256 over every field of every observation, in order: equal samples give equal hashes."""
    digest = hashlib.sha256()
    for o in sample.observations:
        digest.update(
            json.dumps(
                [o.trace_id, o.query, o.top1, o.topk, o.empty, o.hit, o.release, o.intent], default=str
            ).encode()
        )
        digest.update(_vector_bytes(o.vector) or b"-")
    return digest.hexdigest()


def _reference_info(row: Any) -> ReferenceInfo:
    return ReferenceInfo(
        id=int(row.id),
        label=row.label,
        tenant=row.tenant,
        app=row.app,
        model_key=row.model_key,
        version=int(row.version),
        created_at=row.created_at,
        range_start=row.range_start,
        range_end=row.range_end,
        release=row.release,
        n=int(row.n),
        traces_represented=int(row.traces_represented),
        excluded_buckets=int(row.excluded_buckets),
        content_hash=row.content_hash,
        embedder_key=getattr(row, "embedder_key", None),
    )


def _run_record(row: Any) -> RunRecord:
    result = DriftResult(
        detector=row.detector,
        version=row.version,
        reference_id=row.reference_id,
        window_start=row.window_start,
        window_end=row.window_end,
        n_reference=row.n_reference,
        n_window=row.n_window,
        statistic=row.statistic if row.statistic is not None else 0.0,
        p_value=row.p_value,
        alpha=row.alpha,
        drifted=bool(row.drifted),
        details=json.loads(row.details),
    )
    return RunRecord(
        tenant=row.tenant,
        app=row.app,
        model_key=row.model_key,
        intent=row.intent,
        result=result,
        alarm=bool(row.alarm),
        outcome=row.outcome,
        trigger=row.trigger,
        ran_at=row.ran_at,
        explanation=None if row.explanation is None else json.loads(row.explanation),
    )
