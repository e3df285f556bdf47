"""The alert thresholds: one validated model read from `dashboards/thresholds.yaml`.

Every number an alert compares against comes from here, so a team tunes its
alerts in one file and regenerates. Loading refuses unknown keys, negative
numbers and durations Prometheus would not parse.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat

__all__ = ["DEFAULT_PATH", "RUNBOOK_BASE_ENV", "Thresholds", "load_thresholds"]

DEFAULT_PATH = Path(__file__).with_name("thresholds.yaml")
# Environment variable that overrides runbook_base_url when the files are generated.
RUNBOOK_BASE_ENV = "RAGMON_RUNBOOK_BASE_URL"
# Prometheus durations as used in `for:` and range selectors (one unit, whole numbers).
DURATION = r"^[0-9]+(ms|s|m|h|d|w|y)$"
STAGES = ("total", "embedding", "retrieval", "rerank", "generation")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Latency(_Section):
    stage_p95_seconds: dict[str, PositiveFloat]
    ttft_p95_seconds: PositiveFloat

    def model_post_init(self, context: object) -> None:
        unknown = set(self.stage_p95_seconds) - set(STAGES)
        if unknown or "total" not in self.stage_p95_seconds:
            raise ValueError(f"stage_p95_seconds: stages are {STAGES} and must include total; got {unknown}")


class Cost(_Section):
    query_p50_usd: PositiveFloat
    query_p99_usd: PositiveFloat
    judge_usd_per_day: PositiveFloat


class Faithfulness(_Section):
    upper_bound_min: float = Field(gt=0, le=1)


class Judge(_Section):
    backlog_min_items: int = Field(ge=0)
    backlog_window: str = Field(pattern=DURATION)
    stalled_after_seconds: PositiveFloat
    failure_ratio: float = Field(gt=0, le=1)
    human_disagreement_alpha: float = Field(0.01, gt=0, lt=1)
    human_disagreement_increase_min: float = Field(0.05, ge=0, lt=1)
    review_oldest_open_seconds: float = Field(3 * 86400.0, gt=0)


class Ingest(_Section):
    rejected_ratio: float = Field(gt=0, le=1)
    rejected_min_per_second: float = Field(ge=0)
    open_trace_buffer_fill_ratio: float = Field(gt=0, le=1)
    kafka_buffer_fill_ratio: float = Field(gt=0, le=1)
    kafka_consumer_lag_records: PositiveFloat
    kafka_unreachable_seconds: PositiveFloat = 120.0
    backpressure_min_per_second: PositiveFloat = 0.01
    sink_stalled_seconds: PositiveFloat = 600.0
    worker_restarts_15m: float = Field(3, ge=0)


class Drift(_Section):
    query_detectors: list[str] = Field(min_length=1)
    retrieval_detectors: list[str] = Field(min_length=1)
    model_change_detectors: list[str] = Field(min_length=1)
    model_change_window: str = Field(pattern=DURATION)


class Probes(_Section):
    recall_k: int = Field(10, ge=1)
    recall_drop_budget: float = Field(0.05, ge=0, le=1)
    mrr_drop_budget: float = Field(0.05, ge=0, le=1)
    false_exclusion_ratio: float = Field(0.05, gt=0, le=1)


class Grafana(_Section):
    datasource_uid: str = Field("prometheus", min_length=1)
    folder_uid: str = Field("ragmon", min_length=1, max_length=40)


class Thresholds(_Section):
    """Everything in thresholds.yaml."""

    job: str = Field(min_length=1)
    for_: str = Field(alias="for", pattern=DURATION)
    # where runbooks/<AlertName>.md are read; RUNBOOK_BASE_ENV or --runbook-base-url replace it at build time
    runbook_base_url: str = Field(min_length=1)

    latency: Latency
    cost: Cost
    faithfulness: Faithfulness
    judge: Judge
    ingest: Ingest
    drift: Drift
    probes: Probes = Probes()
    grafana: Grafana = Grafana()

    def model_post_init(self, context: object) -> None:
        if "{" in self.runbook_base_url or any(c.isspace() for c in self.runbook_base_url):
            raise ValueError("runbook_base_url is a URL or path prefix (no placeholders, no spaces)")

    @property
    def runbook_base(self) -> str:
        """The runbook base without a trailing slash."""
        return self.runbook_base_url.rstrip("/")

    def runbook(self, alertname: str) -> str:
        """The runbook URL of `alertname`: `<runbook_base_url>/<alertname>.md` for every alert."""
        return f"{self.runbook_base}/{alertname}.md"

    def with_runbook_base(self, base: str | None) -> Thresholds:
        """These thresholds with another runbook base (None: unchanged), validated like the file's."""
        if base is None:
            return self
        return Thresholds.model_validate({**self.model_dump(by_alias=True), "runbook_base_url": base})


def load_thresholds(path: Path = DEFAULT_PATH) -> Thresholds:
    """Read and validate a thresholds file; raises ValueError (pydantic's) on a bad value."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a mapping")
    return Thresholds.model_validate(data)
