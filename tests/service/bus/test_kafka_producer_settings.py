"""Ingest's producer settings: the codec (zstd by default), and gzip at `kafka.gzip_level`
(kafka_client.use_gzip_level): kafka-python alone always compresses at 9. The level shows in the gzip
header (XFL: 2 = best compression, 4 = fastest, 0 otherwise). The fallbacks from zstd to gzip are
tested against a real broker in tests/distributed/test_kafka_compression.py."""

from __future__ import annotations

import gzip

import pytest

pytest.importorskip("kafka", reason="kafka-python comes with the kafka extra")

from kafka.errors import KafkaTimeoutError, UnsupportedCompressionTypeError
from kafka.record import default_records

from service.bus.kafka_client import GZIP_LEVEL, compression_refused, producer_settings, use_gzip_level
from service.bus.producer_process import ProducerProcessError
from service.config import KafkaConfig

DATA = b"spans of a RAG trace, retrieved chunk text " * 2000


def test_batches_are_gzipped_at_the_level_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default_records, "gzip_encode", default_records.gzip_encode)  # restored after
    sizes = {}
    for level, xfl in ((1, 4), (6, 0), (9, 2)):
        use_gzip_level(level)
        compressed = default_records.gzip_encode(DATA)  # what kafka-python's batch builder calls
        assert compressed[8] == xfl, level
        assert gzip.decompress(compressed) == DATA
        sizes[level] = len(compressed)
    assert sizes[1] > sizes[6] >= sizes[9]
    with pytest.raises(ValueError, match="1 to 9"):
        use_gzip_level(0)


def test_the_producer_settings_carry_the_configured_level_and_6_by_default() -> None:
    assert producer_settings(KafkaConfig())[GZIP_LEVEL] == 6
    assert producer_settings(KafkaConfig(gzip_level=1))[GZIP_LEVEL] == 1
    with pytest.raises(ValueError):
        KafkaConfig(gzip_level=10)


def test_zstd_is_the_default_codec_and_the_bus_can_ask_for_another() -> None:
    assert producer_settings(KafkaConfig())["compression_type"] == "zstd"
    assert producer_settings(KafkaConfig(compression="gzip"))["compression_type"] == "gzip"
    assert producer_settings(KafkaConfig(compression="none"))["compression_type"] is None
    # the bus's codec once a broker refused zstd, whatever the configuration says
    assert producer_settings(KafkaConfig(), "gzip")["compression_type"] == "gzip"


def test_a_refused_codec_is_told_from_other_produce_failures() -> None:
    """The broker's UNSUPPORTED_COMPRESSION_TYPE, raised in the server's thread or carried as text from
    a producer process (as `_Outbox` writes it: the exception's repr), and nothing else."""
    refused = UnsupportedCompressionTypeError("ProduceResponse for spans-0")
    assert compression_refused(refused)
    assert compression_refused(ProducerProcessError(repr(refused)))
    assert not compression_refused(KafkaTimeoutError("Batch for spans-0 containing 3 record(s) expired"))
    assert not compression_refused(ProducerProcessError("the Kafka producer process ended"))
    assert not compression_refused(ProducerProcessError(repr(KafkaTimeoutError("no metadata"))))
