"""`observe_many` must leave a histogram series as observing its values one by one does: it
reads prometheus-client's private bucket fields, so a library release that moved them fails here."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Histogram

from service.metric_base import DURATION_BUCKETS
from service.metric_tally import observe_many
from tests.prometheus_samples import assert_same, samples


def test_observe_many_fills_the_buckets_and_sum_as_observe_does() -> None:
    values = [
        0.0,
        -1.0,  # below every bound: the first bucket
        0.005,  # exactly on a bound: that bucket (le is inclusive)
        0.0050000001,
        0.3,
        2.0,
        59.9,
        60.0,
        61.0,  # past the last finite bound: +Inf only
        math.inf,
        1e300,
    ]
    batched, one_by_one = CollectorRegistry(), CollectorRegistry()
    a = Histogram("h_seconds", "h", ["app"], buckets=DURATION_BUCKETS, registry=batched)
    b = Histogram("h_seconds", "h", ["app"], buckets=DURATION_BUCKETS, registry=one_by_one)
    observe_many(a.labels("x"), values)
    for value in values:
        b.labels("x").observe(value)
    assert_same(batched, one_by_one)
    assert samples(batched)[("h_seconds_count", (("app", "x"),))] == len(values)
    assert samples(batched)[("h_seconds_bucket", (("app", "x"), ("le", "0.005")))] == 3


def test_observe_many_puts_nan_in_no_bucket_but_in_the_sum_as_observe_does() -> None:
    batched, one_by_one = CollectorRegistry(), CollectorRegistry()
    a = Histogram("h", "h", buckets=(1.0, 2.0), registry=batched)
    b = Histogram("h", "h", buckets=(1.0, 2.0), registry=one_by_one)
    observe_many(a, [0.5, math.nan, 1.5])
    for value in (0.5, math.nan, 1.5):
        b.observe(value)
    assert_same(batched, one_by_one)
    assert samples(batched)[("h_count", ())] == 2  # the +Inf bucket: NaN is not <= +Inf
