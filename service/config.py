"""ragmon's configuration: one validated model, read from defaults, a file, the environment and flags.

Precedence, lowest first: built-in defaults (embedded mode, loopback only) <
config file (`--config`, YAML or JSON) < `RAGMON_*` environment variables
(nested with `__`, e.g. `RAGMON_ASSEMBLER__GRACE_S=1`) < command-line flags.
Everything is validated before anything starts; `load_config` raises
`ConfigError` with one readable line on a bad value.

The README's configuration table is generated from these models
(`ragmon config --markdown`), so the field descriptions are the documentation.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from sampler.budget import BudgetConfig
from sampler.policy import SamplerConfig

SAMPLE_API_KEY = "ragmon-sample-key-change-me"


class ConfigError(Exception):
    """The configuration is invalid; the message is one line meant for a person."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


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


MASK = "**********"
"""What every secret-typed setting shows as in `ragmon config`, logs, errors and `/readyz` (as SecretStr)."""


# query parameters whose values are credentials (`?password=`, `?sslpassword=`, `?api_key=`, `?sig=` ...)
_SECRET_QUERY = re.compile(
    r"(?i)(?<![^?&;])([\w.-]*(?:pass|pwd|secret|token|key|sig|credential|auth)[\w.-]*)=([^&;#]*)"
)


