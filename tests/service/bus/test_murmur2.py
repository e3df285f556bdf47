"""`service/bus/murmur2.py`: the partition of a key is the one Kafka's own clients choose."""

from __future__ import annotations

import random

from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from service.bus.murmur2 import murmur2, partition_of

# the values Apache Kafka's Java client tests its murmur2 against (as signed 32-bit integers)
JAVA_CLIENT_VALUES = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def test_murmur2_gives_the_java_clients_values() -> None:
    for key, signed in JAVA_CLIENT_VALUES.items():
        assert murmur2(key) == signed & 0xFFFFFFFF, key


def test_murmur2_and_the_partition_equal_kafka_pythons_for_keys_of_every_length() -> None:
    rng = random.Random(36)
    for length in range(301):  # every tail length, and the words of long keys
        for _ in range(20):
            key = rng.randbytes(length)
            assert murmur2(key) == kafka_python_murmur2(key), key
            partitions = rng.randint(1, 64)
            assert partition_of(key, partitions) == (kafka_python_murmur2(key) & 0x7FFFFFFF) % partitions
    # the keys ingest publishes: 32 lower-case hex characters (a trace id)
    for _ in range(2_000):
        key = rng.randbytes(16).hex().encode()
        assert partition_of(key, 6) == (kafka_python_murmur2(key) & 0x7FFFFFFF) % 6
