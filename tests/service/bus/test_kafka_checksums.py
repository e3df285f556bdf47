"""kafka-python checksums record batches with the C CRC-32C when ragmon's kafka extra is installed.

Without the `crc32c` package kafka-python falls back to a pure-Python CRC-32C (~0.2 us a byte), which
was the largest single cost of a distributed worker (bench/RESULTS.md, "Scale")."""

from __future__ import annotations

import os

import pytest

kafka_util = pytest.importorskip("kafka.record.util", reason="kafka-python is not installed")
crc32c = pytest.importorskip("crc32c", reason="crc32c (ragmon[kafka]) is not installed")


def test_record_batches_are_checksummed_in_c() -> None:
    from kafka.record._crc32c import crc as pure_python_crc

    assert kafka_util.calc_crc32c.__defaults__ == (crc32c.crc32c,)
    batch = memoryview(os.urandom(4096))
    assert kafka_util.calc_crc32c(batch) == pure_python_crc(batch)  # the same checksum, only faster


def test_the_kafka_extra_declares_crc32c_and_zstandard() -> None:
    from importlib.metadata import requires

    kafka_extra = [r for r in requires("ragmon") or [] if 'extra == "kafka"' in r]
    assert any(r.startswith("crc32c") for r in kafka_extra), kafka_extra
    assert any(r.startswith("zstandard") for r in kafka_extra), kafka_extra  # kafka.compression: zstd
