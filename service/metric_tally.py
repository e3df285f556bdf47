"""How `Metrics` writes batches into prometheus-client and reads state at scrape time.

`Tally` gathers one batch's increments and observations per series and `observe_many`
observes a histogram series' values in one pass, so `Metrics.count_traces` touches each
labelled series once a batch (bench/RESULTS.md, session 23). `StateCollector` computes
gauges at scrape time from callables the pipeline registers (queue depth, open traces,
review items).
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

_log = logging.getLogger(__name__)

LabelledValues = Iterable[tuple[Sequence[str], float]]


class StateCollector(Collector):
    """Gauges computed at scrape time from callables (queue depth, open traces, ...)."""

    def __init__(self) -> None:
        self._gauges: dict[str, tuple[str, Callable[[], float]]] = {}
        self._families: dict[str, tuple[str, Sequence[str], Callable[[], LabelledValues]]] = {}

    def add(self, name: str, documentation: str, read: Callable[[], float]) -> None:
        self._gauges[name] = (documentation, read)

    def add_family(
        self, name: str, documentation: str, labels: Sequence[str], read: Callable[[], LabelledValues]
    ) -> None:
        """A labelled gauge: `read` returns (label values, value) pairs, one per series."""
        self._families[name] = (documentation, tuple(labels), read)

    def collect(self, names: Collection[str] | None = None) -> Iterable[GaugeMetricFamily]:
        """Every gauge read now, or only those in `names` (the others are not read)."""
        # A gauge whose source fails (the database is down) is left out of this scrape instead of
        # failing the whole scrape: every other metric must stay visible during an outage.
        for name, (documentation, read) in sorted(self._gauges.items()):
            if names is not None and name not in names:
                continue
            try:
                value = float(read())
            except Exception:
                _log.debug("scrape-time gauge %s unavailable", name, exc_info=True)
                continue
            yield GaugeMetricFamily(name, documentation, value=value)
        for name, (documentation, labels, read_family) in sorted(self._families.items()):
            if names is not None and name not in names:
                continue
            family = GaugeMetricFamily(name, documentation, labels=labels)
            try:
                for values, value in read_family():
                    family.add_metric(list(values), float(value))
            except Exception:
                _log.debug("scrape-time gauge %s unavailable", name, exc_info=True)
                continue
            yield family

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return []


def observe_many(histogram: Any, values: Sequence[float]) -> None:
    """`histogram.observe(v)` for each of `values` (a labelled child of a prometheus-client
    `Histogram`), with one increment per bucket that got any and one for the sum.

    prometheus-client has no batch observe, so this reads the child's bucket bounds and
    values (`_upper_bounds`, `_buckets`, `_sum`), as `Histogram.observe` does;
    tests/service/test_metric_tally.py holds it to the one-by-one result, so a
    library release that moved them fails there, not in production. A value lands
    in the first bucket whose bound is >= it; NaN lands in none, but is summed,
    as `observe` does."""
    bounds = histogram._upper_bounds
    counts: dict[int, int] = {}
    for value in values:
        if value == value:  # NaN compares unequal to itself, and `observe` buckets it nowhere
            index = bisect_left(bounds, value)
            counts[index] = counts.get(index, 0) + 1
    buckets = histogram._buckets
    for index, count in counts.items():
        buckets[index].inc(count)
    histogram._sum.inc(sum(values))


class Tally:
    """One batch's counter increments and histogram observations, keyed by series
    (metric, label values), in first-seen order."""

    __slots__ = ("increments", "observations")

    def __init__(self) -> None:
        self.increments: dict[tuple[Counter, tuple[str, ...]], float] = {}
        self.observations: dict[tuple[Histogram, tuple[str, ...]], list[float]] = {}

    def inc(self, series: tuple[Counter, tuple[str, ...]], amount: float = 1) -> None:
        self.increments[series] = self.increments.get(series, 0) + amount

    def observe(self, series: tuple[Histogram, tuple[str, ...]], value: float) -> None:
        values = self.observations.get(series)
        if values is None:
            self.observations[series] = [value]
        else:
            values.append(value)
