"""Ingest's Kafka producer in a process of its own (`kafka.producer_process`), against a real broker:
the same guarantees as in the server process, and the process's own faults.

Records are keyed like ingest's (one key a trace) and their values name (trace, n), as in
test_kafka_pipelining.py, whose read-back helpers these tests share.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable

import psutil
import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.partitioner.default import murmur2

from service.bus.kafka_bus import KafkaBus
from service.bus.kafka_client import client_settings, producer_settings
from service.bus.producer_process import ProcessProducer, ProducerGroup, ProducerProcessError, ThreadProducer
from service.config import KafkaConfig
from service.metrics import Metrics
from service.processes import pipe_limit
from tests.distributed.conftest import ROOT, Broker
from tests.distributed.test_kafka_pipelining import _config, _first_occurrences, _read_back, _record, _until


def _producer_pids(bus: KafkaBus) -> list[int]:
    producer = bus._producer
    assert isinstance(producer, ProducerGroup)
    pids = [pid for pid in producer.pids if pid is not None]
    assert len(pids) == bus.producer_processes
    return pids


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("processes", [1, 2])
async def test_the_producer_runs_in_processes_of_its_own_and_every_record_is_acknowledged(
    kafka_bootstrap: str, processes: int
) -> None:
    """With `producer_processes: N` the producer is N child processes (not the server's thread); 3,000
    records of 1,000 traces published in three calls per trace are acknowledged, counted once each, and
    read back with every trace's records in publish order."""
    config = _config(kafka_bootstrap, producer_processes=processes)
    metrics = Metrics()
    bus = KafkaBus(config, metrics)
    await bus.start()
    try:
        await _publish_three_a_trace(bus, config)
        pids = _producer_pids(bus)
        assert os.getpid() not in pids
        assert set(pids) <= {child.pid for child in psutil.Process().children(recursive=True)}
        assert bus.depth == 0
    finally:
        await bus.stop()
    assert all(_ended(pid) for pid in pids)  # stop closed them
    _check_three_a_trace(config, metrics)


async def _publish_three_a_trace(bus: KafkaBus, config: KafkaConfig) -> None:
    """3,000 records of 1,000 traces: three calls per trace, one after the other, ten calls at once."""
    for n in range(3):
        await asyncio.gather(
            *(bus.publish([_record(config, t, n) for t in range(c, c + 100)]) for c in range(0, 1000, 100))
        )


def _check_three_a_trace(config: KafkaConfig, metrics: Metrics) -> None:
    """What `_publish_three_a_trace` published is counted once and in the topic once, each trace's three
    records in publish order, on the partition kafka-python's default partitioner gives its key (as
    with one producer)."""
    produced = metrics.registry.get_sample_value("ragmon_kafka_produced_total", {"topic": config.spans_topic})
    assert produced == 3000
    records = _read_back(config, 3000)
    assert len(records) == 3000  # nothing sent twice
    firsts = _first_occurrences(records)
    assert set(firsts) == set(range(1000))
    assert all(numbers == [0, 1, 2] for numbers in firsts.values())
    landed = _partitions_by_key(config, 3000)
    assert len(landed) == 1000
    for key, partitions in landed.items():
        assert partitions == {(murmur2(key) & 0x7FFFFFFF) % config.partitions}, key


def _partitions_by_key(config: KafkaConfig, records: int) -> dict[bytes, set[int]]:
    """Each key of the spans topic -> the partitions its records are on, read until `records` came
    (tansu's end offsets are not the high watermark: RECIPES.md)."""
    consumer = KafkaConsumer(enable_auto_commit=False, **client_settings(config))
    try:
        partitions = [TopicPartition(config.spans_topic, p) for p in range(config.partitions)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        landed: dict[bytes, set[int]] = {}
        seen = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and seen < records:
            for tp, batch in consumer.poll(timeout_ms=500).items():
                seen += len(batch)
                for record in batch:
                    landed.setdefault(record.key, set()).add(tp.partition)
        return landed
    finally:
        consumer.close()


async def test_a_producer_process_killed_mid_flight_loses_nothing_acknowledged(
    broker_factory: Callable[[], Broker],
) -> None:
    """The broker frozen so that 1,000 records sit in two producer processes unacknowledged (each
    trace's second record waiting behind its first); one process is SIGKILLed. Every record it held is
    reported failed, the bus gives the group up (one rebuild: the other process's records go back too)
    and new processes send everything again once the broker runs: every call returns acknowledged, none
    returned before, and every record is in the topic, each trace's records in publish order."""
    broker = broker_factory()
    broker.start()
    config = _config(
        broker.bootstrap,
        producer_processes=1,
        publish_timeout_s=90,
        delivery_timeout_s=90,
        request_timeout_s=60,
    )
    metrics = Metrics()
    bus = KafkaBus(config, metrics)
    await bus.start()
    try:
        await bus.publish([_record(config, 10**6, 0)])  # metadata known: sends need no broker answer
        first_pids = _producer_pids(bus)
        assert broker.pid is not None
        os.kill(broker.pid, signal.SIGSTOP)
        try:
            calls = [
                asyncio.create_task(bus.publish([_record(config, c * 500 + t, n) for t in range(500)]))
                for c in range(2)
                for n in range(2)
            ]
            await _until(lambda: bus.in_flight == 1000)  # each trace's second record waits behind its first
            await asyncio.sleep(0.3)
            os.kill(first_pids[0], signal.SIGKILL)
            await _until(lambda: all(_ended(pid) for pid in first_pids))
            await asyncio.sleep(0.5)
            assert not any(call.done() for call in calls)
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        await asyncio.wait_for(asyncio.gather(*calls), 90)
        assert bus.depth == 0
        assert not set(_producer_pids(bus)) & set(first_pids)
    finally:
        await bus.stop()
    assert metrics.registry.get_sample_value("ragmon_kafka_producer_rebuilds_total") == 1
    records = _read_back(config, 2001)
    firsts = _first_occurrences(records)
    assert set(firsts) == set(range(1000)) | {10**6}
    assert all(firsts[trace] == [0, 1] for trace in range(1000))


@pytest.mark.skipif(not hasattr(fcntl, "F_GETPIPE_SZ"), reason="pipe sizes are Linux only")
def test_the_producer_processes_pipes_hold_a_whole_request(kafka_bootstrap: str) -> None:
    """Both pipes of a producer process are widened as the ingest pools' are: a request's records
    (~375 KB for 50 bench traces) cross in one write instead of six 64 KiB ones (bench/RESULTS.md,
    session 33), and a batch larger than the pipe still crosses whole."""
    wanted = pipe_limit()
    assert wanted > 64 * 1024, "this kernel keeps pipes at their default size; nothing to test"
    config = _config(kafka_bootstrap)
    producer = ProcessProducer(producer_settings(config))
    try:
        sizes = {
            fcntl.fcntl(end.fileno(), fcntl.F_GETPIPE_SZ) for end in (producer._commands, producer._outcomes)
        }
        assert sizes == {wanted}
        outcomes: list[tuple[int, object]] = []
        big = os.urandom(wanted // 4)
        records = [(n, config.spans_topic, b"%032x" % n, big, (), None) for n in range(6)]  # 1.5x the pipe
        producer.send_many(records, lambda context, error: outcomes.append((context, error)))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(outcomes) < len(records):
            time.sleep(0.05)
        assert sorted(outcomes, key=lambda o: o[0]) == [(n, True) for n in range(6)]  # True: acknowledged
    finally:
        producer.close(10)


def test_the_producer_process_ends_when_the_server_is_killed(kafka_bootstrap: str) -> None:
    """A server SIGKILLed with its producer process running leaves no producer behind: the process
    reads end of file on its command pipe and exits."""
    config = _config(kafka_bootstrap)
    script = textwrap.dedent(
        f"""
        import sys, time
        from service.bus.kafka_client import producer_settings
        from service.bus.producer_process import ProcessProducer
        from service.config import KafkaConfig
        config = KafkaConfig.model_validate_json({config.model_dump_json()!r})
        producer = ProcessProducer(producer_settings(config))
        print(producer.pid, flush=True)
        time.sleep(600)
        """
    )
    server = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        pid = int(server.stdout.readline())
        assert psutil.pid_exists(pid)
    finally:
        server.kill()
        server.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not _ended(pid):
        time.sleep(0.1)
    assert _ended(pid)


def test_a_producer_that_cannot_reach_the_broker_fails_to_open_with_the_clients_reason() -> None:
    """Opening a producer process against a port nobody listens on raises a `KafkaError` (which the bus
    treats as a failed send: 503 and retry) naming the client's error, and leaves no process behind,
    as the in-process producer raises."""
    config = _config("127.0.0.1:1", request_timeout_s=2)
    before = _helpers()
    with pytest.raises(ProducerProcessError, match="Unable to bootstrap"):
        ProcessProducer(producer_settings(config))
    with pytest.raises(Exception, match="Unable to bootstrap"):
        ThreadProducer(producer_settings(config))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _helpers() - before:
        time.sleep(0.1)
    assert not _helpers() - before


def _helpers() -> set[int]:
    """Live processes started from this process's forkserver (where producer processes come from)."""
    live = set()
    for child in psutil.Process().children():
        if "forkserver" in " ".join(child.cmdline()):
            live |= {p.pid for p in child.children() if p.status() != psutil.STATUS_ZOMBIE}
    return live
