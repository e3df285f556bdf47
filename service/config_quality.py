"""Configuration sections of what is made of the stored traces: re-ask detection, metric labels,
the LLM judge and its sampling, model prices, drift, golden-set probes, redaction and Arize Phoenix.

Each is one section of `RagmonConfig` (`config.py`, which re-exports them; review's sections stay
there: see its comment); field descriptions are the README's configuration table.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_serializer, field_validator

from service.config_base import _http_url, _Section, masked_url


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
    poll_s: float = Field(0.5, gt=0, description="wait after an empty claim, the first time")
    idle_poll_max_s: float = Field(
        5.0,
        gt=0,
        description="the wait after each further empty claim doubles up to this; traces this process "
        "samples wake its workers at once, so this bounds only how late work queued by another "
        "process (or returned by an expired lease) is claimed",
    )
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
    estimate_every_s: float = Field(
        30.0,
        gt=0,
        description="how often the estimate gauges are recomputed; after a pass that took longer than a "
        "tenth of this, the next waits nine times as long as it took",
    )


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
