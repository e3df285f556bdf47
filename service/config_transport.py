"""Configuration sections of how traces come in, travel and are kept: the HTTP server and its API
keys, trace assembly, the bus and Kafka, `ragmon worker`, the write-ahead log and the store.

Each is one section of `RagmonConfig` (`config.py`, which re-exports them); field descriptions are the
README's configuration table.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_serializer, field_validator, model_validator

from service.config_base import MASK, _Section, masked_url


class ServerConfig(_Section):
    host: str = Field(
        "127.0.0.1", description="HTTP listen address (OTLP/HTTP, JSON API, review page, /metrics)"
    )
    port: int = Field(4318, ge=0, le=65535, description="HTTP port; 4318 is the OTLP/HTTP default")
    grpc_port: int = Field(4317, ge=0, le=65535, description="OTLP/gRPC port; 0 disables the gRPC receiver")
    max_body_bytes: int = Field(
        16 * 1024 * 1024, gt=0, description="largest accepted request body (after gzip)"
    )
    body_timeout_s: float = Field(
        30.0,
        gt=0,
        description="a request body not wholly received this long after its headers is refused (408)",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="a connection whose request headers are not complete this long after it opened (or "
        "after its previous response) is closed and counted (slowloris)",
    )
    ingest_processes: int | None = Field(
        None,
        ge=0,
        description="worker processes per role (decoders of OTLP bodies, builders of traces); 0: threads "
        "of the server process; unset: one per usable CPU beyond the first (a container's CPU quota "
        "counts), at most 4",
    )


class AuthConfig(_Section):
    api_keys: dict[str, str] = Field(
        default_factory=dict,
        repr=False,
        description="API key -> tenant. Empty: no keys, and only loopback clients are accepted",
    )
    allow_loopback_without_key: bool = Field(
        True, description="with no keys configured, accept unauthenticated clients on 127.0.0.1/::1"
    )

    @property
    def tenants(self) -> frozenset[str]:
        """The tenants the API keys name (empty without keys: every caller is tenant `default`)."""
        return frozenset(self.api_keys.values())

    @field_serializer("api_keys")
    def _mask_keys(self, keys: dict[str, str]) -> dict[str, str]:
        # the keys are the secrets; numbered, so that two keys of one tenant still show as two
        return {f"{MASK}#{n}": tenant for n, tenant in enumerate(keys.values(), 1)}


class AssemblerConfig(_Section):
    """How long spans of one trace are waited for, and how a trace flushed early is completed.

    A trace stays open while its spans keep coming: it is flushed `grace_s` after its root span
    arrived, after `idle_s` without a new span, or `max_age_s` after its first span, whichever
    comes first. Spans that arrive after that, within `late_window_s` of the trace's first flush,
    complete the stored trace (service/assemble.py)."""

    grace_s: float = Field(0.5, ge=0, description="wait after the root span ends for late child spans")
    idle_s: float = Field(
        120.0,
        gt=0,
        description="flush a trace whose root has not arrived after this long without a new span of it "
        "(a slow LLM call sends nothing until it ends); later spans complete the stored trace",
    )
    max_age_s: float = Field(
        900.0,
        gt=0,
        description="flush a trace this long after its first span even while its spans keep coming (an "
        "agent that runs for minutes); later spans complete the stored trace. In Kafka mode the spans "
        "partition's commit waits for an open trace's first record: at most this long",
    )
    late_window_s: float = Field(
        1800.0,
        gt=0,
        description="spans that arrive this long after their trace was first flushed are dropped "
        "(counted in ragmon_dropped_spans_total{reason=too_late}); until then they complete the stored "
        "trace, whose spans are kept that long for it (table trace_spans)",
    )
    max_spans: int = Field(200_000, gt=0, description="open-trace buffer bound, in spans")
    max_bytes: int = Field(256 * 1024 * 1024, gt=0, description="open-trace buffer bound, in estimated bytes")
    evict_above: float = Field(
        0.9,
        gt=0,
        le=1,
        description="share of the buffer bound above which the least recently active open traces are "
        "flushed early (completed later by their late spans); at the bound ingest answers 503",
    )
    tick_s: float = Field(0.1, gt=0, description="how often the buffer is checked for complete traces")

    @model_validator(mode="before")
    @classmethod
    def _renamed_timeout(cls, values: Any) -> Any:
        if isinstance(values, Mapping) and "timeout_s" in values:
            values = dict(values)
            timeout = values.pop("timeout_s")
            warnings.warn(
                "assembler.timeout_s is deprecated and will be removed in ragmon 2.0: "
                "use assembler.idle_s (a trace is now flushed after that long without a new span)",
                DeprecationWarning,
                stacklevel=2,
            )
            values.setdefault("idle_s", timeout)
        return values

    @model_validator(mode="after")
    def _ordered(self) -> AssemblerConfig:
        if self.max_age_s < self.grace_s:
            raise ValueError("assembler.max_age_s must be at least assembler.grace_s")
        return self


class BusConfig(_Section):
    kind: Literal["memory", "kafka"] = Field(
        "memory",
        description="memory (embedded) or kafka (ingest publishes; `ragmon worker` runs the sinks)",
    )
    # A queued trace holds its query vector as Python floats and its chunk texts: ~25 KB for a
    # 256-dim vector and 2.5 KB of chunks, ~60 KB at 1,536 dims. 2,000 keeps the bus under
    # ~50-120 MB and is still four sink batches of slack; 50,000 let RSS climb past 1 GB when the
    # sinks fell behind a closed-loop sender (bench/RESULTS.md, ingest).
    capacity: int = Field(
        2_000, gt=0, description="traces waiting to be built or in the bus before ingest answers 503"
    )
    batch_size: int = Field(500, gt=0, description="largest batch handed to a sink")
    linger_s: float = Field(
        0.5,
        ge=0,
        le=5,
        description="how long assembled traces wait to fill a batch of batch_size: in the assembler (its "
        "emissions, each a span-archive transaction, are a sinks worker's sink batches) and, embedded, once "
        "more in the bus; a batch costs a dozen statements whatever its size, so fewer, larger batches take "
        "~10 % less CPU a trace below capacity; traces reach the store up to twice this later; 0: no wait",
    )
    retry_after_s: float = Field(1.0, gt=0, description="Retry-After sent with 503 when the bus is full")


class KafkaConfig(_Section):
    """Distributed mode (`bus.kind: kafka`): topics, groups, client timeouts and the ingest-side buffer."""

    bootstrap_servers: list[str] = Field(
        default_factory=lambda: ["127.0.0.1:9092"], description="Kafka brokers, host:port"
    )
    traces_topic: str = Field("ragmon.traces", description="topic of traces (JSON), keyed by trace id")
    feedback_topic: str = Field(
        "ragmon.feedback", description="topic of feedback events (JSON), keyed by trace id"
    )
    spans_topic: str = Field(
        "ragmon.spans",
        description="topic of accepted OTLP spans and GenAI log events (OTLP protobuf), keyed by trace id; "
        "the sinks workers assemble traces from it",
    )
    partitions: int = Field(6, gt=0, description="partitions per topic when ragmon creates the topics")
    replication_factor: int = Field(1, gt=0, description="replication factor when ragmon creates the topics")
    create_topics: bool = Field(True, description="create missing topics at start (needs the broker's ACL)")
    sinks_group: str = Field("ragmon-sinks", description="consumer group of the `sinks` workers")
    client_id: str = Field("ragmon", description="client id prefix sent to the broker")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="broker security protocol"
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        None, description="SASL mechanism when the protocol is SASL_*"
    )
    sasl_username: str | None = Field(None, description="SASL user")
    sasl_password: SecretStr | None = Field(
        None, description="SASL password (prefer the env var RAGMON_KAFKA__SASL_PASSWORD); never shown"
    )
    ssl_cafile: str | None = Field(None, description="CA bundle for SSL / SASL_SSL")
    ssl_certfile: str | None = Field(
        None,
        description="client certificate (PEM) for mutual TLS, e.g. a Strimzi KafkaUser's user.crt; "
        "may also hold the key",
    )
    ssl_keyfile: str | None = Field(None, description="private key (PEM) of ssl_certfile, e.g. user.key")
    ssl_password: SecretStr | None = Field(
        None,
        description="password of an encrypted ssl_keyfile (prefer the env var RAGMON_KAFKA__SSL_PASSWORD); "
        "never shown",
    )
    ssl_check_hostname: bool = Field(
        True, description="check that the broker's certificate names the host connected to (SSL / SASL_SSL)"
    )
    request_timeout_s: float = Field(15.0, gt=0, description="broker request timeout")
    delivery_timeout_s: float = Field(
        30.0, gt=0, description="a produce not acknowledged (acks=all) within this is failed and retried"
    )
    max_block_s: float = Field(5.0, gt=0, description="longest a produce call waits for broker metadata")
    linger_ms: int = Field(5, ge=0, description="producer batching delay")
    batch_bytes: int = Field(
        1_000_000,
        ge=16_384,
        description="producer batch size a partition (bytes before compression): one produce request "
        "carries up to this much of a partition; at most max_record_bytes",
    )
    gzip_level: int = Field(
        6,
        ge=1,
        le=9,
        description="gzip level of ingest's producer batches (compression gzip): 6 is the Java client's "
        "default; kafka-python's own, 9, took 2.6x the CPU for batches 2 % smaller on the bench's traces",
    )
    compression: Literal["none", "gzip", "zstd"] = Field(
        "zstd",
        description="ingest's producer compression; zstd: ~20 % less ingest CPU a trace than gzip (level 6), "
        "smaller batches; falls back to gzip (logged, ragmon_kafka_producer_compression_info) without the "
        "zstandard package or on a broker that does not take zstd (before Kafka 2.1)",
    )
    producer_client: Literal["kafka-python", "librdkafka"] = Field(
        "kafka-python",
        description="the client ingest's producer is built on: librdkafka (confluent-kafka) batches and "
        "compresses in C threads of the server process, about half the CPU a record of kafka-python in "
        "processes of its own (producer_processes does not apply to it)",
    )
    producer_processes: int | None = Field(
        None,
        ge=0,
        le=16,
        description="processes ingest's producer runs in (its batching and compression, side by side, "
        "each trace always through the same one); 0: a thread of the server process; unset: 2, or 0 "
        "where one CPU is usable",
    )
    session_timeout_s: float = Field(
        10.0, ge=1, description="consumer group session timeout (real Kafka accepts >= 6)"
    )
    heartbeat_interval_s: float = Field(3.0, gt=0, description="consumer heartbeat; < 1/3 of the session")
    max_poll_interval_s: float = Field(
        300.0,
        gt=0,
        description="longest a worker may spend on one batch; a consume-loop turn older than twice this "
        "fails the worker's liveness (/healthz 503: stuck)",
    )
    poll_timeout_s: float = Field(0.5, gt=0, description="how long one consumer poll waits for records")
    max_poll_records: int = Field(500, gt=0, description="largest batch a worker takes from the broker")
    backlog_interval_s: float = Field(
        10.0,
        gt=0,
        description="how often every ingest replica and sinks worker measures the sinks group's backlog "
        "(ragmon_kafka_backlog_records) and whether the broker answers (ragmon_kafka_reachable)",
    )
    buffer_records: int = Field(
        20_000,
        gt=0,
        description="records ingest holds while the broker is slow or down, before it answers 503",
    )
    publish_timeout_s: float = Field(
        5.0,
        gt=0,
        description="longest ingest waits for the broker to acknowledge (acks=all) what a request "
        "brought before it answers 503 + Retry-After instead of 200",
    )
    max_record_bytes: int = Field(
        1_000_000,
        # service/ingest/span_size.py MIN_RECORD_BYTES (a test holds them equal): one span of the most
        # ingest keeps (900,000 bytes), its resource (65,536) and framing must fit one record
        ge=966_560,
        description="largest record ingest publishes (the broker's message.max.bytes, at least 966560); "
        "a trace's spans are split over several records; a span over 900,000 bytes has its longest "
        "text truncated to fit, in every mode",
    )
    shutdown_grace_s: float = Field(
        20.0,
        ge=0,
        description="on shutdown, how long ingest waits for the broker to acknowledge what it holds; "
        "keep the pod's terminationGracePeriodSeconds above it",
    )

    @model_validator(mode="after")
    def _consistent_timeouts(self) -> KafkaConfig:
        # the client refuses these combinations at run time; say so before anything starts
        if self.delivery_timeout_s <= self.request_timeout_s + self.linger_ms / 1000:
            raise ValueError("delivery_timeout_s must exceed request_timeout_s plus linger_ms")
        if self.heartbeat_interval_s >= self.session_timeout_s:
            raise ValueError("heartbeat_interval_s must be below session_timeout_s")
        if self.batch_bytes > self.max_record_bytes:
            raise ValueError("batch_bytes must be at most max_record_bytes (the broker's message.max.bytes)")
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ValueError("ssl_keyfile is the key of a client certificate: set ssl_certfile too")
        return self


WorkerRole = Literal["sinks", "judge", "drift"]


def _all_worker_roles() -> list[WorkerRole]:
    return ["sinks", "judge", "drift"]


class WorkerConfig(_Section):
    host: str = Field(
        "127.0.0.1", description="`ragmon worker` listen address for /metrics, /healthz and /readyz"
    )
    port: int = Field(
        9400, ge=0, le=65535, description="`ragmon worker` port for /metrics, /healthz and /readyz"
    )
    roles: list[WorkerRole] = Field(
        default_factory=_all_worker_roles,
        description="what a `ragmon worker` runs unless --role is given",
    )


class WalConfig(_Section):
    ack: Literal["durable", "received"] = Field(
        "durable",
        description="embedded mode: durable answers 200 only once the request is in the fsynced write-ahead "
        "log; received answers before (faster; a crash loses what was not yet stored)",
    )
    dir: Path | None = Field(
        None, description="where the log lives; default <data-dir>/wal (a disk of its own is fine)"
    )
    fsync: bool = Field(True, description="fsync each group commit (off only where the disk is already safe)")
    segment_bytes: int = Field(16 << 20, gt=0, description="a new log segment after this many bytes")
    segment_max_age_s: float = Field(10.0, gt=0, description="a new log segment after this long")
    max_bytes: int = Field(
        1 << 30, gt=0, description="log bytes not yet stored before ingest answers 503 (back-pressure)"
    )
    checkpoint_s: float = Field(1.0, gt=0, description="how often stored segments are deleted")
    relog_after_s: float = Field(
        60.0,
        gt=0,
        description="a trace still open this long after its oldest logged request (an agent, a slow LLM "
        "call) has its buffered spans logged again as one record, so the log's older segments can go",
    )


class StoreConfig(_Section):
    url: str | None = Field(
        None,
        repr=False,
        description="SQLAlchemy URL; default sqlite:///<data-dir>/ragmon.db. PostgreSQL: postgresql+psycopg://...",
    )
    retention_days: float = Field(
        30.0,
        gt=0,
        description="traces older than this are deleted, with their judge-queue items, judgments and flags",
    )
    feedback_wait_s: float = Field(
        3600.0,
        gt=0,
        description="feedback about a trace not stored yet waits this long for it, then counts as an orphan",
    )
    keep_non_requests: bool = Field(
        False,
        description="also store traces that are not user requests (index building, batch embedding, health "
        "checks) in the non_request_traces table; they are counted either way",
    )
    timeout_s: float = Field(10.0, gt=0, description="connect / busy / statement timeout")

    @field_validator("url")
    @classmethod
    def _readable_url(cls, url: str | None) -> str | None:
        # checked here, where the error can name the field and leave the value out: at start-up an
        # unreadable URL ended in a traceback, and SQLAlchemy's errors may quote the URL
        if url is None:
            return None
        import sqlalchemy as sa  # here: `ragmon --help` must not import SQLAlchemy

        try:
            sa.make_url(url)
        except Exception:
            raise ValueError(
                "is not a database URL (e.g. postgresql+psycopg://user@host:5432/db or sqlite:///path); "
                "the value is not shown: it may hold a password"
            ) from None
        return url

    @field_serializer("url")
    def _mask_password(self, url: str | None) -> str | None:
        return None if url is None else masked_url(url)
