"""`KafkaBus` with several produce requests in flight, against a real broker: a 200 still means
acknowledged, and a trace's records keep their order, also across a broker fault mid-flight.

Records here are keyed like ingest's (one key a trace) and their values name (trace, n): the n-th
record published for that trace. Each test reads its topic back from the beginning and checks, per
trace, that every acknowledged record is there and that first occurrences come in publish order
(a resend after a fault may add a later duplicate; consumers drop those by span id).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Callable

import pytest
from kafka import KafkaConsumer, TopicPartition

from service.bus.kafka_bus import _SEND_CHUNK, KafkaBus, OutRecord
from service.bus.kafka_client import client_settings
from service.config import KafkaConfig
from service.errors import QueueFull
from service.metrics import Metrics
from tests.distributed.conftest import Broker, kafka_settings


def _config(bootstrap: str, **extra: object) -> KafkaConfig:
    return KafkaConfig.model_validate({**kafka_settings(bootstrap, uuid.uuid4().hex[:12]), **extra})


def _record(config: KafkaConfig, trace: int, n: int) -> OutRecord:
    return OutRecord(config.spans_topic, f"{trace:032x}".encode(), f"{trace}:{n}".encode() + b"." * 200)


def _read_back(config: KafkaConfig, expect_at_least: int, quiet_s: float = 3.0) -> list[tuple[int, int]]:
    """Every record of the spans topic, partition by partition in offset order, as (trace, n)."""
    consumer = KafkaConsumer(enable_auto_commit=False, **client_settings(config))
    try:
        partitions = [TopicPartition(config.spans_topic, p) for p in range(config.partitions)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        by_partition: dict[int, list[tuple[int, int]]] = {p: [] for p in range(config.partitions)}
        last = time.monotonic()
        deadline = last + 120
        while time.monotonic() < deadline:
            polled = consumer.poll(timeout_ms=500)
            for tp, records in polled.items():
                for r in records:
                    trace, n = r.value.split(b".", 1)[0].decode().split(":")
                    by_partition[tp.partition].append((int(trace), int(n)))
                last = time.monotonic()
            seen = sum(len(v) for v in by_partition.values())
            if seen >= expect_at_least and time.monotonic() - last > quiet_s:
                break
        return [item for p in sorted(by_partition) for item in by_partition[p]]
    finally:
        consumer.close()


def _first_occurrences(records: list[tuple[int, int]]) -> dict[int, list[int]]:
    """Per trace, its record numbers in the order they first appear in the topic."""
    firsts: dict[int, list[int]] = {}
    seen: set[tuple[int, int]] = set()
    for trace, n in records:  # one trace's records share a partition: this is their offset order
        if (trace, n) not in seen:
            seen.add((trace, n))
            firsts.setdefault(trace, []).append(n)
    return firsts


async def _until(check: Callable[[], bool], timeout: float = 30) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.02)


@pytest.mark.parametrize(
    "producer", [{}, {"producer_client": "librdkafka"}], ids=["kafka-python", "librdkafka"]
)
async def test_records_go_to_the_producer_before_earlier_ones_are_acknowledged_one_per_trace(
    broker_factory: Callable[[], Broker], producer: dict[str, object]
) -> None:
    """With the broker frozen (no acknowledgement can come), every record of three concurrent calls is
    handed to the producer: more than one hand-over (`_SEND_CHUNK`) in flight at once, where a bus that
    waited for each chunk's acknowledgements would stop at one. A fourth call's records, each the
    second record of a trace already in flight, wait behind it; none of the four calls returns before
    the broker acknowledged all its records. Unfrozen, everything is acknowledged and every trace's
    two records are in the topic in publish order."""
    broker = broker_factory()
    broker.start()
    timeouts = {"publish_timeout_s": 60, "delivery_timeout_s": 90, "request_timeout_s": 60}
    config = _config(broker.bootstrap, **producer, **timeouts)
    bus = KafkaBus(config, Metrics())
    await bus.start()
    per_call = 1000
    assert 3 * per_call > _SEND_CHUNK
    try:
        await bus.publish([_record(config, 10**6, 0)])  # metadata known: sends need no broker answer
        assert broker.pid is not None
        os.kill(broker.pid, signal.SIGSTOP)
        try:
            first = [
                asyncio.create_task(
                    bus.publish([_record(config, c * per_call + t, 0) for t in range(per_call)])
                )
                for c in range(3)
            ]
            await _until(lambda: bus.in_flight == 3 * per_call)
            second = asyncio.create_task(bus.publish([_record(config, t, 1) for t in range(per_call)]))
            await _until(lambda: bus.depth == 4 * per_call)
            await asyncio.sleep(0.5)
            assert bus.in_flight == 3 * per_call  # the second records of traces 0..999 wait
            assert not any(task.done() for task in [*first, second])
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        await asyncio.wait_for(asyncio.gather(*first, second), 60)
        assert bus.depth == 0
    finally:
        await bus.stop()
    records = _read_back(config, 4 * per_call + 1)
    firsts = _first_occurrences(records)
    assert {trace for trace in firsts} == set(range(3 * per_call)) | {10**6}
    for trace in range(per_call):
        assert firsts[trace] == [0, 1], trace
    assert all(firsts[trace] == [0] for trace in range(per_call, 3 * per_call))


@pytest.mark.parametrize(
    ("outage_s", "producer"),
    [
        (3, {}),
        (10, {}),
        (10, {"producer_processes": 0}),
        (3, {"producer_client": "librdkafka"}),
        (10, {"producer_client": "librdkafka"}),
    ],
    ids=[
        "3s-producer-processes",
        "10s-producer-processes",
        "10s-producer-thread",
        "3s-librdkafka",
        "10s-librdkafka",
    ],
)
async def test_broker_restarted_mid_flight_nothing_acknowledged_is_lost_no_trace_out_of_order(
    outage_s: float, producer: dict[str, object], durable_broker: Broker
) -> None:
    """Callers publish three records per trace in three calls each, many calls in flight at once,
    while the (S3-backed) broker is stopped and started again under them. A short outage is bridged
    by the producer's own retries; a long one outlasts its delivery timeout, so the bus gives the
    producer up and resends what it held with a new one. Either way every call that returned is in
    the topic; calls refused meanwhile (QueueFull: 503) are counted; per trace, the records' first
    occurrences are in publish order. The same with the producer in processes of its own (the default
    with a CPU to spare), in a thread of the server process (`producer_processes: 0`) and on librdkafka
    (`producer_client: librdkafka`)."""
    timeouts = {"publish_timeout_s": 4, "delivery_timeout_s": 6, "request_timeout_s": 5}
    config = _config(durable_broker.bootstrap, **producer, **timeouts)
    metrics = Metrics()
    bus = KafkaBus(config, metrics)
    await bus.start()
    acked: set[tuple[int, int]] = set()
    refused = 0
    next_trace = 0
    stop = asyncio.Event()

    async def caller(worker: int) -> None:
        nonlocal refused, next_trace
        while not stop.is_set():
            traces = list(range(next_trace, next_trace + 20))
            next_trace += 20
            # the three records of each trace in three calls, all three pending at once
            calls = [bus.publish([_record(config, t, n) for t in traces]) for n in range(3)]
            for n, outcome in enumerate(await asyncio.gather(*calls, return_exceptions=True)):
                if outcome is None:
                    acked.update((t, n) for t in traces)
                elif isinstance(outcome, QueueFull):
                    refused += 1
                    await asyncio.sleep(0.2)
                else:
                    raise outcome

    callers = [asyncio.create_task(caller(w)) for w in range(8)]
    try:
        await _until(lambda: len(acked) >= 3000, timeout=60)
        await _until(lambda: bus.in_flight > 0, timeout=10)
        in_flight_at_fault = bus.in_flight
        await asyncio.to_thread(durable_broker.stop)
        await asyncio.sleep(outage_s)
        await asyncio.to_thread(durable_broker.start)
        await _until(lambda: bus.available, timeout=90)
        before = len(acked)
        await _until(lambda: len(acked) >= before + 3000, timeout=90)
    finally:
        stop.set()
        await asyncio.gather(*callers, return_exceptions=True)
        assert await bus.drain(60)
        await bus.stop()
    assert in_flight_at_fault > 0
    assert refused > 0  # the outage was felt: some calls were answered 503
    rebuilds = metrics.registry.get_sample_value("ragmon_kafka_producer_rebuilds_total") or 0
    if outage_s > config.delivery_timeout_s:
        assert rebuilds >= 1
    records = _read_back(config, len(acked))
    present = set(records)
    assert acked <= present, f"{len(acked - present)} acknowledged records lost"
    for trace, numbers in _first_occurrences(records).items():
        assert numbers == sorted(numbers), (trace, numbers)
    print(
        f"\n{len(acked)} records acknowledged, {len(present)} distinct in the topic ({len(records)} with "
        f"resends), {refused} calls refused, {in_flight_at_fault} in flight when the broker stopped, "
        f"{rebuilds:.0f} producers rebuilt"
    )


async def test_zstd_records_are_acknowledged_and_read_back(kafka_bootstrap: str) -> None:
    """`kafka.compression: zstd` (the zstandard package comes with the kafka extra): the broker takes
    the batches and a consumer reads every record back."""
    config = _config(kafka_bootstrap, compression="zstd")
    bus = KafkaBus(config, Metrics())
    await bus.start()
    try:
        await bus.publish([_record(config, t, 0) for t in range(500)])
    finally:
        await bus.stop()
    assert _first_occurrences(_read_back(config, 500)) == {t: [0] for t in range(500)}


def test_batch_bytes_is_refused_over_the_record_limit() -> None:
    with pytest.raises(ValueError, match="batch_bytes"):
        KafkaConfig(batch_bytes=2_000_000)
