"""`service/bus/backlog.py` against a real broker (tansu): the group's backlog per partition, exactly,
and the broker's reachability while it is down and after it is back."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Callable

from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from service.bus.backlog import BacklogWatcher, partition_backlog
from service.bus.kafka_bus import KafkaBus
from service.config import KafkaConfig
from service.metrics import Metrics
from tests.distributed.conftest import Broker, kafka_settings
from tests.distributed.traffic import traces


def _config(bootstrap: str, **extra: object) -> KafkaConfig:
    return KafkaConfig.model_validate({**kafka_settings(bootstrap, uuid.uuid4().hex[:12]), **extra})


async def _publish(config: KafkaConfig, n: int) -> None:
    bus = KafkaBus(config, Metrics())
    await bus.start()
    await bus.consume_traces(traces(n))  # batched: tansu's ListOffsets(latest) is then short of the end
    assert await bus.drain(30), "the test could not publish its traces"
    await bus.stop()


def _records_per_partition(config: KafkaConfig, topic: str, n: int) -> Counter[int]:
    """Read the topic back with a consumer of no group: how many records each partition holds."""
    consumer = KafkaConsumer(
        bootstrap_servers=config.bootstrap_servers, group_id=None, auto_offset_reset="earliest"
    )
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(partitions)
        consumer.seek_to_beginning()
        counts: Counter[int] = Counter()
        while sum(counts.values()) < n:
            for tp, records in consumer.poll(timeout_ms=1000).items():
                counts[tp.partition] += len(records)
        return counts
    finally:
        consumer.close()


def _commit(config: KafkaConfig, offsets: dict[TopicPartition, int]) -> None:
    """Commit `offsets` for the sinks group, as a sinks worker does after storing."""
    consumer = KafkaConsumer(
        bootstrap_servers=config.bootstrap_servers, group_id=config.sinks_group, enable_auto_commit=False
    )
    try:
        consumer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in offsets.items()})
    finally:
        consumer.close()


def _gauge(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_partition_backlog_counts_from_the_committed_offset_or_the_log_start() -> None:
    assert partition_backlog(1500, 100, 0) == 1400
    assert partition_backlog(1500, None, 0) == 1500  # never committed: read from the start
    assert partition_backlog(1500, -1, 200) == 1300  # the broker's "none", with a trimmed log
    assert partition_backlog(10, 40, 0) == 0  # committed past the end (a recreated topic)


async def test_the_backlog_is_what_the_group_has_not_committed_per_partition(kafka_bootstrap: str) -> None:
    config = _config(kafka_bootstrap)
    n = 2000
    await _publish(config, n)
    held = await asyncio.to_thread(_records_per_partition, config, config.traces_topic, n)
    assert sum(held.values()) == n and len(held) == config.partitions
    metrics = Metrics()
    watcher = BacklogWatcher(config, metrics)
    try:
        # nothing committed yet: every record is backlog (spans and feedback topics are empty)
        assert await watcher.refresh()
        on_traces = {p: v for (topic, p), v in watcher.backlog.items() if topic == config.traces_topic}
        assert on_traces == dict(held)
        assert watcher.total == n
        assert _gauge(metrics, "ragmon_kafka_reachable") == 1.0
        assert (_gauge(metrics, "ragmon_kafka_last_contact_timestamp_seconds") or 0) > 0
        for partition, records in held.items():
            labels = {"group": config.sinks_group, "topic": config.traces_topic, "partition": str(partition)}
            assert _gauge(metrics, "ragmon_kafka_backlog_records", **labels) == records

        # the group stores (commits) partition 0 completely and half of partition 1
        first, second = TopicPartition(config.traces_topic, 0), TopicPartition(config.traces_topic, 1)
        await asyncio.to_thread(_commit, config, {first: held[0], second: held[1] // 2})
        assert await watcher.refresh()
        assert watcher.backlog[(config.traces_topic, 0)] == 0
        assert watcher.backlog[(config.traces_topic, 1)] == held[1] - held[1] // 2
        assert watcher.total == n - held[0] - held[1] // 2
    finally:
        await watcher.stop()


async def test_an_unreachable_broker_shows_as_such_not_as_an_empty_backlog(
    broker_factory: Callable[[], Broker],
) -> None:
    broker = broker_factory()  # its port is chosen; nothing listens there yet
    config = _config(broker.bootstrap, request_timeout_s=2)
    metrics = Metrics()
    watcher = BacklogWatcher(config, metrics)
    try:
        assert not await watcher.refresh()
        assert _gauge(metrics, "ragmon_kafka_reachable") == 0.0
        assert _gauge(metrics, "ragmon_kafka_last_contact_timestamp_seconds") == 0.0  # never reached

        broker.start()
        await _publish(config, 300)
        assert await watcher.refresh()
        assert watcher.total == 300
        assert _gauge(metrics, "ragmon_kafka_reachable") == 1.0
        contact = _gauge(metrics, "ragmon_kafka_last_contact_timestamp_seconds")
        assert contact is not None and contact > 0

        broker.stop()
        assert not await watcher.refresh()
        # unknown, so absent: neither the last value nor a made-up 0
        assert watcher.backlog == {}
        assert "ragmon_kafka_backlog_records" not in _exposed(metrics)
        assert _gauge(metrics, "ragmon_kafka_reachable") == 0.0
        assert _gauge(metrics, "ragmon_kafka_last_contact_timestamp_seconds") == contact
    finally:
        await watcher.stop()


def _exposed(metrics: Metrics) -> str:
    from prometheus_client import generate_latest

    return "\n".join(
        line for line in generate_latest(metrics.registry).decode().splitlines() if not line.startswith("#")
    )
