"""Ingest's producer compression against a real broker: zstd by default, and gzip wherever zstd cannot
work (`new_producer`'s fallbacks, and the bus's once a broker refuses zstd batches: tansu behind
`CodecRefusingProxy`), in the server's thread and in producer processes alike.

Every test reads its records back: a codec only counts when the broker took the batches and a
consumer decoded them.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

import pytest

from service.bus.kafka_bus import KafkaBus
from service.bus.kafka_client import compression_of, new_producer, producer_settings
from service.bus.producer_process import Producer, ProducerGroup, ThreadProducer
from service.config import KafkaConfig
from service.metrics import Metrics
from tests.distributed.codec_refusing_proxy import CodecRefusingProxy
from tests.distributed.conftest import ROOT, Broker
from tests.distributed.test_kafka_pipelining import _config, _first_occurrences, _read_back, _record
from tests.live_server import free_port

# what kafka-python's bootstrap learns from a broker older than Kafka 2.1 (the first with zstd);
# given as a setting, it skips the probe and speaks that version's protocol to the real broker.
# Without the idempotent producer: tansu answers that version's InitProducerId with an unknown error.
BEFORE_ZSTD = {"api_version": (2, 0), "enable_idempotence": False}


def _acknowledge_all(producer: Producer, config: KafkaConfig, traces: int) -> None:
    """Send one record per trace through `producer` and wait until each is acknowledged."""
    outcomes: list[tuple[int, object]] = []
    topic = config.spans_topic
    records = [
        (t, topic, f"{t:032x}".encode(), f"{t}:0".encode() + b"." * 200, (), None) for t in range(traces)
    ]
    producer.send_many(records, lambda context, outcome: outcomes.append((context, outcome)))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(outcomes) < traces:
        time.sleep(0.05)
    failed = [o for o in outcomes if isinstance(o[1], BaseException)]
    assert not failed, failed[:3]
    assert len(outcomes) == traces


async def test_zstd_is_the_default_and_every_record_is_read_back(kafka_bootstrap: str) -> None:
    """At the defaults the producer processes compress with zstd, the metric says so, and 600 records
    published in six calls are acknowledged and read back once each."""
    assert KafkaConfig().compression == "zstd"
    config = _config(kafka_bootstrap, producer_processes=2)
    metrics = Metrics()
    bus = KafkaBus(config, metrics)
    await bus.start()
    try:
        for call in range(6):
            await bus.publish([_record(config, t, 0) for t in range(call * 100, call * 100 + 100)])
        assert bus._producer is not None and bus._producer.compression == "zstd"
    finally:
        await bus.stop()
    codecs = {
        codec: metrics.registry.get_sample_value("ragmon_kafka_producer_compression_info", {"codec": codec})
        for codec in ("none", "gzip", "zstd")
    }
    assert codecs == {"none": 0.0, "gzip": 0.0, "zstd": 1.0}
    assert _first_occurrences(_read_back(config, 600)) == {t: [0] for t in range(600)}


@pytest.mark.parametrize(
    "open_producer",
    [ThreadProducer, lambda settings: ProducerGroup(settings, 2)],
    ids=["thread", "processes"],
)
def test_a_broker_older_than_kafka_2_1_gets_gzip(
    kafka_bootstrap: str, open_producer: Callable[[dict[str, Any]], Producer]
) -> None:
    """A broker whose version predates zstd: kafka-python refuses to build a zstd producer, and
    `new_producer` builds a gzip one instead, in the server's thread and in a producer process; the
    broker takes its batches."""
    config = _config(kafka_bootstrap)
    producer = open_producer({**producer_settings(config), **BEFORE_ZSTD})
    try:
        assert producer.compression == "gzip"
        _acknowledge_all(producer, config, 200)
    finally:
        producer.close(10)
    assert _first_occurrences(_read_back(config, 200)) == {t: [0] for t in range(200)}
    # a codec other than zstd is left as asked
    explicit = new_producer({**producer_settings(config, "none"), **BEFORE_ZSTD})
    try:
        assert compression_of(explicit) == "none"
    finally:
        explicit.close(timeout=10)


def test_without_the_zstandard_package_the_producer_uses_gzip(kafka_bootstrap: str) -> None:
    """ragmon installed without its kafka extra's zstandard: the default (zstd) producer compresses
    with gzip, warns once, and the broker takes its batches; the consumer side reads them."""
    config = _config(kafka_bootstrap)
    script = textwrap.dedent(
        f"""
        import logging, sys
        sys.modules["zstandard"] = None  # import zstandard now raises ImportError, as when not installed
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        from service.bus.kafka_client import compression_of, new_producer, producer_settings
        from service.config import KafkaConfig
        config = KafkaConfig.model_validate_json({config.model_dump_json()!r})
        producer = new_producer(producer_settings(config))
        for t in range(100):
            producer.send(config.spans_topic, key=b"%032x" % t, value=b"%d:0." % t + b"." * 200)
        producer.flush(timeout=30)
        print(compression_of(producer), flush=True)
        producer.close(timeout=10)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "gzip"
    assert done.stderr.count("zstandard package is not installed") == 1, done.stderr[-2000:]
    assert _first_occurrences(_read_back(config, 100)) == {t: [0] for t in range(100)}


@pytest.mark.parametrize(
    "producer",
    [{"producer_processes": 0}, {"producer_processes": 2}, {"producer_client": "librdkafka"}],
    ids=["thread", "processes", "librdkafka"],
)
async def test_a_broker_that_refuses_zstd_gets_the_same_records_in_gzip(
    broker_factory: Callable[[], Broker], producer: dict[str, object]
) -> None:
    """A broker that speaks Kafka 2.1+ but answers zstd batches with UNSUPPORTED_COMPRESSION_TYPE (tansu
        behind a proxy that refuses them): every publish still returns acknowledged, because the refused
        records go again through a gzip producer, which the broker takes; the bus keeps gzip from then on,
        and the metric says so. Every record is in the topic, each trace's first occurrences in order. The
    same with kafka-python in the server process, in processes of its own, and with librdkafka."""
    broker = broker_factory()
    proxy = CodecRefusingProxy(free_port(), broker.port).start()
    broker.env["KAFKA_ADVERTISED_PORT"] = str(proxy.port)
    broker.start()
    try:
        config = _config(f"127.0.0.1:{proxy.port}", **producer)
        metrics = Metrics()
        bus = KafkaBus(config, metrics)
        await bus.start()
        try:
            await asyncio.wait_for(
                asyncio.gather(*(bus.publish([_record(config, t, n) for t in range(100)]) for n in range(3))),
                120,
            )
            refused_once = proxy.refused
            await bus.publish([_record(config, t, 3) for t in range(100)])
            assert bus._producer is not None and bus._producer.compression == "gzip"
        finally:
            await bus.stop()
        assert refused_once >= 1  # the first batches went as zstd and were refused
        assert proxy.refused == refused_once  # after the fallback nothing more is zstd
        gauge = metrics.registry.get_sample_value
        assert gauge("ragmon_kafka_producer_compression_info", {"codec": "gzip"}) == 1.0
        assert gauge("ragmon_kafka_producer_compression_info", {"codec": "zstd"}) == 0.0
        firsts = _first_occurrences(_read_back(config, 400))
        assert firsts == {t: [0, 1, 2, 3] for t in range(100)}
    finally:
        proxy.stop()