def masked_url(url: str) -> str:
    """`url` as it may be shown or logged: the password of its user info and the values of its
    credential-like query parameters masked (`MASK`), everything else as written.

    Works on any scheme (database, broker, HTTP), without parsing what is not a credential, so a URL no
    library reads is masked as well; text with no scheme that holds an `@` is masked whole."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return MASK if "@" in url else url
    query_at = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    # the user info ends at the last "@" before the query: a password may hold "/" or "@" unencoded
    at = rest.rfind("@", 0, query_at)
    if at >= 0:
        user, colon, _password = rest[:at].partition(":")
        if colon:
            rest = f"{user}:{MASK}{rest[at:]}"
            query_at += len(user) + 1 + len(MASK) - at
    head, tail = rest[:query_at], rest[query_at:]
    if tail.startswith("?"):
        tail = _SECRET_QUERY.sub(lambda m: f"{m.group(1)}={MASK}", tail)
    return f"{scheme}://{head}{tail}"


def _http_url(value: str | None) -> str | None:
    """`value` unchanged if it is an http(s) URL; the error never repeats it (it may hold a password)."""
    if value is not None and not value.lower().startswith(("http://", "https://")):
        raise ValueError("must be an http:// or https:// URL (not shown: it may hold a password)")
    return value


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
    compression: Literal["none", "gzip", "zstd"] = Field(
        "gzip",
        description="producer compression; zstd spends ~1/3 of gzip's CPU a record at a better ratio "
        "(brokers from Kafka 2.1 on; needs the zstandard package, in the kafka extra)",
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
    retention_days: float = Field(30.0, gt=0, description="traces older than this are deleted")
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


class RegenerationConfig(_Section):
    window_s: float = Field(
        300.0, ge=0, description="a re-ask in the same session within this many seconds is a regeneration"
    )
    similarity: float = Field(
        0.8,
        gt=0,
        le=1,
        description="word-set Jaccard similarity at or above which two queries are near-identical",
    )
    max_sessions: int = Field(100_000, gt=0, description="sessions remembered for re-ask detection (LRU)")


class MetricsConfig(_Section):
    scrape_token: SecretStr | None = Field(
        None,
        description="when set, /metrics answers only `Authorization: Bearer <token>` (Prometheus: "
        "authorization.credentials); unset: open to whoever reaches the port (loopback by default)",
    )
    tenant_label: bool | None = Field(
        None,
        description="put a `tenant` label before `app` on every per-app metric, so a tenant's traces only "
        "ever count under its own tenant (from its API key) and equal app names of two tenants are not "
        "summed; unset: on when auth.api_keys name two or more tenants, off for one-tenant installs (the "
        "series keep their current labels); false is refused with two or more tenants",
    )
    max_tenants: int = Field(
        20,
        gt=0,
        description="tenant label values: the tenants auth.api_keys name (there may be no more than this), "
        "or without keys the first seen, before the rest become 'other'",
    )
    max_apps: int = Field(
        20, gt=0, description="distinct app label values per tenant before the tenant's rest become 'other'"
    )
    max_models: int = Field(
        20, gt=0, description="distinct model label values per tenant before the tenant's rest become 'other'"
    )
    intents: list[str] = Field(
        default_factory=list,
        description="intent values exported as such, others as 'other' (empty: the first max_intents seen "
        "of each tenant)",
    )
    max_intents: int = Field(
        20, gt=0, description="distinct intent label values per tenant when `intents` is empty"
    )
    max_releases: int = Field(
        20, gt=0, description="distinct release label values per tenant before the tenant's rest are 'other'"
    )
    max_probe_categories: int = Field(
        20, gt=0, description="golden-set category label values on probe gauges before the rest are 'other'"
    )
    max_golden_sets: int = Field(
        10, gt=0, description="golden-set names on probe gauges before the rest are 'other'"
    )


def _default_model() -> str:
    return os.environ.get("RAGMON_JUDGE_MODEL") or "gpt-4o-mini"


class JudgeConfig(BaseModel):
    """Where and how the LLM judge calls its model; every default runs as-is.

    `base_url` and `api_key` left unset fall back to `OPENAI_BASE_URL` and
    `OPENAI_API_KEY`, exactly as the `openai` SDK does; `model` defaults to
    `RAGMON_JUDGE_MODEL`, else gpt-4o-mini.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str | None = Field(
        default=None, repr=False, description="OpenAI-compatible endpoint; else $OPENAI_BASE_URL"
    )
    api_key: SecretStr | None = Field(
        default=None, description="endpoint key; else $OPENAI_API_KEY; never logged"
    )
    model: str = Field(
        default_factory=_default_model, min_length=1, description="judge model; else $RAGMON_JUDGE_MODEL"
    )
    timeout_s: float = Field(default=30.0, gt=0, description="whole request, per call")
    connect_timeout_s: float = Field(default=5.0, gt=0, description="TCP/TLS connect timeout per call")
    max_attempts: int = Field(default=4, ge=1, description="calls per judgment while the endpoint fails")
    max_invalid_replies: int = Field(default=2, ge=1, description="invalid replies before a recorded failure")
    backoff_base_s: float = Field(default=0.5, gt=0, description="first retry delay (jittered, doubling)")
    backoff_max_s: float = Field(default=20.0, gt=0, description="longest retry delay")
    max_retry_after_s: float = Field(
        default=60.0, ge=0, description="a longer Retry-After ends the judgment at once instead of sleeping"
    )
    max_completion_tokens: int = Field(default=1024, ge=16, description="cap on the judge reply length")
    max_context_chars: int = Field(
        default=16_000, ge=1, description="context beyond this is cut, last chunks first"
    )
    max_connections: int = Field(default=100, ge=1, description="HTTP connection pool size")
    when_unavailable: Literal["raise", "record"] = Field(
        default="raise", description="endpoint down: keep the item queued (raise) or record a failure"
    )
    backend: Literal["ragmon", "phoenix_evals"] = Field(
        default="ragmon",
        description="ragmon: claim-level judge; phoenix_evals: Arize Phoenix evals' template on the same "
        "endpoint (service/judge/phoenix_evals.py)",
    )
    phoenix_template: Literal["faithfulness", "hallucination"] = Field(
        default="faithfulness", description="the Phoenix evals template of the phoenix_evals backend"
    )
    offline: Literal["heuristic", "learned"] = Field(
        default="heuristic",
        description="judge without an endpoint: heuristic (rules, heuristic/N) or learned (boosted stumps on "
        "claim features, learned/N); chosen by leave-one-source-out (bench/judge/loso_summary.json)",
    )

    _http_base_url = field_validator("base_url")(_http_url)

    @field_serializer("base_url")
    def _mask_base_url(self, url: str | None) -> str | None:
        return None if url is None else masked_url(url)

    def endpoint_configured(self, environ: Mapping[str, str] | None = None) -> bool:
        """Whether an endpoint is configured here or in the environment (else the offline judge runs)."""
        env = os.environ if environ is None else environ
        return bool(self.base_url or self.api_key or env.get("OPENAI_BASE_URL") or env.get("OPENAI_API_KEY"))


