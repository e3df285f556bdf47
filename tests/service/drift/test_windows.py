"""Windows in the running service when ragmon embeds the queries itself: sizes that follow the traffic, no
overlap with the reference, the fitted embedder stored with the reference, power and the top-group series."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import numpy as np
from prometheus_client import Metric

from detectors import Reference, TextKnnDrift, Window
from service.config import DriftConfig
from service.drift.embedders import text_detector
from service.drift.monitor import TOP_GROUP_LABEL_CHARS, DriftScheduler
from service.drift.pinning import pin_references
from service.drift.store import DriftStore
from service.drift.window_sink import DriftWindowSink
from service.metrics import Metrics
from service.model import RagTrace
from service.store.trace_store import Store

T0 = datetime(2026, 3, 2, tzinfo=UTC)
TOPICS = (
    ("card", "declined", "blocked", "contactless", "expired"),
    ("transfer", "iban", "beneficiary", "pending", "sepa"),
    ("password", "login", "email", "profile", "verify"),
)
# Long words: the group they form names more than the top-group label may hold.
NEW_TOPIC = ("passportrenewalappointment", "embassyconsularsection", "visaapplicationcentre", "itinerary")


def _traces(n: int, start: datetime, span: timedelta, *, seed: int, new_share: float = 0.0) -> list[RagTrace]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        words = NEW_TOPIC if rng.random() < new_share else TOPICS[int(rng.integers(len(TOPICS)))]
        query = "how do i " + " ".join(rng.choice(words, 3, replace=False)) + f" {int(rng.integers(40))}"
        out.append(
            RagTrace(
                trace_id=f"{seed:08x}{i:024x}", app="bank", start_time=start + span * (i / n), query=query
            )
        )
    return out


def _service(
    store: Store, **drift: object
) -> tuple[DriftConfig, DriftStore, DriftWindowSink, DriftScheduler]:
    config = DriftConfig(min_window=30, **drift)  # type: ignore[arg-type]
    drift_store = DriftStore(store.engine, bucket_s=config.bucket_s, bucket_capacity=config.bucket_capacity)
    drift_store.create_schema()
    metrics = Metrics()
    sink = DriftWindowSink(config, metrics)
    return config, drift_store, sink, DriftScheduler(config, drift_store, metrics, sink)


def _send(sink: DriftWindowSink, scheduler: DriftScheduler, traces: list[RagTrace]) -> None:
    asyncio.run(sink.consume_traces(traces))
    scheduler.flush()


def test_a_day_whose_traffic_came_in_one_hour_fills_the_window_while_memory_stays_bounded(
    store: Store,
) -> None:
    config, drift, sink, scheduler = _service(store)
    quiet = [
        t
        for hour in range(23)
        for t in _traces(20, T0 + timedelta(hours=hour), timedelta(minutes=50), seed=hour)
    ]
    _send(sink, scheduler, quiet)
    busy_hour = T0 + timedelta(hours=23)
    # 2,000 traces in one hour, 250 per flush (a minute's worth): each flush's reservoir holds all of them.
    for flush in range(8):
        batch = _traces(250, busy_hour + timedelta(minutes=5 * flush), timedelta(minutes=4), seed=100 + flush)
        asyncio.run(sink.consume_traces(batch))
        assert sink.held <= config.reservoir_capacity
        scheduler.flush()
    sample, represented, _ = drift.draw(
        "default",
        "bank",
        sink.builtin_key,
        since=T0,
        until=T0 + timedelta(days=1),
        capacity=config.window_capacity,
        seed=0,
    )
    # 2,460 traces: the window holds its full 2,000 (with 250-row hourly buckets it held 307).
    assert represented == 2460
    assert len(sample) == config.window_capacity


def test_a_busy_bucket_grows_flush_by_flush_and_stays_within_its_capacity(store: Store) -> None:
    _, drift, sink, scheduler = _service(store, bucket_capacity=900)
    kept = []
    for flush in range(5):
        # 500 traces per flush: the in-memory reservoir keeps 250 of them.
        _send(
            sink, scheduler, _traces(500, T0 + timedelta(minutes=5 * flush), timedelta(minutes=4), seed=flush)
        )
        sample, _, _ = drift.draw(
            "default", "bank", sink.builtin_key, since=T0, until=T0 + timedelta(hours=1), capacity=10_000
        )
        kept.append(len(sample))
    assert kept == [250, 500, 750, 900, 900]


def test_the_window_starts_where_a_reference_pinned_within_the_day_ends(store: Store) -> None:
    config, drift, sink, scheduler = _service(store)
    _send(sink, scheduler, _traces(600, T0, timedelta(hours=12), seed=1))
    pinned = pin_references(
        drift,
        "default",
        since=T0,
        until=T0 + timedelta(hours=6),
        capacity=config.reference_capacity,
        min_size=30,
    )
    assert [r.n for r in pinned.pinned] == [300]
    records = scheduler.run(tenant="default", app="bank", now=T0 + timedelta(hours=12))
    query = next(r for r in records if r.result.detector == "query_text_knn")
    # The day-long window would have started at T0 - 12 h and held the reference's own 300 traces.
    assert query.result.window_start == T0 + timedelta(hours=6)
    assert query.result.n_window == 300
    assert query.result.details["window_requested_from"] == (T0 - timedelta(hours=12)).isoformat()
    assert not query.result.drifted or query.result.p_value is not None
    power = query.result.details["power"]
    assert isinstance(power, dict) and power["n_window"] == 300 and 0.0 < float(str(power["power"])) < 1.0
    assert "estimated" in str(power["basis"]) or "bench" in str(power["basis"])
    # Every detector on that reference compares the same clipped window.
    starts = {r.result.window_start for r in records if r.model_key == sink.builtin_key}
    assert starts == {T0 + timedelta(hours=6)}


def test_a_reference_reaching_now_leaves_no_window_and_says_why(store: Store) -> None:
    _, drift, sink, scheduler = _service(store)
    _send(sink, scheduler, _traces(200, T0, timedelta(hours=3), seed=2))
    pin_references(drift, "default", since=T0, until=T0 + timedelta(hours=3), min_size=30)
    records = scheduler.run(tenant="default", app="bank", now=T0 + timedelta(hours=3))
    query = next(r for r in records if r.result.detector == "query_text_knn")
    assert query.outcome == "insufficient_data" and query.result.n_window == 0
    assert "where the reference ends" in str(query.result.details["insufficient_data"])


def test_the_fitted_embedder_is_stored_with_the_reference_and_scores_as_when_pinned(store: Store) -> None:
    _, drift, sink, scheduler = _service(store)
    _send(sink, scheduler, _traces(400, T0, timedelta(hours=4), seed=3))
    pinned = pin_references(drift, "default", since=T0, until=T0 + timedelta(hours=4), min_size=30, seed=5)
    info = pinned.pinned[0]
    stored = drift.reference_embedder(info.id)
    assert stored is not None and info.embedder_key == stored[0]
    assert stored[0].startswith("ragmon-tfidf-v1-") and "-f80-" in stored[0]
    assert drift.references("default")[0].to_json()["embedder"] == stored[0]
    reference = drift.reference_sample(info.id)
    texts = np.array(reference.texts())
    pinned_ref = Reference(info.label, texts, T0, T0 + timedelta(hours=4))
    window = Window(
        np.array([t.query for t in _traces(200, T0, timedelta(hours=1), seed=4, new_share=0.1)]), T0, T0
    )
    loaded = text_detector(pinned_ref, stored[1], alpha=0.05, seed=0)
    fresh = TextKnnDrift(alpha=0.05, seed=5).fit(pinned_ref)
    assert loaded.embedder is not None and loaded.embedder.model_name == stored[0]
    assert np.array_equal(loaded.fit_rows, fresh.fit_rows)  # type: ignore[arg-type]
    # Same fitted embedder, same graph: the results differ only in the permutation seed's draws.
    fresh_same_seed = TextKnnDrift.from_state(
        {**fresh.to_state(), "params": {**fresh.to_state()["params"], "seed": 0}}
    )
    assert loaded.score(window) == fresh_same_seed.score(window)
    # The state is read back twice alike: deterministic.
    assert text_detector(pinned_ref, stored[1], alpha=0.05, seed=0).score(window) == loaded.score(window)


def _top_group_series(scheduler: DriftScheduler) -> list[dict[str, str]]:
    families: list[Metric] = [
        m for m in scheduler.metrics.registry.collect() if m.name == "ragmon_drift_top_group_info"
    ]
    return [dict(s.labels) for f in families for s in f.samples]


def test_top_group_series_is_one_per_app_and_detector_capped_and_replaced(store: Store) -> None:
    _, drift, sink, scheduler = _service(store)
    _send(sink, scheduler, _traces(500, T0, timedelta(hours=5), seed=6))
    pin_references(drift, "default", since=T0, until=T0 + timedelta(hours=5), min_size=30)
    _send(sink, scheduler, _traces(500, T0 + timedelta(hours=5), timedelta(hours=5), seed=7, new_share=0.3))
    records = scheduler.run(tenant="default", app="bank", now=T0 + timedelta(hours=10))
    query = next(r for r in records if r.result.detector == "query_text_knn")
    assert query.result.drifted and query.explanation
    series = _top_group_series(scheduler)
    assert len(series) == 1
    assert series[0]["app"] == "bank" and series[0]["detector"] == "query_text_knn"
    assert 0 < len(series[0]["terms"]) <= TOP_GROUP_LABEL_CHARS
    assert any(word[:10] in series[0]["terms"] for word in NEW_TOPIC)
    assert series[0]["share"].endswith("%") and " -> " in series[0]["share"]
    # A second drifted run replaces the series rather than adding one.
    scheduler.run(tenant="default", app="bank", now=T0 + timedelta(hours=10, minutes=30))
    assert len(_top_group_series(scheduler)) == 1
    # Re-pinned over the shift, the next run has no window yet: the series goes.
    pin_references(drift, "default", since=T0, until=T0 + timedelta(hours=10), min_size=30)
    scheduler.run(tenant="default", app="bank", now=T0 + timedelta(hours=10))
    assert _top_group_series(scheduler) == []
