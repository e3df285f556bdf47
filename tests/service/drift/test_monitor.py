"""Drift in the running service, through a real server: pin, shift, run, model change, bands, bounds."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from detectors import HashingEmbedder, embedding_model_key
from service.config import DriftConfig
from service.demo.corpus import SHIFT_TOPICS
from service.demo.run import run_demo
from service.drift.monitor import DriftScheduler
from service.drift.store import DriftStore
from service.drift.window_sink import DriftWindowSink
from service.metrics import Metrics
from service.model import QueryEmbedding, RagTrace
from service.store.trace_store import Store
from tests.live_server import live_server
from tests.service.drift.drift_traffic import send, traces

DRIFT = {"min_window": 30, "interval_s": 3600.0, "flush_s": 3600.0}
QUIET = {"judging": {"enabled": False}}


def _server(tmp_path: Path, **drift: Any) -> Any:
    return live_server(tmp_path, drift={**DRIFT, **drift}, **QUIET)


def _by_detector(items: list[dict[str, Any]], model_key: str | None = None) -> dict[str, dict[str, Any]]:
    return {
        item["detector"]: item
        for item in items
        if item["trigger"] != "event" and (model_key is None or item["model_key"] in (model_key, None))
    }


def _test_now() -> datetime:
    """Half past the previous hour: where the tests' traffic falls in the hourly buckets (and so which
    buckets a reservoir shares, or an alarm's window overlaps) no longer depends on the minute the test
    runs. With the wall clock, runs in the first and last minutes of an hour failed."""
    return datetime.now(UTC).replace(minute=30, second=0, microsecond=0) - timedelta(hours=1)


def _pin_past(client: Any, start: datetime, end: datetime, **extra: Any) -> dict[str, Any]:
    response = client.post(
        "/api/v1/drift/references", json={"from": start.isoformat(), "to": end.isoformat(), **extra}
    )
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def test_shifted_traffic_drifts_with_explanation_and_alarmed_window_is_never_pinned(tmp_path: Path) -> None:
    now = _test_now()
    past = now - timedelta(days=3)
    with _server(tmp_path) as server, server.client() as client:
        send(client, traces(400, seed=1, start=past, span=timedelta(hours=6)))
        server.flush()
        pinned = _pin_past(client, past - timedelta(hours=1), past + timedelta(hours=7))
        assert [r["id"] for r in pinned["pinned"]] == ["shop/shop-embed-v1@32/v1"]
        assert pinned["pinned"][0]["n"] == 400
        send(client, traces(400, seed=2, start=now - timedelta(hours=3), span=timedelta(hours=2), shift=0.3))
        server.flush()
        run = client.post("/api/v1/drift/runs", json={"app": "shop"})
        run.raise_for_status()
        results = _by_detector(run.json()["items"])

        mmd = results["query_embedding_mmd"]
        assert mmd["drifted"] and mmd["alarm"] and mmd["p_value"] <= mmd["alpha"]
        assert (mmd["n_reference"], mmd["n_window"]) == (400, 400)
        groups = mmd["explanation"]
        assert groups, "a drifted query test must explain itself"
        top = groups[0]
        assert top["significant"] and top["share_window"] > top["share_reference"]
        assert sum("crypto" in example for example in top["examples"]) >= len(top["examples"]) - 1
        # The new topic also retrieves worse: the top-1 score test sees it.
        assert results["retrieval_top1_score"]["drifted"]
        assert server.metric("ragmon_drift_detected", app="shop", detector="query_embedding_mmd") == 1.0
        assert server.metric("ragmon_drift_p_value", app="shop", detector="query_embedding_mmd") <= 0.05
        assert server.metric("ragmon_drift_window_size", app="shop", detector="query_embedding_mmd") == 400
        assert (
            server.metric(
                "ragmon_drift_runs_total", app="shop", detector="query_embedding_mmd", outcome="drift"
            )
            == 1.0
        )
        assert server.metric("ragmon_drift_last_run_timestamp_seconds", detector="query_embedding_mmd") > 0

        stored = client.get("/api/v1/drift/runs", params={"app": "shop", "alarm": True}).json()["items"]
        assert "query_embedding_mmd" in {r["detector"] for r in stored}
        # The alarmed window covers the shifted traffic: pinning over it leaves those buckets out.
        again = _pin_past(client, now - timedelta(hours=4), now)
        assert not again["pinned"]
        assert again["skipped"][0]["excluded_buckets"] >= 1
        listed = client.get("/api/v1/drift/references").json()["items"]
        assert [r["version"] for r in listed] == [1]


def test_unshifted_traffic_does_not_drift(tmp_path: Path) -> None:
    now = _test_now()
    past = now - timedelta(days=3)
    with _server(tmp_path) as server, server.client() as client:
        send(client, traces(400, seed=3, start=past, span=timedelta(hours=6)))
        server.flush()
        _pin_past(client, past - timedelta(hours=1), past + timedelta(hours=7))
        send(client, traces(400, seed=4, start=now - timedelta(hours=3), span=timedelta(hours=2)))
        server.flush()
        results = _by_detector(client.post("/api/v1/drift/runs", json={}).json()["items"])
        assert not results["query_embedding_mmd"]["drifted"]
        assert results["query_embedding_mmd"]["explanation"] is None
        assert not results["embedding_model_change"]["drifted"]
        assert server.metric("ragmon_drift_detected", app="shop", detector="query_embedding_mmd") == 0.0


def test_new_embedding_model_is_its_own_event_with_separate_windows(tmp_path: Path) -> None:
    now = _test_now()
    past = now - timedelta(days=2)
    with _server(tmp_path) as server, server.client() as client:
        send(client, traces(200, seed=5, start=past, span=timedelta(hours=3)))
        server.flush()
        _pin_past(client, past - timedelta(hours=1), past + timedelta(hours=4))
        send(
            client,
            traces(
                200,
                seed=6,
                start=now - timedelta(hours=2),
                span=timedelta(hours=1),
                model="shop-embed-v2",
                dim=48,
            ),
        )
        server.flush()
        assert server.metric("ragmon_embedding_model_changes_total", app="shop") == 1.0
        events = client.get("/api/v1/drift/runs", params={"detector": "embedding_model_change"}).json()[
            "items"
        ]
        assert [e["trigger"] for e in events] == ["event"]
        assert events[0]["details"]["dimension_changed"] is True
        assert events[0]["model_key"] == "shop-embed-v2@48"

        answer = client.post("/api/v1/drift/runs", json={}).json()
        assert answer["without_reference"] == [{"app": "shop", "model_key": "shop-embed-v2@48"}]
        results = answer["items"]
        change = [r for r in results if r["detector"] == "embedding_model_change"]
        assert change and change[0]["drifted"] and change[0]["alarm"]
        assert change[0]["details"]["new_models"] == {"shop-embed-v2@48": 200}
        # The v1 reference is compared with the v1 window only, which is empty now: never with v2 vectors.
        mmd = [r for r in results if r["detector"] == "query_embedding_mmd"]
        assert [(r["model_key"], r["outcome"], r["n_window"]) for r in mmd] == [
            ("shop-embed-v1@32", "insufficient_data", 0)
        ]
        # Pinning the new period makes a reference for the new model; then the event stops alarming.
        pinned = _pin_past(client, now - timedelta(hours=3), now)
        assert [r["model_key"] for r in pinned["pinned"]] == ["shop-embed-v2@48"]
        results = client.post("/api/v1/drift/runs", json={}).json()["items"]
        change = [r for r in results if r["detector"] == "embedding_model_change"]
        assert not change[0]["drifted"]


def test_regeneration_band_is_exported_and_hysteresis_delays_the_alarm(tmp_path: Path) -> None:
    now = _test_now()
    records = traces(
        600, seed=7, start=now - timedelta(hours=1), span=timedelta(minutes=30), regeneration_rate=0.1
    )
    with _server(tmp_path, regeneration_min_baseline=100, hysteresis=2) as server, server.client() as client:
        send(client, records)
        server.flush()
        runs = server.pipeline.drift.run(trigger="schedule")
        band = [r for r in runs if r.result.detector == "regeneration_band"]
        assert len(band) == 1 and band[0].intent == "support"
        expected = sum(r["is_regeneration"] for r in records) / len(records)
        rate = server.metric("ragmon_regeneration_rate_ratio", app="shop", intent="support")
        lower = server.metric("ragmon_regeneration_band_lower_ratio", app="shop", intent="support")
        upper = server.metric("ragmon_regeneration_band_upper_ratio", app="shop", intent="support")
        assert rate == pytest.approx(expected)
        assert 0.0 <= lower <= upper <= 1.0 and upper > 0.0
        assert band[0].result.n_window == 600

        # Hysteresis 2: with a reference and a shifted window, the first drifted run does not alarm yet.
        _pin_past(client, now - timedelta(hours=2), now)
        send(
            client,
            traces(300, seed=8, start=now + timedelta(minutes=1), span=timedelta(minutes=5), shift=0.5),
        )
        server.flush()
        first = _by_detector(client.post("/api/v1/drift/runs", json={}).json()["items"])
        second = _by_detector(client.post("/api/v1/drift/runs", json={}).json()["items"])
        assert first["query_embedding_mmd"]["drifted"] and not first["query_embedding_mmd"]["alarm"]
        assert second["query_embedding_mmd"]["drifted"] and second["query_embedding_mmd"]["alarm"]


def _trace(i: int, hour: int, *, model: str | None = "m", dim: int = 4, query: str = "q") -> RagTrace:
    return RagTrace(
        trace_id=f"{i:032x}",
        app="app",
        start_time=datetime(2026, 1, 1, hour, tzinfo=UTC) + timedelta(seconds=i % 3000),
        query=f"{query} {i}",
        query_embedding=None if model is None else QueryEmbedding(model=model, vector=(1.0,) * dim),
    )


async def test_window_memory_stays_bounded_whatever_the_traffic() -> None:
    config = DriftConfig(reservoir_capacity=20, max_open_buckets=3, max_models_per_app=2)
    sink = DriftWindowSink(config, Metrics())
    await sink.consume_traces([_trace(i, hour=i % 6) for i in range(5000)])
    assert sink.held <= 3 * 20
    assert sink.dropped > 0
    batches, _ = sink.take()
    assert len(batches) == 3
    assert all(len(b.observations) == 20 and b.seen > 20 for b in batches)
    assert sum(b.seen for b in batches) + sink.dropped == 5000
    # A flood of new embedding models cannot grow the windows past the per-app cap either.
    await sink.consume_traces([_trace(10_000 + i, hour=0, model=f"m{i}") for i in range(50)])
    assert {b.model_key for b in sink.take()[0]} <= {"m@4", "m0@4"}


async def test_traces_without_vectors_use_the_builtin_embedder_off_the_ingest_path() -> None:
    config = DriftConfig(bucket_capacity=50)
    embedder = HashingEmbedder(dim=config.embedder_dim)
    sink = DriftWindowSink(config, Metrics(), embedder)
    await sink.consume_traces([_trace(i, hour=1, model=None, query="where is my parcel") for i in range(10)])
    batches, events = sink.take()
    assert not events
    assert [b.model_key for b in batches] == [embedding_model_key(embedder.model_name, embedder.dim)]
    # The sink keeps text only; vectors are computed when the scheduler flushes.
    assert all(o.vector is None and o.query for o in batches[0].observations)


def test_demo_topic_shift_through_otlp_is_caught_against_the_pre_shift_release(tmp_path: Path) -> None:
    with _server(tmp_path) as server, server.client() as client:
        # 300 requests after the shift: the window starts where the pinned release's last trace is,
        # and the requests in flight at the shift interleave, so 200 left 29-44 support-bot
        # observations in it, around `min_window` (30): insufficient data in most runs
        run_demo(server.url, requests=500, rate=0.0, seed=3, shift_after=200, dim=64)
        server.flush()
        pinned = client.post(
            "/api/v1/drift/references", json={"release": "2.3.0", "app": "support-bot"}
        ).json()
        assert [r["release"] for r in pinned["pinned"]] == ["2.3.0"]
        results = client.post("/api/v1/drift/runs", json={"app": "support-bot"}).json()["items"]
        mmd = next(r for r in results if r["detector"] == "query_embedding_mmd")
        assert mmd["drifted"], mmd
        top = mmd["explanation"][0]
        assert top["significant"]
        # The demo's new support-bot topic is about membership tiers and their perks.
        vocabulary = [v.lower() for values in SHIFT_TOPICS[0].slots.values() for v in values]
        assert all(any(v in example.lower() for v in vocabulary) for example in top["examples"])


def test_a_restarted_server_remembers_models_and_flushes_on_stop(tmp_path: Path) -> None:
    now = _test_now()
    with _server(tmp_path) as server, server.client() as client:
        send(client, traces(60, seed=9, start=now - timedelta(hours=2), span=timedelta(minutes=10)))
        server.flush()
    # Stopping flushed the windows; the next process knows model v1 and sees v2 as a change.
    with _server(tmp_path) as server, server.client() as client:
        send(
            client,
            traces(
                10, seed=10, start=now - timedelta(hours=1), span=timedelta(minutes=5), model="shop-embed-v2"
            ),
        )
        server.flush()
        assert server.metric("ragmon_embedding_model_changes_total", app="shop") == 1.0
        keys = server.pipeline.drift_store.window_keys("default", since=now - timedelta(days=1), until=now)
        assert keys == {("shop", "shop-embed-v1@32"): 60}


def test_scheduled_runs_wait_for_their_interval_and_the_gate(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'ragmon.db'}")
    store.create_schema()
    drift = DriftStore(store.engine)
    drift.create_schema()
    metrics = Metrics()
    sink = DriftWindowSink(DriftConfig(regeneration_min_baseline=1), metrics)
    open_gate = False
    scheduler = DriftScheduler(DriftConfig(interval_s=3600.0), drift, metrics, sink, gate=lambda: open_gate)
    try:
        asyncio.run(sink.consume_traces([_trace(i, hour=1) for i in range(20)]))
        assert scheduler.tick() == []  # gate closed: flushed, nothing run
        assert drift.window_keys(
            "default", since=datetime(2026, 1, 1, tzinfo=UTC), until=datetime(2026, 1, 2, tzinfo=UTC)
        )
        open_gate = True
        assert scheduler.tick() == []  # not due yet
        later = datetime.now(UTC) + timedelta(hours=2)
        ran = scheduler.run_due(later)
        assert [r.result.detector for r in ran] == ["regeneration_band"]
        assert ran[0].trigger == "schedule" and ran[0].result.n_window == 20
        assert scheduler.run_due(later + timedelta(minutes=1)) == []  # the next one is an interval away
        assert drift.monitor_states()  # the band's baseline survives a restart
    finally:
        store.close()
