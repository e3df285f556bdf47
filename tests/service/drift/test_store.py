"""`DriftStore` and the sampling arithmetic behind it, on SQLite and PostgreSQL."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from detectors import DriftResult
from service.drift.pinning import pin_references
from service.drift.sample import Observation, Sample, draw_counts, merge_counts
from service.drift.store import BucketBatch, DriftStore, RunRecord, bucket_start
from service.store.trace_store import Store

T0 = datetime(2026, 3, 2, 10, tzinfo=UTC)


def _obs(i: int, at: datetime, *, dim: int = 8, release: str | None = None, tag: str = "a") -> Observation:
    rng = np.random.default_rng(i)
    return Observation(
        trace_id=f"{i:032x}",
        time=at,
        release=release,
        query=f"{tag} query {i}",
        vector=rng.standard_normal(dim).astype(np.float32),
        top1=float(rng.random()),
        topk=float(rng.random()),
        empty=bool(i % 7 == 0),
        hit=f"doc-{i % 5}",
    )


def _batch(start: int, n: int, at: datetime, seen: int | None = None, **kw: object) -> BucketBatch:
    return BucketBatch(
        "default",
        "app",
        "m@8",
        at,
        seen if seen is not None else n,
        [_obs(start + i, at, **kw) for i in range(n)],  # type: ignore[arg-type]
    )


def test_merge_keeps_the_old_share_proportional_to_traffic() -> None:
    # 300 old traces (100 kept) merged with 700 new ones (100 kept) into 100 rows: ~30 old on average.
    draws = [merge_counts(300, 100, 700, 100, 100, np.random.default_rng(seed)) for seed in range(400)]
    assert all(old + new == 100 and old <= 100 and new <= 100 for old, new in draws)
    olds = np.array([old for old, _ in draws], dtype=float)
    expected, sd = 30.0, math.sqrt(100 * 0.3 * 0.7 * 900 / 999)
    assert abs(olds.mean() - expected) < 4 * sd / math.sqrt(len(olds))


def test_merge_below_capacity_keeps_everything_and_rejects_impossible_counts() -> None:
    assert merge_counts(10, 10, 5, 5, 100, np.random.default_rng(0)) == (10, 5)
    with pytest.raises(ValueError, match="kept counts"):
        merge_counts(5, 10, 5, 5, 100, np.random.default_rng(0))


def test_draw_weights_buckets_by_their_traffic_not_their_rows() -> None:
    # A busy hour (1,000 traces) and a quiet one (100), each holding 100 rows.
    draws = [draw_counts([1000, 100], [100, 100], 2000, np.random.default_rng(seed)) for seed in range(300)]
    assert all(a <= 100 and b <= 100 for a, b in draws)
    totals = {a + b for a, b in draws}
    assert max(totals) <= 110  # capped so the busy hour is not asked for more rows than it has
    share = np.mean([a / (a + b) for a, b in draws])
    # hypergeometric share of 110 from 1,100; sd of one share ≈ sqrt(p(1-p)/110)
    sd = math.sqrt((1000 / 1100) * (100 / 1100) / 110)
    assert abs(share - 1000 / 1100) < 4 * sd / math.sqrt(len(draws)) + 0.01


def test_bucket_stays_within_capacity_and_counts_all_traffic(store: Store) -> None:
    drift = DriftStore(store.engine, bucket_capacity=50)
    drift.create_schema()
    for flush in range(6):
        drift.add_observations([_batch(1000 * flush, 40, T0, seen=400)], seed=flush)
    sample, represented, excluded = drift.draw(
        "default", "app", "m@8", since=T0, until=T0 + timedelta(hours=1), capacity=1000
    )
    assert len(sample) == 50
    assert represented == 6 * 400
    assert excluded == 0
    # Rows come from several flushes, not only the last one.
    flushes = {int(o.trace_id, 16) // 1000 for o in sample.observations}
    assert len(flushes) >= 3


def test_reference_round_trip_versions_and_listing(store: Store) -> None:
    drift = DriftStore(store.engine, bucket_capacity=100)
    drift.create_schema()
    drift.add_observations([_batch(0, 60, T0, release="r1"), _batch(100, 60, T0 + timedelta(hours=1))])
    first = pin_references(drift, "default", since=T0, until=T0 + timedelta(hours=2), min_size=10)
    second = pin_references(drift, "default", release="r1", min_size=10)
    assert [r.label for r in first.pinned] == ["app/m@8/v1"]
    assert [r.label for r in second.pinned] == ["app/m@8/v2"]
    assert first.pinned[0].n == 120 and second.pinned[0].n == 60
    assert second.pinned[0].release == "r1"
    listed = drift.references("default")
    assert [r.version for r in listed] == [2, 1]
    assert [r.version for r in drift.latest_references("default")] == [2]
    sample = drift.reference_sample(first.pinned[0].id)
    by_id = {o.trace_id: o for o in sample.observations}
    original = _obs(5, T0, release="r1")
    stored = by_id[original.trace_id]
    assert stored.vector is not None and original.vector is not None
    assert stored.vector.dtype == np.float32 and np.array_equal(stored.vector, original.vector)
    assert (stored.top1, stored.hit, stored.release) == (original.top1, original.hit, "r1")
    assert first.pinned[0].content_hash != second.pinned[0].content_hash
    assert drift.references("other-tenant") == []


def test_pin_needs_a_range_or_a_release(store: Store) -> None:
    drift = DriftStore(store.engine)
    drift.create_schema()
    with pytest.raises(ValueError, match="range"):
        pin_references(drift, "default")
    with pytest.raises(ValueError, match="before it starts"):
        pin_references(drift, "default", since=T0, until=T0 - timedelta(hours=1))


def _run(detector: str, drifted: bool, at: datetime, alarm: bool = False) -> RunRecord:
    result = DriftResult(
        detector=detector,
        version="1",
        reference_id="app/m@8/v1",
        window_start=at - timedelta(hours=1),
        window_end=at,
        n_reference=100,
        n_window=100,
        statistic=0.5,
        p_value=0.01 if drifted else 0.5,
        alpha=0.05,
        drifted=drifted,
        details={"statistic_name": "x"},
    )
    outcome = "drift" if drifted else "ok"
    return RunRecord("default", "app", "m@8", None, result, alarm, outcome, "schedule", at, [{"g": 1}])


def test_runs_are_stored_whole_and_filtered(store: Store) -> None:
    drift = DriftStore(store.engine)
    drift.create_schema()
    drift.add_runs(
        [_run("query_embedding_mmd", True, T0, alarm=True), _run("retrieval_top1_score", False, T0)]
    )
    drift.add_runs([_run("query_embedding_mmd", False, T0 + timedelta(hours=1))])
    runs = drift.runs("default", detector="query_embedding_mmd")
    assert [r.result.drifted for r in runs] == [False, True]  # newest first
    assert runs[1].result.p_value == 0.01 and runs[1].explanation == [{"g": 1}]
    assert runs[1].result.window_start == T0 - timedelta(hours=1)
    assert [r.result.detector for r in drift.runs("default", alarm=True)] == ["query_embedding_mmd"]
    assert drift.runs("default", since=T0 + timedelta(minutes=30))[0].ran_at == T0 + timedelta(hours=1)
    assert drift.alarming_ranges("default", "app", "m@8") == [(T0 - timedelta(hours=1), T0)]
    with pytest.raises(ValueError, match="limit"):
        drift.runs("default", limit=0)


def test_buckets_align_and_old_data_is_deleted(store: Store) -> None:
    assert bucket_start(T0 + timedelta(minutes=59), 3600) == T0
    drift = DriftStore(store.engine)
    drift.create_schema()
    drift.add_observations([_batch(0, 5, T0), _batch(10, 5, T0 + timedelta(days=3))])
    drift.add_runs([_run("query_embedding_mmd", False, T0)])
    drift.delete_older_than(T0 + timedelta(days=1))
    assert drift.window_keys("default", since=T0 - timedelta(days=1), until=T0 + timedelta(days=5)) == {
        ("app", "m@8"): 5
    }
    assert drift.runs("default") == []


def test_sample_arrays_skip_missing_values() -> None:
    observations = (
        _obs(1, T0),
        Observation(trace_id="0" * 32, time=T0, query=None, top1=None, empty=None, hit=None),
    )
    sample = Sample(observations)
    vectors, texts = sample.vectors()
    assert vectors.shape == (1, 8) and texts == ["a query 1"]
    assert sample.scores("top1").size == 1 and sample.empty_flags().size == 1 and sample.hits().size == 1
    with pytest.raises(ValueError):
        sample.scores("nope")


def test_merge_of_a_saturated_reservoir_keeps_every_trace_equally_likely() -> None:
    # 100 old traces all kept, then a flush whose reservoir kept 250 of 1,000: keeping all 350 rows would
    # give an old trace a 100 % chance and a new one 25 %. The merge keeps 275 rows, ~25 of them old.
    draws = [merge_counts(100, 100, 1000, 250, 2000, np.random.default_rng(seed)) for seed in range(400)]
    assert {old + new for old, new in draws} == {275}
    assert all(old <= 100 and new <= 250 for old, new in draws)
    olds = np.array([old for old, _ in draws], dtype=float)
    # each old trace's chance (mean old rows / 100) equals each new trace's ((275 - mean) / 1,000)
    assert abs(olds.mean() / 100 - (275 - olds.mean()) / 1000) < 0.002


def test_draw_keeps_only_rows_inside_the_range_where_a_bucket_straddles_its_edge(store: Store) -> None:
    drift = DriftStore(store.engine, bucket_capacity=100)
    drift.create_schema()
    rows = [_obs(i, T0 + timedelta(minutes=i)) for i in range(60)]
    drift.add_observations([BucketBatch("default", "app", "m@8", T0, 60, rows)])
    sample, represented, _ = drift.draw(
        "default",
        "app",
        "m@8",
        since=T0 + timedelta(minutes=20),
        until=T0 + timedelta(minutes=50),
        capacity=100,
    )
    assert sorted(int(o.trace_id, 16) for o in sample.observations) == list(range(20, 50))
    assert represented == 30


def test_compact_cuts_old_buckets_only_and_keeps_their_traffic_count(store: Store) -> None:
    drift = DriftStore(store.engine, bucket_capacity=200)
    drift.create_schema()
    old, recent = T0, T0 + timedelta(hours=30)
    drift.add_observations([_batch(0, 150, old, seen=600), _batch(1000, 150, recent, seen=600)])
    gone = drift.compact(T0 + timedelta(hours=24), 40)
    assert gone == 110
    old_sample, old_seen, _ = drift.draw(
        "default", "app", "m@8", since=old, until=old + timedelta(hours=1), capacity=1000
    )
    recent_sample, _, _ = drift.draw(
        "default", "app", "m@8", since=recent, until=recent + timedelta(hours=1), capacity=1000
    )
    assert (len(old_sample), old_seen, len(recent_sample)) == (40, 600, 150)
    assert drift.compact(T0 + timedelta(hours=24), 40) == 0
