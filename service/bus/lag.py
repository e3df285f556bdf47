"""Consumer lag per group and partition, from the fetch high watermark, and its export as a gauge.

Lag is `highwater - position`: the records the broker holds past the next
offset this consumer will process. The high watermark comes from the fetch
responses (`KafkaConsumer.highwater`), not from `end_offsets()`, which some
Kafka-protocol brokers (tansu) answer with the base offset of the last batch
plus one. A partition is left out until a fetch has reported its high
watermark, so a fresh assignment never shows a made-up value.

This is a worker's reading progress only: a spans record is read long before
its trace is stored, and a dead worker's partitions have no lag until another
owns them. The backlog (`backlog.py`) is what alerts and autoscaling use.
"""

from __future__ import annotations

from typing import Any

from kafka.errors import KafkaError
from prometheus_client import Gauge

__all__ = ["LagExporter", "partition_lags"]


def partition_lags(consumer: Any) -> dict[tuple[str, int], int]:
    """(topic, partition) -> records behind, for each assigned partition whose high watermark is known.

    Call it on the consumer's own thread, after a poll or a commit.
    """
    lags: dict[tuple[str, int], int] = {}
    for tp in consumer.assignment():
        highwater = consumer.highwater(tp)
        if highwater is None:
            continue
        try:
            position = consumer.position(tp, timeout_ms=0)
        except KafkaError:
            continue
        if position is None:
            continue
        lags[(tp.topic, tp.partition)] = max(0, int(highwater) - int(position))
    return lags


class LagExporter:
    """Keeps `ragmon_kafka_consumer_lag{group,topic,partition}` equal to the latest lags of one consumer.

    Partitions this consumer no longer owns lose their series, so after a
    rebalance a partition is reported by its new owner only.
    """

    def __init__(self, gauge: Gauge, group: str) -> None:
        self.gauge = gauge
        self.group = group
        self._exported: set[tuple[str, int]] = set()

    def update(self, lags: dict[tuple[str, int], int]) -> None:
        for topic, partition in self._exported - lags.keys():
            self.gauge.remove(self.group, topic, str(partition))
        for (topic, partition), lag in lags.items():
            self.gauge.labels(group=self.group, topic=topic, partition=str(partition)).set(lag)
        self._exported = set(lags)