class JudgingConfig(_Section):
    enabled: bool = Field(True, description="sample traces into the judge queue and run judge workers")
    workers: int = Field(1, ge=0, description="judge worker loops in this process (0: enqueue only)")
    concurrency: int = Field(16, gt=0, description="judgments in flight per worker")
    batch_size: int = Field(32, gt=0, description="items a worker claims at once")
    lease_s: float = Field(120.0, gt=0, description="a claimed item returns to the queue after this long")
    poll_s: float = Field(0.5, gt=0, description="idle wait between empty claims")
    max_attempts: int = Field(
        5,
        gt=0,
        description="attempts before an item ends 'failed' (an unavailable judge endpoint uses none)",
    )
    flag_threshold: float = Field(0.5, ge=0, le=1, description="flag answers with faithfulness under this")
    estimated_cost_usd: float = Field(
        0.0005, ge=0, description="expected USD per judgment, charged against the daily budget"
    )
    estimate_window_s: float = Field(86400.0, gt=0, description="rolling window of the faithfulness estimate")
    estimate_every_s: float = Field(30.0, gt=0, description="how often the estimate gauges are recomputed")


class ReviewerConfig(_Section):
    token_sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="hex sha256 of the reviewer's sign-in token (preferred: the token itself is not stored)",
    )
    token: SecretStr | None = Field(
        None, min_length=16, description="the sign-in token in clear (local trials); never shown"
    )
    tenants: list[str] = Field(default_factory=lambda: ["default"], description="tenants this reviewer sees")

    @model_validator(mode="after")
    def _one_token(self) -> ReviewerConfig:
        if (self.token is None) == (self.token_sha256 is None):
            raise ValueError("give exactly one of token and token_sha256")
        return self


class ReviewConfig(_Section):
    reviewers: dict[str, ReviewerConfig] = Field(
        default_factory=dict,
        description="reviewer name -> {token_sha256 or token, tenants}; empty: nobody can sign in",
    )
    blind_rate: float = Field(
        0.05,
        ge=0,
        le=1,
        description="share of judged traces sent to the blind calibration queue (chosen by trace id)",
    )
    blind_rates: dict[str, float] = Field(
        default_factory=dict,
        description="app -> its own blind rate, beating blind_rate (`ragmon review labels` says what "
        "rate gives the interval width you want)",
    )
    min_labels: int = Field(
        30,
        ge=2,
        description="fewest blind labels in a group (app, release or intent) for a human-corrected "
        "faithfulness estimate; below it the API says why there is none",
    )
    plan_half_width: float = Field(
        0.05,
        gt=0,
        lt=0.5,
        description="the half-width of the human-corrected interval the weekly report plans blind labels for",
    )
    agreement_reference_s: float = Field(
        28 * 86400.0,
        gt=0,
        description="judge-human disagreement in the estimate window is tested against the blind labels "
        "of this long a period before it",
    )
    regeneration_share: float = Field(
        0.1, ge=0, le=1, description="share of regenerated answers sent to review (by trace id)"
    )
    lease_s: float = Field(
        900.0, gt=0, description="a claimed review item returns to the queue after this long"
    )
    session_ttl_s: float = Field(8 * 3600.0, gt=0, description="a reviewer's sign-in lasts this long")
    session_secret: SecretStr | None = Field(
        None,
        min_length=32,
        description="key that signs review sessions; unset: random per process (set it for several replicas)",
    )
    secure_cookie: bool = Field(False, description="mark the session cookie Secure (when served over HTTPS)")
    max_judge_versions: int = Field(
        5, gt=0, description="judge versions with calibration metrics (the most recently reviewed)"
    )

    @field_validator("blind_rates")
    @classmethod
    def _rates_are_shares(cls, rates: dict[str, float]) -> dict[str, float]:
        bad = {app: rate for app, rate in rates.items() if not 0.0 <= rate <= 1.0}
        if bad:
            raise ValueError(f"blind rates are shares in [0, 1], got {bad}")
        return rates


class PricingConfig(_Section):
    overrides: dict[str, tuple[float, float]] = Field(
        default_factory=dict,
        description="model -> [USD per 1M input tokens, USD per 1M output tokens]; beats the shipped table",
    )


