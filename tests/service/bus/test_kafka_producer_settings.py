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


def test_librdkafka_gets_the_same_producer_settings_in_its_names() -> None:
    """`kafka.producer_client: librdkafka`: each setting kafka-python's producer gets, in librdkafka's name
    and unit, and a librdkafka producer accepts them all (it refuses an unknown name or value when made)."""
    pytest.importorskip("confluent_kafka", reason="confluent-kafka comes with the kafka extra")
    from confluent_kafka import Producer

    from service.bus.librdkafka_producer import librdkafka_settings

    config = KafkaConfig(
        bootstrap_servers=["a:9092", "b:9093"],
        linger_ms=7,
        batch_bytes=500_000,
        delivery_timeout_s=31,
        request_timeout_s=12,
        compression="gzip",
        gzip_level=3,
    )
    rd = librdkafka_settings(config)
    kp = producer_settings(config)
    assert rd["bootstrap.servers"] == ",".join(kp["bootstrap_servers"]) == "a:9092,b:9093"
    assert rd["client.id"] == kp["client_id"]
    assert (rd["acks"], rd["enable.idempotence"]) == (kp["acks"], kp["enable_idempotence"]) == ("all", True)
    assert rd["linger.ms"] == kp["linger_ms"] == 7
    assert rd["batch.size"] == kp["batch_size"] == 500_000
    assert rd["message.max.bytes"] == kp["max_request_size"]
    assert rd["message.timeout.ms"] == kp["delivery_timeout_ms"] == 31_000
    assert rd["request.timeout.ms"] == kp["request_timeout_ms"] == 12_000
    assert (rd["compression.type"], rd["compression.level"]) == ("gzip", 3)
    assert librdkafka_settings(KafkaConfig())["compression.type"] == "zstd"
    assert "compression.level" not in librdkafka_settings(KafkaConfig())
    assert librdkafka_settings(KafkaConfig(), "gzip")["compression.type"] == "gzip"  # the bus's fallback
    secured = KafkaConfig(
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="ingest",
        sasl_password="s3cret",
        ssl_cafile="/etc/ca.pem",
        ssl_certfile="/etc/user.crt",
        ssl_keyfile="/etc/user.key",
        ssl_password="keypass",
        ssl_check_hostname=False,
    )
    rd = librdkafka_settings(secured)
    assert rd["security.protocol"] == "sasl_ssl"
    assert (rd["sasl.mechanism"], rd["sasl.username"], rd["sasl.password"]) == (
        "SCRAM-SHA-512",
        "ingest",
        "s3cret",
    )
    assert rd["ssl.ca.location"] == "/etc/ca.pem"
    assert (rd["ssl.certificate.location"], rd["ssl.key.location"]) == ("/etc/user.crt", "/etc/user.key")
    assert rd["ssl.key.password"] == "keypass"
    assert rd["ssl.endpoint.identification.algorithm"] == "none"
    assert librdkafka_settings(KafkaConfig(security_protocol="SSL"))[
        "ssl.endpoint.identification.algorithm"
    ] == ("https")
    for settings in (librdkafka_settings(config), librdkafka_settings(KafkaConfig())):
        Producer(settings).flush(0)  # made without a broker: only the names and values are checked


def test_librdkafka_errors_are_kafka_pythons_family_and_a_refused_codec_is_told() -> None:
    """The bus reads a failed produce's outcome as kafka-python's `KafkaError`; librdkafka's refusal of the
    codec becomes `UnsupportedCompressionTypeError` (the bus falls back to gzip), other errors not."""
    pytest.importorskip("confluent_kafka", reason="confluent-kafka comes with the kafka extra")
    from confluent_kafka import KafkaError as RdError
    from kafka.errors import KafkaError

    from service.bus.librdkafka_producer import LibrdkafkaError, _error

    refused = _error(RdError(RdError.UNSUPPORTED_COMPRESSION_TYPE))
    assert isinstance(refused, UnsupportedCompressionTypeError)
    assert compression_refused(refused)
    timed_out = _error(RdError(RdError._MSG_TIMED_OUT))
    assert isinstance(timed_out, LibrdkafkaError) and isinstance(timed_out, KafkaError)
    assert not compression_refused(timed_out)
    assert "MSG_TIMED_OUT" in str(timed_out)


def test_librdkafka_asked_for_without_confluent_kafka_is_refused_at_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`producer_client: librdkafka` where confluent-kafka is not installed stops the bus at start with a
    clear error naming the extra, instead of failing every send; with it installed, a `producer_processes`
    that cannot apply is said in the log and no producer process is started."""
    from service.bus import kafka_bus
    from service.metrics import Metrics

    monkeypatch.setattr(kafka_bus, "librdkafka_available", lambda: False)
    refused = r"confluent-kafka is not installed \(pip install 'ragmon\[kafka\]'\)"
    with pytest.raises(ValueError, match=refused):
        kafka_bus.KafkaBus(KafkaConfig(producer_client="librdkafka"), Metrics())

    monkeypatch.setattr(kafka_bus, "librdkafka_available", lambda: True)
    bus = kafka_bus.KafkaBus(KafkaConfig(producer_client="librdkafka", producer_processes=2), Metrics())
    assert bus.producer_processes == 0
    assert "producer_processes does not apply to producer_client librdkafka" in caplog.text
