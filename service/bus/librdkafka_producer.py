"""`LibrdkafkaProducer`: ingest's Kafka producer on librdkafka (confluent-kafka), in the server process.

Why: kafka-python builds, compresses and sends batches in Python, in one
sender thread a producer, so ingest ran it in processes of its own
(`ProducerGroup`, producer_process.py) and paid for pickling every record
across to them besides. librdkafka does that work in C threads that do not
hold the GIL; what stays in Python is one `produce` call a record and one
delivery callback. On the durable broker its plain producer spent 0.025-0.044
ms of CPU a record against kafka-python's 0.074-0.082 (bench/RESULTS.md,
session 37). Chosen by `kafka.producer_client: librdkafka`.

It is a `producer_process.Producer` like the others, so the bus's guarantees
(a 200 only for acknowledged records, one record of a trace with the producer
at a time, everything unacknowledged sent again through a new producer after a
failure) hold unchanged. What differs, and how it is kept equal:

* Partitions: each record's partition is chosen here, by murmur2 of its key
  over the topic's partitions (murmur2.py), exactly as kafka-python's default
  partitioner and `ProducerGroup` choose it, so switching clients moves no
  trace to another partition.
* Outcomes: librdkafka reports deliveries from `poll`; a thread of this
  producer polls and calls `report(context, True)` or `report(context, error)`.
  Errors become kafka-python's `KafkaError` family (the broker refusing the
  codec is `UnsupportedCompressionTypeError`), which is what the bus reads.
* Settings: the same `KafkaConfig` fields as `kafka_client.producer_settings`,
  in librdkafka's names (`librdkafka_settings`): acks=all, idempotence,
  linger, batch size, codec, delivery and request timeouts, security.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from kafka.errors import KafkaError, UnsupportedCompressionTypeError

from service.bus.kafka_client import max_request_bytes, quiet_client_logs
from service.bus.murmur2 import partition_of
from service.bus.producer_process import Record, Report
from service.config import KafkaConfig

__all__ = ["LibrdkafkaError", "LibrdkafkaProducer", "librdkafka_available", "librdkafka_settings"]

log = logging.getLogger(__name__)
_CLIENT_LOG = logging.getLogger("kafka.librdkafka")

_POLL_S = 0.05  # how long the delivery thread waits in one poll; also how soon it notices a stop
_FULL_WAIT_S = 0.01  # poll between tries while librdkafka's own queue is full
# How long a hand-over to an idle producer flushes: librdkafka ignores linger.ms while a flush runs, so
# records that found nothing in flight (no batch to join) go to the broker now; a flush with no time
# left at all (0) does not wake its broker threads.
_NUDGE_S = 0.001


class LibrdkafkaError(KafkaError):  # type: ignore[misc]  # kafka-python has no types
    """A produce librdkafka failed (its error name and text), in the family the bus handles."""

    retriable = True


def librdkafka_available() -> bool:
    """Whether confluent-kafka (librdkafka) is installed (the kafka extra)."""
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        return False
    return True


def librdkafka_settings(config: KafkaConfig, compression: str | None = None) -> dict[str, Any]:
    """librdkafka's configuration for ingest's producer: `kafka_client.producer_settings` in its names;
    `compression` in place of `kafka.compression` (the bus's gzip once the broker refused zstd)."""
    c = config
    codec_name = compression or c.compression
    settings: dict[str, Any] = {
        "bootstrap.servers": ",".join(c.bootstrap_servers),
        "client.id": f"{c.client_id}-ingest",
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": c.linger_ms,
        "batch.size": c.batch_bytes,
        "compression.type": codec_name,
        "message.max.bytes": max_request_bytes(c),
        "message.timeout.ms": int(c.delivery_timeout_s * 1000),
        "request.timeout.ms": int(c.request_timeout_s * 1000),
        "socket.connection.setup.timeout.ms": int(c.request_timeout_s * 1000),
        "security.protocol": c.security_protocol.lower(),
    }
    if codec_name == "gzip":
        settings["compression.level"] = c.gzip_level
    if c.sasl_mechanism is not None:
        settings["sasl.mechanism"] = c.sasl_mechanism
        if c.sasl_username is not None:
            settings["sasl.username"] = c.sasl_username
        if c.sasl_password is not None:
            settings["sasl.password"] = c.sasl_password.get_secret_value()
    if c.security_protocol in ("SSL", "SASL_SSL"):
        settings["ssl.endpoint.identification.algorithm"] = "https" if c.ssl_check_hostname else "none"
    if c.ssl_cafile is not None:
        settings["ssl.ca.location"] = c.ssl_cafile
    if c.ssl_certfile is not None:
        settings["ssl.certificate.location"] = c.ssl_certfile
        # a certificate file may hold its key too (kafka.ssl_certfile); librdkafka reads it there
        settings["ssl.key.location"] = c.ssl_keyfile or c.ssl_certfile
        if c.ssl_password is not None:
            settings["ssl.key.password"] = c.ssl_password.get_secret_value()
    return settings


def _error(err: Any) -> KafkaError:
    """kafka-python's form of a librdkafka error (`confluent_kafka.KafkaError`)."""
    from confluent_kafka import KafkaError as RdError

    text = f"{err.name()}: {err.str()}"
    if err.code() == RdError.UNSUPPORTED_COMPRESSION_TYPE:
        return UnsupportedCompressionTypeError(text)
    return LibrdkafkaError(text)


class LibrdkafkaProducer:
    """A librdkafka producer in this process, used as `producer_process.Producer` (module docstring)."""

    def __init__(self, config: KafkaConfig, compression: str | None = None) -> None:
        from confluent_kafka import Producer

        self.compression: str = compression or config.compression
        self._timeout_s = config.request_timeout_s
        self._block_s = config.max_block_s
        settings = librdkafka_settings(config, self.compression)
        # librdkafka's log lines (a line per failed connection while the broker is down) go to a child
        # of kafka-python's logger, quiet unless ragmon logs at DEBUG (`quiet_client_logs`): the bus
        # reports an outage itself (`OutageLog`)
        quiet_client_logs()
        self._producer = Producer(settings, logger=_CLIENT_LOG)
        self._partitions: dict[str, int] = {}  # topic -> partition count, asked once per producer
        self._outstanding = 0  # records produced, their delivery not reported yet
        self._counting = threading.Lock()
        self._stopping = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="librdkafka-deliveries", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._stopping.is_set():
            try:
                self._producer.poll(_POLL_S)
            except Exception:  # a report that raised: logged, the other deliveries go on
                log.exception("a Kafka delivery report failed")

    def partition_count(self, topic: str) -> int:
        """The topic's partitions, from the broker (raises `LibrdkafkaError` when it does not answer)."""
        from confluent_kafka import KafkaException

        try:
            metadata = self._producer.list_topics(topic, timeout=self._timeout_s)
        except KafkaException as exc:
            raise _error(exc.args[0]) from None
        found = metadata.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            why = found.error if found is not None and found.error is not None else "no partitions"
            raise LibrdkafkaError(f"topic {topic}: {why}")
        count = len(found.partitions)
        self._partitions[topic] = count
        return count

    def send_many(self, records: Sequence[Record], report: Report) -> None:
        """Hand `records` to librdkafka; `report(context, outcome)` once each, from the delivery thread
        (or here, for a record librdkafka refused outright, and for the rest once one could not be
        queued within `max_block_s`)."""
        from confluent_kafka import KafkaException

        idle = self._outstanding == 0
        for i, (context, topic, key, value, headers, partition) in enumerate(records):
            try:
                if partition is None:
                    count = self._partitions.get(topic)
                    partition = partition_of(key, count if count else self.partition_count(topic))
                self._produce(topic, key, value, headers, partition, self._delivered(report, context))
            except KafkaError as exc:  # no metadata, or the queue stayed full: the rest would wait as long
                for rest in records[i:]:
                    report(rest[0], exc)
                return
            except KafkaException as exc:  # this record refused (too large, ...): it alone fails
                report(context, _error(exc.args[0]))
        if idle:
            # Linger batches records that come while others are on their way; with nothing on its way
            # there is nothing to wait for (bench/RESULTS.md, session 37: 1.3-1.45x the rate at one
            # request in flight, and a longer linger for the rest)
            self._producer.flush(_NUDGE_S)

    def _delivered(self, report: Report, context: Any) -> Callable[[Any, Any], None]:
        def on_delivery(err: Any, _message: Any) -> None:
            with self._counting:
                self._outstanding -= 1
            report(context, True if err is None else _error(err))

        return on_delivery

    def _produce(
        self,
        topic: str,
        key: bytes,
        value: bytes,
        headers: Sequence[tuple[str, bytes]],
        partition: int,
        on_delivery: Callable[[Any, Any], None],
    ) -> None:
        waited = 0.0
        while True:
            try:
                with self._counting:
                    self._outstanding += 1
                try:
                    self._producer.produce(
                        topic, value, key, partition, on_delivery=on_delivery, headers=list(headers) or None
                    )
                except BaseException:
                    with self._counting:
                        self._outstanding -= 1
                    raise
                return
            except BufferError:  # librdkafka's queue is full: wait for deliveries to make room
                if waited >= self._block_s:
                    raise LibrdkafkaError(f"the producer's queue stayed full for {self._block_s} s") from None
                self._producer.poll(_FULL_WAIT_S)
                waited += _FULL_WAIT_S

    def abort(self) -> threading.Thread | None:
        """Give the producer up without waiting: what it holds is purged (reported failed, stale to the
        bus, which gave it up); the rest of the teardown runs on a thread returned here."""
        with contextlib.suppress(Exception):
            self._producer.purge(in_queue=True, in_flight=True, blocking=False)
        closer = threading.Thread(target=self._end, args=(0.0,), name="librdkafka-close", daemon=True)
        closer.start()
        return closer

    def close(self, timeout_s: float) -> None:
        """Deliver what the producer holds (up to `timeout_s`), then end it."""
        self._end(timeout_s)

    def _end(self, timeout_s: float) -> None:
        try:
            if timeout_s > 0:
                self._producer.flush(timeout_s)
        finally:
            self._stopping.set()
            self._poller.join()
            with contextlib.suppress(Exception):
                self._producer.poll(0)  # the reports of what was purged or delivered last
