"""`Metrics.count_traces` tallies a batch and touches each series once: the exported values must
be what observing and incrementing trace by trace gives."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from service.metrics import Metrics
from service.model import Chunk, ModelUsage, RagTrace, Retrieval, Timings
from tests.prometheus_samples import assert_same, samples

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def trace(n: int, **fields: Any) -> RagTrace:
    values: dict[str, Any] = {
        "trace_id": f"{n:032x}",
        "app": ("shop", "support")[n % 2],
        "intent": ("refunds", "shipping", None)[n % 3],
        "release": f"v{n % 4}",
        "start_time": T0 + timedelta(seconds=n),
        "query": f"question {n}",
        "answer": f"answer {n}",
        "retrieval": Retrieval(
            retriever="bm25",
            chunks=tuple(Chunk(id=f"d{n}-{r}", rank=r, score=0.95 - r / 7) for r in range(n % 4)),
        ),
        "usage": (
            ModelUsage(model="gpt-4o-mini", input_tokens=100 + n, output_tokens=n % 5, cost_usd=1e-4 * n),
            ModelUsage(model=f"local-{n % 3}", input_tokens=10, output_tokens=3),  # unpriced
        ),
        "timings": Timings(
            total_s=0.4 * n,
            retrieval_s=0.01 * n,
            generation_s=None if n % 5 == 0 else 0.3 * n,
            ttft_s=0.05 if n % 2 else None,
        ),
        "partial": n % 7 == 0,
        "is_regeneration": n % 6 == 0,
    }
    values.update(fields)
    return RagTrace(**values)


def test_a_batch_counts_what_its_traces_counted_one_at_a_time() -> None:
    batch = [trace(n) for n in range(40)]
    batch.append(trace(99, usage=(ModelUsage(model="gpt-4o-mini", cost_source="unknown_usage"),)))
    batch.append(trace(98, retrieval=Retrieval(retriever="bm25")))  # an empty retrieval
    batched, one_by_one = Metrics(), Metrics()
    batched.count_traces(batch)
    for t in batch:
        one_by_one.count_traces([t])
    assert_same(batched.registry, one_by_one.registry)
    got = samples(batched.registry)
    assert got[("ragmon_traces_total", (("app", "shop"),))] == 21  # n = 0, 2, ... 38, 98
    # odd n below 40 less 5, 15, 25, 35 (no generation time), and 99
    assert got[("ragmon_stage_duration_seconds_count", (("app", "support"), ("stage", "generation")))] == 17
    shop_input = ("ragmon_tokens_total", (("app", "shop"), ("kind", "input"), ("model", "gpt-4o-mini")))
    assert got[shop_input] == sum(100 + n for n in (*range(0, 40, 2), 98))
    assert got[("ragmon_empty_retrievals_total", (("app", "shop"),))] == 11  # n % 4 == 0 below 40, and 98
    assert got[("ragmon_usage_unknown_calls_total", (("app", "support"), ("model", "gpt-4o-mini")))] == 1
    assert (
        got[("ragmon_unpriced_calls_total", (("app", "shop"), ("model", "local-0")))] == 7
    )  # n % 6 == 0, 98
