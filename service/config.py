"""ragmon's configuration: one validated model, read from defaults, a file, the environment and flags.

Precedence, lowest first: built-in defaults (embedded mode, loopback only) <
config file (`--config`, YAML or JSON) < `RAGMON_*` environment variables
(nested with `__`, e.g. `RAGMON_ASSEMBLER__GRACE_S=1`) < command-line flags.
Everything is validated before anything starts; `load_config` raises
`ConfigError` with one readable line on a bad value.

The README's configuration table is generated from these models
(`ragmon config --markdown`), so the field descriptions are the documentation.

The sections live by area in `config_transport.py` (server, auth, assembler, bus, kafka, worker,
wal, store) and `config_quality.py` (regeneration, metrics, judge, judging, pricing, drift, probes,
redaction, phoenix), their shared base and URL masking in `config_base.py`; every public name is
re-exported here, the place to import configuration from.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from sampler.budget import BudgetConfig
from sampler.policy import SamplerConfig
from service.config_base import MASK as MASK
from service.config_base import _Section
from service.config_base import masked_url as masked_url
from service.config_quality import DriftConfig as DriftConfig
from service.config_quality import JudgeConfig as JudgeConfig
from service.config_quality import JudgingConfig as JudgingConfig
from service.config_quality import MetricsConfig as MetricsConfig
from service.config_quality import PhoenixConfig as PhoenixConfig
from service.config_quality import PricingConfig as PricingConfig
from service.config_quality import ProbesConfig as ProbesConfig
from service.config_quality import RedactionConfig as RedactionConfig
from service.config_quality import RedactionKind as RedactionKind
from service.config_quality import RegenerationConfig as RegenerationConfig
from service.config_transport import AssemblerConfig as AssemblerConfig
from service.config_transport import AuthConfig as AuthConfig
from service.config_transport import BusConfig as BusConfig
from service.config_transport import KafkaConfig as KafkaConfig
from service.config_transport import ServerConfig as ServerConfig
from service.config_transport import StoreConfig as StoreConfig
from service.config_transport import WalConfig as WalConfig
from service.config_transport import WorkerConfig as WorkerConfig
from service.config_transport import WorkerRole as WorkerRole

SAMPLE_API_KEY = "ragmon-sample-key-change-me"


class ConfigError(Exception):
    """The configuration is invalid; the message is one line meant for a person."""


# Review's sections stay here, beside the root model: the README's configuration table names the type
# of review.reviewers by its module (`dict[str, service.config.ReviewerConfig]`), and a user reads the
# type from there.
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