class DriftConfig(_Section):
    enabled: bool = Field(True, description="keep drift windows and run the drift detectors on a schedule")
    interval_s: float = Field(3600.0, gt=0, description="how often every drift detector runs")
    flush_s: float = Field(
        60.0, gt=0, description="how often in-memory windows are merged into the stored sample"
    )
    window_s: float = Field(
        86400.0, gt=0, description="rolling current window: traces of the last this many seconds"
    )
    window_capacity: int = Field(
        2000, ge=10, description="most observations in a current window (uniform sample of its traffic)"
    )
    reference_capacity: int = Field(
        5000,
        ge=10,
        description="most observations in a pinned reference (uniform sample); the query-text test fits "
        "its embedder on a fifth of them (at most 1,000) and compares the window with the rest",
    )
    bucket_s: float = Field(3600.0, gt=0, description="time bucket of the stored observation sample")
    bucket_capacity: int = Field(
        2000,
        gt=0,
        description="most observations stored per tenant, app, embedding model and bucket while the bucket "
        "is inside the current window (at least window_capacity: a day whose traffic came in one hour "
        "still fills the window)",
    )
    archive_capacity: int = Field(
        250,
        gt=0,
        description="most observations kept per bucket once it is older than the current window "
        "(for pins from older ranges)",
    )
    reservoir_capacity: int = Field(
        250,
        gt=0,
        description="most observations held in memory per open bucket between two flushes (reservoir)",
    )
    max_open_buckets: int = Field(
        256,
        gt=0,
        description="in-memory reservoirs between flushes (memory: at most max_open_buckets x "
        "reservoir_capacity observations); traces for more are dropped and counted",
    )
    max_apps: int = Field(
        50, gt=0, description="apps with drift windows per tenant; later apps are not watched"
    )
    max_models_per_app: int = Field(8, gt=0, description="embedding models with windows per app")
    min_window: int = Field(50, ge=2, description="fewer observations on either side: insufficient_data")
    alpha: float = Field(0.05, gt=0, lt=1, description="false-alarm rate of each drift test per run")
    alphas: dict[str, float] = Field(
        default_factory=dict, description="per-detector alpha, by detector name; wins over alpha"
    )
    hysteresis: int = Field(1, ge=1, description="alarm after this many consecutive drifted runs")
    regeneration_alpha: float = Field(
        0.01, gt=0, lt=1, description="false-alarm rate of the regeneration-rate control band"
    )
    regeneration_min_baseline: int = Field(
        200, gt=0, description="traces in the regeneration baseline before the band can alarm"
    )
    max_intents: int = Field(
        20, gt=0, description="intents with a regeneration band per app; others are 'other'"
    )
    top_k: int = Field(5, gt=0, description="k of the mean top-k retrieval score")
    hits_by: str | None = Field(
        None, description="chunk metadata key naming a hit's collection; unset: the document id"
    )
    embedder_dim: int = Field(384, ge=2, description="width of the built-in query embedder (no app vectors)")
    max_query_chars: int = Field(500, gt=0, description="query text kept per observation, in characters")
    retention_days: float = Field(30.0, gt=0, description="observations and runs older than this are deleted")
    seed: int = Field(0, description="seed of reservoir sampling and permutation tests")


class ProbesConfig(_Section):
    """Scoring of golden-set probe runs (`/api/v1/probes`, `ragmon probe`)."""

    ks: list[int] = Field(
        default_factory=lambda: [5, 10],
        min_length=1,
        description="cutoffs k of recall, precision, hit rate and nDCG on probe runs (distinct, >= 1)",
    )
    relevance_level: int = Field(1, ge=1, description="gold grade at or above which a chunk is relevant")
    bootstrap_resamples: int = Field(
        2000, ge=100, description="paired bootstrap resamples behind the confidence interval of each delta"
    )
    confidence: float = Field(0.95, gt=0, lt=1, description="confidence level of those intervals")
    seed: int = Field(0, description="seed of the bootstrap (same runs, same interval)")
    correctness: Literal["auto", "llm", "heuristic"] = Field(
        "auto",
        description="answer-correctness judge: llm (the judge endpoint), heuristic (offline fact match), "
        "auto (llm when an endpoint is configured)",
    )
    correctness_concurrency: int = Field(
        8, gt=0, description="correctness calls in flight while scoring a run"
    )
    supported_threshold: float = Field(
        0.75, ge=0, le=1, description="faithfulness at or above which a correct answer counts as supported"
    )

    @field_validator("ks")
    @classmethod
    def _distinct_positive(cls, value: list[int]) -> list[int]:
        if any(k < 1 for k in value) or len(set(value)) != len(value):
            raise ValueError("ks must be distinct integers >= 1")
        return sorted(value)


