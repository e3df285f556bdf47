"""Ingest's producer on librdkafka (`kafka.producer_client: librdkafka`), against a real broker: the
bus's guarantees as with kafka-python, every trace on the partition kafka-python would choose, and the
faults a producer meets (one that is not there; the frozen broker and the broker restarted under it
are test_kafka_pipelining.py's tests, run with each producer).

Records are keyed like ingest's (one key a trace) and their values name (trace, n), as in
test_kafka_pipelining.py, whose read-back helpers these tests share.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from kafka.errors import KafkaError

from service.bus.kafka_bus import KafkaBus
from service.bus.librdkafka_producer import LibrdkafkaProducer
from service.config import KafkaConfig
from service.metrics import Metrics
from tests.distributed.conftest import Broker
from tests.distributed.test_kafka_pipelining import _config
from tests.distributed.test_producer_process import _check_three_a_trace, _publish_three_a_trace
from tests.live_server import free_port

pytest.importorskip("confluent_kafka", reason="confluent-kafka (the kafka extra) is not installed")


def _librdkafka(bootstrap: str, **extra: object) -> KafkaConfig:
    return _config(bootstrap, producer_client="librdkafka", **extra)


async def test_every_record_is_acknowledged_in_order_on_kafka_pythons_partition(kafka_bootstrap: str) -> None:
    """3,000 records of 1,000 traces, published in three calls per trace, ten calls at once: every call
    returns acknowledged, each record is counted once, no producer process is started, and the topic
    holds every record once, each trace's three in publish order on the partition kafka-python's
    default partitioner gives its key."""
    config = _librdkafka(kafka_bootstrap)
    metrics = Metrics()
    bus = KafkaBus(config, metrics)
    assert bus.producer_processes == 0
    await bus.start()
    try:
        await _publish_three_a_trace(bus, config)
        assert isinstance(bus._producer, LibrdkafkaProducer)
        assert bus.depth == 0
    finally:
        await bus.stop()
    _check_three_a_trace(config, metrics)


def test_without_a_broker_every_record_is_reported_failed_within_the_delivery_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No broker at the bootstrap address: `send_many` returns at once and each record's outcome comes
    back as a `KafkaError` once the delivery timeout passes, none as acknowledged; `abort` returns at
    once. librdkafka's own lines about the refused connections stay out of the log at ragmon's usual
    levels (the bus logs the outage once, `OutageLog`)."""
    caplog.set_level(logging.INFO)
    port = free_port()
    config = KafkaConfig.model_validate(
        {
            "bootstrap_servers": [f"127.0.0.1:{port}"],
            "spans_topic": "nowhere",
            "delivery_timeout_s": 3,
            "request_timeout_s": 2,
            "max_block_s": 1,
        }
    )
    producer = LibrdkafkaProducer(config)
    outcomes: dict[int, Any] = {}
    done = threading.Event()

    def report(context: int, outcome: Any) -> None:
        outcomes[context] = outcome
        if len(outcomes) == 20:
            done.set()

    started = time.monotonic()
    producer.send_many([(i, "nowhere", b"k%d" % i, b"v", (), i % 2) for i in range(20)], report)
    assert time.monotonic() - started < 1.0
    assert done.wait(15)
    assert all(isinstance(outcome, KafkaError) for outcome in outcomes.values()), outcomes
    assert not [r for r in caplog.records if r.levelno >= logging.INFO], caplog.text
    started = time.monotonic()
    closer = producer.abort()
    assert time.monotonic() - started < 1.0
    assert closer is not None
    closer.join(10)
    assert not closer.is_alive()


def test_an_idle_producer_sends_at_once_a_busy_one_lingers(broker_factory: Callable[[], Broker]) -> None:
    """linger.ms batches records that come while others are on their way; a hand-over that finds nothing
    on its way is flushed at once. With a 3 s linger: a record sent to an idle producer is acknowledged
    within a second; with the broker frozen, one record goes out at once (idle) and a second, handed
    over while the first is unacknowledged, lingers: thawed, the first is acknowledged at once and the
    second not before its linger is over. (The very first record waits for the connection to its
    partition's leader, which the flush does not; it only warms up here.)"""
    from service.bus.kafka_client import ensure_topics

    broker = broker_factory()
    broker.start()
    config = _librdkafka(broker.bootstrap, linger_ms=3000, delivery_timeout_s=60, request_timeout_s=30)
    ensure_topics(config)
    producer = LibrdkafkaProducer(config)
    acked: dict[str, float] = {}
    done = threading.Event()

    def report(context: str, outcome: Any) -> None:
        assert outcome is True, outcome
        acked[context] = time.monotonic()
        done.set()

    try:
        producer.partition_count(config.spans_topic)
        # the first record also waits for the connection to its partition's leader
        producer.send_many([("warm", config.spans_topic, b"k0", b"v", (), None)], report)
        assert done.wait(10)
        started = time.monotonic()
        producer.send_many([("idle", config.spans_topic, b"k0", b"v", (), None)], report)
        while "idle" not in acked and time.monotonic() - started < 10:
            time.sleep(0.01)
        assert acked["idle"] - started < 1.0  # not the 3 s linger
        assert broker.pid is not None
        os.kill(broker.pid, signal.SIGSTOP)
        try:
            producer.send_many([("first", config.spans_topic, b"k1", b"v", (), None)], report)
            time.sleep(0.3)  # on its way: the next one finds it unacknowledged
            second_at = time.monotonic()
            producer.send_many([("second", config.spans_topic, b"k2", b"v", (), None)], report)
            time.sleep(0.5)
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        thawed = time.monotonic()
        deadline = thawed + 20
        while len(acked) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert set(acked) == {"warm", "idle", "first", "second"}
        assert acked["first"] - thawed < 1.5
        assert acked["second"] - second_at >= 2.5  # it waited for its linger
    finally:
        producer.close(10)
