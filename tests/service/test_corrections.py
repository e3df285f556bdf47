"""Tests of service/corrections.py: what a later version of a stored trace corrects in the metrics, exactly,
without counting the trace twice; histograms observe each series of a trace once."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from service.corrections import Counted, TraceUpdate, count_expired, count_updates, observed_values
from service.metrics import Metrics
from service.model import Chunk, ModelUsage, RagTrace, Retrieval, Timings

STARTED = datetime(2026, 1, 5, 12, tzinfo=UTC)


def trace(revision: int, **fields: object) -> RagTrace:
    values: dict[str, object] = {
        "trace_id": "ef" * 16,
        "app": "retriever-svc",
        "start_time": STARTED,
        "query": "q",
        "partial": True,
        "revision": revision,
        "retrieval": Retrieval(retriever="bm25", chunks=(Chunk(id="a", rank=0, score=0.7),)),
        "timings": Timings(total_s=0.2, retrieval_s=0.2),
    }
    values.update(fields)
    return RagTrace.model_validate(values)


FIRST = trace(1)
WHOLE = trace(
    4,
    app="frontend",  # the root's service: the first counted app stays the trace's label
    partial=False,
    answer="five days",
    is_regeneration=True,
    regeneration_source="attribute",
    usage=(
        ModelUsage(
            model="gpt-4o-mini", input_tokens=1000, output_tokens=200, cost_usd=0.01, cost_source="app"
        ),
        ModelUsage(model="mystery", input_tokens=10, cost_source="unpriced"),
    ),
    timings=Timings(total_s=180.0, retrieval_s=0.25, generation_s=179.0, ttft_s=1.5),
)


def value(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def histogram_counts(metrics: Metrics) -> dict[str, float]:
    app = {"app": "retriever-svc"}
    counts = {
        f"stage:{stage}": value(metrics, "ragmon_stage_duration_seconds_count", **app, stage=stage)
        for stage in ("total", "embedding", "retrieval", "rerank", "generation")
    }
    for series, name in (
        ("ttft", "ragmon_ttft_seconds"),
        ("trace_cost", "ragmon_trace_cost_usd"),
        ("retrieved_chunks", "ragmon_retrieved_chunks"),
        ("top1_score", "ragmon_retrieval_top1_score"),
    ):
        counts[series] = value(metrics, f"{name}_count", **app)
    return {k: v for k, v in counts.items() if v}


@pytest.mark.parametrize("version", [FIRST, WHOLE.model_copy(update={"app": "retriever-svc"})])
def test_what_counted_says_was_observed_is_what_count_traces_observes(version: RagTrace) -> None:
    metrics = Metrics()
    metrics.count_traces([version])
    assert histogram_counts(metrics) == dict.fromkeys(Counted.of(version).observed, 1.0)
    if version.partial:
        assert "stage:total" not in Counted.of(version).observed  # deferred while partial
        assert "stage:total" in observed_values(version)


def test_an_update_corrects_by_the_difference_under_the_first_counted_labels() -> None:
    metrics = Metrics()
    metrics.count_traces([FIRST])
    update = TraceUpdate(WHOLE, Counted.of(FIRST))
    count_updates(metrics, [update])
    count_updates(metrics, [TraceUpdate(WHOLE, update.after)])  # fanned out again: nothing more
    later = WHOLE.model_copy(update={"revision": 5})  # one more late span, that changes no value
    count_updates(metrics, [TraceUpdate(later, update.after)])
    app = {"app": "retriever-svc"}
    assert value(metrics, "ragmon_traces_total", **app) == 1
    assert value(metrics, "ragmon_traces_total", app="frontend") == 0
    assert value(metrics, "ragmon_traces_updated_total", **app) == 2
    assert value(metrics, "ragmon_partial_traces_total", **app) == 1
    assert value(metrics, "ragmon_partial_traces_completed_total", **app) == 1
    assert value(metrics, "ragmon_tokens_total", **app, model="gpt-4o-mini", kind="input") == 1000
    assert value(metrics, "ragmon_tokens_total", **app, model="gpt-4o-mini", kind="output") == 200
    assert value(metrics, "ragmon_tokens_total", **app, model="mystery", kind="input") == 10
    assert value(metrics, "ragmon_cost_usd_total", **app, model="gpt-4o-mini") == pytest.approx(0.01)
    assert value(metrics, "ragmon_unpriced_calls_total", **app, model="mystery") == 1
    assert value(metrics, "ragmon_regenerations_total", **app, intent="none", source="attribute") == 1
    # each histogram series once; the retrieval duration changed after it was observed: a correction
    assert histogram_counts(metrics) == {
        "stage:total": 1,
        "stage:retrieval": 1,
        "stage:generation": 1,
        "ttft": 1,
        "trace_cost": 1,
        "retrieved_chunks": 1,
        "top1_score": 1,
    }
    assert value(metrics, "ragmon_stage_duration_seconds_sum", **app, stage="total") == 180.0
    assert value(metrics, "ragmon_stage_duration_seconds_sum", **app, stage="retrieval") == 0.2
    assert value(metrics, "ragmon_trace_corrections_total", **app, quantity="stage_seconds") == 1


def test_counted_survives_its_json_and_keeps_the_larger_of_what_was_counted() -> None:
    after = TraceUpdate(WHOLE, Counted.of(FIRST)).after
    assert Counted.from_json(after.to_json()) == after
    assert (after.app, after.revision, after.partial) == ("retriever-svc", 4, False)
    # a version with less of something (it cannot come from the archive, but a JSON row may say so)
    # never makes a counter go back
    smaller = WHOLE.model_copy(update={"usage": (), "revision": 5})
    assert Counted.of(smaller, after).tokens == after.tokens


def test_a_partial_trace_has_its_totals_observed_once_when_its_window_closes() -> None:
    metrics = Metrics()
    metrics.count_traces([FIRST])
    count_expired(metrics, [("default", FIRST, None)])
    count_expired(metrics, [("default", WHOLE, TraceUpdate(WHOLE, Counted.of(FIRST)).after)])  # observed
    assert value(metrics, "ragmon_stage_duration_seconds_count", app="retriever-svc", stage="total") == 1
    assert value(metrics, "ragmon_stage_duration_seconds_sum", app="retriever-svc", stage="total") == 0.2