RedactionKind = Literal["email", "phone", "card", "api_key"]
_REDACTION_KINDS: list[RedactionKind] = ["email", "phone", "card", "api_key"]


class RedactionConfig(_Section):
    enabled: bool = Field(
        False,
        description="redact personal data and secrets from every field ragmon keeps (traces, feedback, "
        "review notes, golden sets; docs/security.md lists them) before it keeps them",
    )
    builtin: list[RedactionKind] = Field(
        default_factory=lambda: list(_REDACTION_KINDS),
        description="built-in kinds to redact (service/redaction.py says what each matches)",
    )
    patterns: dict[str, str] = Field(
        default_factory=dict,
        description="your own kinds: name (letters, digits, _ - .) -> regular expression, redacted alike",
    )
    key: SecretStr | None = Field(
        None,
        min_length=16,
        description="key of the digests that keep redacted ids apart ([REDACTED:<kind>:<digest>]); unset: "
        "one made and kept in <data-dir>/redaction.key; required in distributed mode (every process "
        "must redact an id alike); never shown",
    )

    @field_validator("patterns")
    @classmethod
    def _compiles(cls, patterns: dict[str, str]) -> dict[str, str]:
        import re

        for name, pattern in patterns.items():
            # a name is written into each mark ([REDACTED:<name>:...]), and marks into JSON strings
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
                raise ValueError(f"redaction pattern name {name!r} must be letters, digits, '_', '-' or '.'")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(
                    f"redaction pattern {name!r} is not a valid regular expression: {exc}"
                ) from None
        return patterns


class PhoenixConfig(_Section):
    """Working alongside Arize Phoenix: a tee of OTLP requests, and judgments written back as annotations."""

    endpoint: str | None = Field(
        None,
        repr=False,
        description="Phoenix base URL, e.g. http://phoenix:6006; unset: nothing is sent to Phoenix",
    )
    api_key: SecretStr | None = Field(None, description="Phoenix API key (a Bearer token); never logged")
    project: str = Field(
        "default",
        min_length=1,
        description="Phoenix project where a trace's root span is looked for first (then the others:"
        " Phoenix files a trace under the project its spans name)",
    )
    forward: bool = Field(True, description="forward each accepted OTLP request to Phoenix unchanged (a tee)")
    annotate: bool = Field(
        True, description="write judgments (LLM) and reviewers' labels (HUMAN) as root-span annotations"
    )
    forward_buffer_requests: int = Field(
        1000, gt=0, description="OTLP requests waiting for Phoenix before new ones are dropped (counted)"
    )
    forward_buffer_bytes: int = Field(
        64 * 1024 * 1024, gt=0, description="bytes waiting for Phoenix before new requests are dropped"
    )
    forward_concurrency: int = Field(4, gt=0, description="requests in flight to Phoenix")
    annotate_buffer: int = Field(
        10_000, gt=0, description="annotations waiting for Phoenix before new ones are dropped (counted)"
    )
    annotate_batch: int = Field(100, gt=0, le=1000, description="annotations written per Phoenix request")
    timeout_s: float = Field(10.0, gt=0, description="whole request to Phoenix, per call")
    connect_timeout_s: float = Field(2.0, gt=0, description="TCP connect timeout per call to Phoenix")
    max_attempts: int = Field(8, gt=0, description="tries per annotation before it is dropped (counted)")
    annotate_delay_s: float = Field(
        2.0,
        ge=0,
        description="first try of an annotation this long after it is queued: Phoenix stores spans"
        " asynchronously, and a root span not there yet is looked up again quietly",
    )
    forward_retry_s: float = Field(
        600.0,
        gt=0,
        description="how long the tee retries one request while Phoenix is away (the buffer bounds what"
        " waits meanwhile); then it is dropped as retries_exhausted (counted)",
    )
    backoff_base_s: float = Field(0.5, gt=0, description="first retry delay (jittered, doubling)")
    backoff_max_s: float = Field(30.0, gt=0, description="longest retry delay")
    drain_s: float = Field(5.0, ge=0, description="on shutdown, time to deliver what is buffered")

    _http_endpoint = field_validator("endpoint")(_http_url)

    @field_serializer("endpoint")
    def _mask_endpoint(self, url: str | None) -> str | None:
        return None if url is None else masked_url(url)

    @property
    def forwarding(self) -> bool:
        return self.endpoint is not None and self.forward

    @property
    def annotating(self) -> bool:
        return self.endpoint is not None and self.annotate


