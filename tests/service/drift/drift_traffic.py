"""Synthetic RAG traffic with a planted topic shift, sent to a live ragmon through the JSON API.

Queries come from a few topics. Each topic has a fixed centre in the app's
embedding space; a query's vector is its topic centre plus noise, and its
retrieval hits that topic's documents. A shifted stream draws a share of its
queries from a topic the reference never saw (`new_topic`), whose queries
also retrieve worse. Everything is seeded.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import httpx
import numpy as np

TOPICS = (
    ("billing", ("invoice", "refund", "charge", "payment")),
    ("shipping", ("delivery", "parcel", "courier", "tracking")),
    ("account", ("password", "login", "email", "profile")),
    ("returns", ("return", "exchange", "label", "warehouse")),
    ("warranty", ("repair", "broken", "guarantee", "defect")),
)
NEW_TOPIC = ("crypto", ("bitcoin", "wallet", "blockchain", "token"))


def _centres(dim: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(12345).standard_normal((len(TOPICS) + 1, dim))


def traces(
    n: int,
    *,
    seed: int,
    start: datetime,
    span: timedelta,
    app: str = "shop",
    shift: float = 0.0,
    model: str | None = "shop-embed-v1",
    dim: int = 32,
    regeneration_rate: float = 0.05,
    intent: str = "support",
) -> list[dict[str, Any]]:
    """`n` JSON-API traces spread evenly over [start, start + span); `shift` of them from the new topic."""
    rng = np.random.default_rng(seed)
    centres = _centres(dim)
    out = []
    for i in range(n):
        new = rng.random() < shift
        topic = len(TOPICS) if new else int(rng.integers(len(TOPICS)))
        name, words = NEW_TOPIC if new else TOPICS[topic]
        chosen = rng.choice(words, 2, replace=False)
        query = f"how do I {chosen[0]} my {chosen[1]} {name} case {int(rng.integers(1000))}"
        vector = centres[topic] + 0.35 * rng.standard_normal(dim)
        vector /= np.linalg.norm(vector)
        base = 0.55 if new else 0.8
        scores = sorted((base + 0.08 * rng.standard_normal(5)).tolist(), reverse=True)
        record: dict[str, Any] = {
            "trace_id": f"{rng.integers(2**63):016x}{i:016x}",
            "app": app,
            "intent": intent,
            "start_time": (start + span * (i / max(1, n))).isoformat(),
            "query": query,
            "retrieval": {
                "retriever": "vector",
                "k": 5,
                "chunks": [
                    {
                        "id": f"{name}-doc-{int(rng.integers(6))}",
                        "score": s,
                        "content": f"To handle {name}, open the {name} page and follow its steps.",
                    }
                    for s in scores
                ],
            },
            "answer": f"Here is how to handle {name}.",
            "timings": {"total_s": 0.5 + rng.random(), "retrieval_s": 0.05 + 0.05 * rng.random()},
            "is_regeneration": bool(rng.random() < regeneration_rate),
        }
        if model is not None:
            record["query_embedding"] = {"model": model, "vector": vector.tolist()}
        out.append(record)
    return out


def batches(records: list[dict[str, Any]], size: int = 200) -> Iterator[list[dict[str, Any]]]:
    for start in range(0, len(records), size):
        yield records[start : start + size]


def send(client: httpx.Client, records: list[dict[str, Any]]) -> None:
    """POST the records in batches; fails the test on any rejection."""
    for batch in batches(records):
        response = client.post("/api/v1/traces", json={"traces": batch})
        response.raise_for_status()
        body = response.json()
        if body["rejected"]:
            raise AssertionError(f"ragmon rejected traces: {body['rejected'][:3]}")
