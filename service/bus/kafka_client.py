"""What every kafka-python client of ragmon shares: connection settings, the producer's settings, topics.

Producer, consumer and admin client are all made with `client_settings`
(bootstrap, security, timeouts); ingest's producer with `producer_settings`
(acks=all, idempotent, batch size, compression, linger) by `new_producer`,
which is also how `bench/scale/ingest.py` makes the plain producer it measures
as the ceiling.
kafka-python clients are not thread-safe: each is used from one thread of
its own (`ClientThread`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kafka import KafkaProducer, codec
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import TopicAlreadyExistsError, UnsupportedCompressionTypeError
from kafka.record import default_records

from service.config import KafkaConfig

__all__ = [
    "ClientThread",
    "client_settings",
    "compression_of",
    "compression_refused",
    "ensure_topics",
    "max_request_bytes",
    "new_producer",
    "producer_settings",
    "quiet_client_logs",
    "task_failure",
    "use_gzip_level",
]

R = TypeVar("R")
log = logging.getLogger(__name__)
# producer_settings' key for `kafka.gzip_level`: not a KafkaProducer setting (new_producer applies it)
GZIP_LEVEL = "ragmon_gzip_level"


def quiet_client_logs() -> None:
    """Keep kafka-python's own loggers to CRITICAL unless ragmon logs at DEBUG.

    kafka-python logs every connection attempt (six lines at INFO to ERROR per failed bootstrap,
    several a second while the broker is down); ragmon reports the outage itself (`OutageLog`, with
    the client's error text), so its lines add only noise. With ragmon at DEBUG they all show.
    A level set on the `kafka` logger by the user (not NOTSET) is left alone."""
    client = logging.getLogger("kafka")
    if client.level == logging.NOTSET and not logging.getLogger().isEnabledFor(logging.DEBUG):
        client.setLevel(logging.CRITICAL)


def client_settings(config: KafkaConfig) -> dict[str, Any]:
    """Connection and security settings shared by producer, consumer and admin client (every client
    is made with them, so this is also where kafka-python's logs are quieted: `quiet_client_logs`)."""
    quiet_client_logs()
    settings: dict[str, Any] = {
        "bootstrap_servers": list(config.bootstrap_servers),
        "security_protocol": config.security_protocol,
        "request_timeout_ms": int(config.request_timeout_s * 1000),
        "bootstrap_timeout_ms": int(config.request_timeout_s * 1000),
    }
    if config.sasl_mechanism is not None:
        settings.update(
            sasl_mechanism=config.sasl_mechanism,
            sasl_plain_username=config.sasl_username,
            sasl_plain_password=config.sasl_password.get_secret_value() if config.sasl_password else None,
        )
    if config.security_protocol in ("SSL", "SASL_SSL"):
        settings["ssl_check_hostname"] = config.ssl_check_hostname
    if config.ssl_cafile is not None:
        settings["ssl_cafile"] = config.ssl_cafile
    if config.ssl_certfile is not None:  # mutual TLS: the client's certificate (Strimzi tls users)
        settings["ssl_certfile"] = config.ssl_certfile
        settings["ssl_keyfile"] = config.ssl_keyfile
        settings["ssl_password"] = config.ssl_password.get_secret_value() if config.ssl_password else None
    return settings


def producer_settings(config: KafkaConfig, compression: str | None = None) -> dict[str, Any]:
    """Every setting of ingest's `KafkaProducer`; `compression` (none, gzip, zstd) in place of
    `kafka.compression` (the bus's gzip once the broker refused zstd).

    acks=all and the idempotent producer: with it kafka-python keeps up to five produce requests
    in flight to a broker (its default `max_in_flight_requests_per_connection`) and still writes
    each partition in the order sent. `batch_size` is `kafka.batch_bytes`: on a broker that
    writes each batch to object storage, the batch size sets the rate (bench/RESULTS.md)."""
    c = config
    codec_name = compression or c.compression
    return {
        "client_id": f"{c.client_id}-ingest",
        "acks": "all",
        "enable_idempotence": True,
        "linger_ms": c.linger_ms,
        "batch_size": c.batch_bytes,
        "compression_type": None if codec_name == "none" else codec_name,
        "max_block_ms": int(c.max_block_s * 1000),
        "delivery_timeout_ms": int(c.delivery_timeout_s * 1000),
        "max_request_size": max_request_bytes(c),
        GZIP_LEVEL: c.gzip_level,
        **client_settings(c),
    }


def max_request_bytes(config: KafkaConfig) -> int:
    """The largest produce request ingest's producer sends (either client): the largest record plus
    its batch framing."""
    return config.max_record_bytes + 64 * 1024


def use_gzip_level(level: int) -> None:
    """This process's kafka-python producers gzip their batches at `level`.

    kafka-python has no setting for it and always compresses at 9: 47 ms of CPU a MB of the
    bench's spans records, against 18 at 6 for batches 2 % larger (1: 7.6 ms, 47 % larger), the
    largest single cost of an ingest replica on Kafka (bench/RESULTS.md, session 30). Its batch
    builder calls the module's `gzip_encode` at each batch, so that name is given the level."""
    if not 1 <= level <= 9:
        raise ValueError(f"gzip level must be 1 to 9, got {level}")
    if not hasattr(default_records, "gzip_encode"):  # a kafka-python that builds batches otherwise
        log.warning("kafka-python's gzip level cannot be set in this version; it compresses at its own")
        return
    default_records.gzip_encode = functools.partial(codec.gzip_encode, compresslevel=level)


def new_producer(settings: dict[str, Any]) -> KafkaProducer:
    """A `KafkaProducer` made with `producer_settings` (its gzip level applied to this process).

    zstd, the default, falls back to gzip, with a warning, where it cannot work: the zstandard
    package missing (ragmon installed without its kafka extra), or a broker older than Kafka 2.1
    (kafka-python refuses zstd once the bootstrap tells it the broker's version). A broker that
    takes the batches but refuses zstd in its answer is the bus's to notice (`compression_refused`).
    The codec in use is `compression_of(producer)`."""
    settings = dict(settings)
    use_gzip_level(settings.pop(GZIP_LEVEL, 9))
    if settings.get("compression_type") != "zstd":
        return KafkaProducer(**settings)
    if not codec.has_zstd():
        return _gzip_instead(
            settings,
            "kafka.compression is zstd but the zstandard package is not installed "
            "(pip install 'ragmon[kafka]')",
        )
    try:
        return KafkaProducer(**settings)
    except ValueError as exc:  # kafka-python: "Zstd Requires >= Kafka 2.1 Brokers"
        if "zstd" not in str(exc).lower():
            raise
        return _gzip_instead(settings, f"the Kafka broker cannot take zstd batches ({exc})")


def _gzip_instead(settings: dict[str, Any], why: str) -> KafkaProducer:
    log.warning("%s; ingest's producer compresses with gzip", why)
    return KafkaProducer(**{**settings, "compression_type": "gzip"})


def compression_of(producer: KafkaProducer) -> str:
    """The codec `producer` compresses its batches with: none, gzip or zstd."""
    return str(producer.config["compression_type"] or "none")


def compression_refused(outcome: BaseException) -> bool:
    """Whether a failed produce is the broker refusing the batches' codec (UNSUPPORTED_COMPRESSION_TYPE),
    as the exception itself or as its text from a producer process (`ProducerProcessError`)."""
    return isinstance(outcome, UnsupportedCompressionTypeError) or (
        UnsupportedCompressionTypeError.__name__ in str(outcome)
    )


def ensure_topics(config: KafkaConfig) -> None:
    """Create the spans, traces and feedback topics when missing (a no-op for topics that exist)."""
    admin = KafkaAdminClient(client_id=f"{config.client_id}-admin", **client_settings(config))
    try:
        for topic in (config.spans_topic, config.traces_topic, config.feedback_topic):
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(
                    [NewTopic(topic, config.partitions, config.replication_factor)],
                    timeout_ms=int(config.request_timeout_s * 1000),
                )
    finally:
        admin.close()


class ClientThread:
    """Runs blocking client calls on one dedicated thread: kafka-python clients are not thread-safe."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def __call__(self, fn: Callable[..., R], *args: Any) -> R:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False)


def task_failure(task: asyncio.Task[None]) -> str:
    """Why a background task that was not stopped ended (for liveness): its exception, or how."""
    if task.cancelled():
        return "cancelled"
    exc = task.exception()
    return f"{type(exc).__name__}: {exc}" if exc is not None else "returned"