class RagmonConfig(_Section):
    """The whole configuration. Defaults run embedded on one machine with no setup."""

    data_dir: Path = Field(Path("ragmon-data"), description="where the SQLite file and reports live")
    dev: bool = Field(False, description="allow the sample API key (never in production)")
    log_level: str = Field("info", description="debug | info | warning | error")
    server: ServerConfig = ServerConfig()
    auth: AuthConfig = AuthConfig()
    assembler: AssemblerConfig = AssemblerConfig()
    bus: BusConfig = BusConfig()
    kafka: KafkaConfig = KafkaConfig()
    worker: WorkerConfig = WorkerConfig()
    store: StoreConfig = StoreConfig()
    wal: WalConfig = WalConfig()
    regeneration: RegenerationConfig = RegenerationConfig()
    metrics: MetricsConfig = MetricsConfig()
    pricing: PricingConfig = PricingConfig()
    judging: JudgingConfig = JudgingConfig()
    judge: JudgeConfig = JudgeConfig()
    sampler: SamplerConfig = SamplerConfig()
    budget: BudgetConfig = BudgetConfig()
    drift: DriftConfig = DriftConfig()
    review: ReviewConfig = ReviewConfig()
    probes: ProbesConfig = ProbesConfig()
    phoenix: PhoenixConfig = PhoenixConfig()
    redaction: RedactionConfig = RedactionConfig()

    @model_validator(mode="after")
    def _tenants_have_their_own_labels(self) -> RagmonConfig:
        tenants = len(self.auth.tenants)
        label = self.metrics.tenant_label
        if label is None:
            self.metrics = self.metrics.model_copy(update={"tenant_label": tenants >= 2})
        elif not label and tenants >= 2:
            raise ValueError(
                f"metrics.tenant_label is false, but auth.api_keys name {tenants} tenants: their traces "
                "would count under each other's app names; remove the setting (it is on for them)"
            )
        if self.metrics.tenant_label and tenants > self.metrics.max_tenants:
            raise ValueError(
                f"auth.api_keys name {tenants} tenants, more than metrics.max_tenants "
                f"({self.metrics.max_tenants}); raise it so that each tenant keeps its own label"
            )
        return self

    @model_validator(mode="after")
    def _redaction_covers_everything_sent(self) -> RagmonConfig:
        if self.redaction.enabled and self.phoenix.endpoint and self.phoenix.forward:
            raise ValueError(
                "redaction cannot reach the Phoenix tee, which forwards OTLP requests as received: "
                "set phoenix.forward to false, or turn redaction off"
            )
        if self.redaction.enabled and self.bus.kind == "kafka" and self.redaction.key is None:
            raise ValueError(
                "redaction in distributed mode needs redaction.key (RAGMON_REDACTION__KEY), the same for "
                "every ingest and worker process, so that each redacts an id alike"
            )
        return self

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if value.lower() not in {"debug", "info", "warning", "error"}:
            raise ValueError("unknown log level; use debug, info, warning or error")
        return value.lower()

    @property
    def store_url(self) -> str:
        return self.store.url or f"sqlite:///{self.data_dir / 'ragmon.db'}"

    @property
    def store_url_masked(self) -> str:
        """`store_url` as it may be shown or logged (`masked_url`)."""
        return masked_url(self.store_url)


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except ValueError as exc:  # json's message names the place, never the text
        raise ConfigError(f"config file {path} is not valid JSON: {exc}") from None
    except yaml.YAMLError as exc:
        # YAML's own message quotes the lines around the problem, and a line there may hold a secret
        raise ConfigError(f"config file {path} is not valid YAML: {_yaml_problem(exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What a YAML error says and where, without the quoted text around it."""
    problem = getattr(exc, "problem", None) or "cannot parse"
    mark = getattr(exc, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


# mappings whose keys are themselves secrets: an error inside one names the key masked
_SECRET_KEYED = {("auth", "api_keys")}
_SETTING_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def _error_place(error: ErrorDetails) -> str:
    """Where a validation error is, as `section.setting`, with nothing in it that could be a secret:
    a key of a secret-keyed mapping (an API key) shows as `MASK`, and an unknown key that does not
    look like a setting's name (an API key written one level too high, say) as `<unknown key>`."""
    loc = [str(part) for part in error["loc"]]
    for index in range(2, len(loc)):
        if (loc[index - 2], loc[index - 1]) in _SECRET_KEYED:
            loc[index] = MASK
    if error["type"] == "extra_forbidden" and loc and not _SETTING_NAME.match(loc[-1]):
        loc[-1] = "<unknown key>"
    return ".".join(loc) or "config"


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _env_layer(environ: dict[str, str]) -> dict[str, Any]:
    """The RAGMON_* variables as a nested mapping (objects and lists parsed as JSON).

    Variables whose first part names no setting section are ignored, so tools
    may keep their own RAGMON_* variables; inside a known section, an unknown
    name is an error (a typo must not pass silently).
    """
    layer: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith("RAGMON_"):
            continue
        path = name[len("RAGMON_") :].lower().split("__")
        if path[0] not in RagmonConfig.model_fields:
            continue
        # Objects, lists and quoted strings are JSON (Helm writes every value JSON-encoded); other scalars
        # stay strings for pydantic to convert by field type, so a secret made of digits stays a string.
        value: Any = raw
        if raw == "null":
            value = None
        elif raw.lstrip().startswith(("{", "[", '"')):
            try:
                value = json.loads(raw)
            except ValueError as exc:
                raise ConfigError(f"environment variable {name} is not valid JSON: {exc}") from None
        node = layer
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"environment variable {name} conflicts with another RAGMON_ variable")
        node[path[-1]] = value
    return layer


def load_config(
    *,
    config_file: Path | None = None,
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> RagmonConfig:
    """Build and validate the configuration from file < environment < overrides (flags)."""
    layers: dict[str, Any] = {}
    if config_file is not None:
        layers = _deep_merge(layers, _read_file(config_file))
    layers = _deep_merge(layers, _env_layer(dict(os.environ if environ is None else environ)))
    if overrides:
        layers = _deep_merge(layers, overrides)
    try:
        config = RagmonConfig.model_validate(layers)
    except ValidationError as exc:
        # the message of the first error and its place, never the input (`input` is left out)
        first = exc.errors(include_url=False, include_input=False)[0]
        raise ConfigError(f"invalid configuration at {_error_place(first)}: {first['msg']}") from None
    if SAMPLE_API_KEY in config.auth.api_keys and not config.dev:
        raise ConfigError("the sample API key is configured; replace it, or pass --dev for a local trial")
    return config


def describe_settings() -> list[tuple[str, str, str, str]]:
    """(environment variable, type, default, description) for every setting, for the README table."""
    rows: list[tuple[str, str, str, str]] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation, f"{prefix}{name.upper()}__")
                continue
            default = field.get_default(call_default_factory=True)
            type_name = (
                str(annotation)
                if getattr(annotation, "__args__", None)
                else getattr(annotation, "__name__", "")
            )
            type_name = type_name.replace("typing.", "").replace("pydantic.types.", "").replace("|", "or")
            rows.append(
                (
                    f"{prefix}{name.upper()}",
                    type_name,
                    json.dumps(default, default=str),
                    field.description or "",
                )
            )

    walk(RagmonConfig, "RAGMON_")
    return rows


def settings_table() -> str:
    """Every setting as a Markdown table (the README's configuration section)."""
    lines = ["| environment variable | type | default | meaning |", "|---|---|---|---|"]
    for name, type_name, default, description in describe_settings():
        cells = [f"`{name}`", type_name, f"`{default}`", description]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)
