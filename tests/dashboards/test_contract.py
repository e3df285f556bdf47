"""The metric contract: every name a rule, dashboard or Grafana alert reads is emitted by a live ragmon
after demo traffic and judging, and every metric ragmon emits is documented in dashboards/METRICS.md."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dashboards.promql import metric_names
from service.demo.run import run_demo
from tests.dashboards.queries import DASHBOARDS, expressions, recorded_names
from tests.live_server import live_server

# Series Prometheus itself adds to every scrape.
PROMETHEUS_SERIES = {"up"}
# Declared families that only get samples from a drift run (checked below when the drift scheduler ran).
DRIFT_PREFIXES = (
    "ragmon_drift_",
    "ragmon_regeneration_rate_ratio",
    "ragmon_regeneration_band_",
    "ragmon_embedding_model_changes",
)
# Families that only get samples once a golden-set probe run has been scored.
PROBE_PREFIXES = ("ragmon_probe_",)
# Judge calibration gauges: sampled once reviewers have reviewed judged traces (service/review/gauges.py).
CALIBRATION_PREFIXES = (
    "ragmon_judge_agreement_ratio",
    "ragmon_judge_false_approval_ratio",
    "ragmon_judge_false_rejection_ratio",
    "ragmon_judge_kappa",
    "ragmon_judge_calibration_pairs",
)
# Human-corrected faithfulness and judge-human agreement: sampled once reviewers labelled enough of the
# blind sample (service/review/correction.py; tests/service/review/test_correction_e2e.py samples them).
HUMAN_LABEL_PREFIXES = (
    "ragmon_faithfulness_corrected_estimate",
    "ragmon_faithful_answers_corrected_ratio",
    "ragmon_judge_human_",
)
# Families of distributed mode (Kafka): declared by its producer and receiver, sampled in tests/distributed.
KAFKA_PREFIXES = ("ragmon_kafka_",)
# Counters whose label values are known only once the event happens (no pre-created zero series).
ONLY_ON_EVENT = {
    "ragmon_judge_failures_total",
    "ragmon_judge_cost_usd_total",  # the heuristic judge costs nothing
    "ragmon_judge_skipped_total",
    "ragmon_empty_retrievals_total",
    "ragmon_usage_unknown_calls_total",  # the demo sends token counts (see test_e2e.py)
    # traces stored in parts (their root span late) and sinks refusing batches: the scrape's traffic
    # sends whole traces to a healthy store
    "ragmon_partial_traces_total",
    "ragmon_partial_traces_completed_total",
    "ragmon_traces_updated_total",
    "ragmon_sink_failures_total",
}


class Exposition:
    """One scrape of /metrics: the declared families and the sample names that carry values."""

    def __init__(self, text: str) -> None:
        self.families: dict[str, str] = {}
        self.samples: set[str] = set()
        for family in text_string_to_metric_families(text):
            if family.name.endswith("_created"):
                continue  # client_python's creation timestamps of counters and histograms
            self.families[family.name] = family.type
            self.samples |= {s.name for s in family.samples}

    def declared(self) -> set[str]:
        """Series names each declared family exposes (counters _total, histograms _bucket/_sum/_count)."""
        names = set()
        for name, kind in self.families.items():
            if kind == "counter":
                names.add(name + "_total")
            elif kind == "histogram":
                names |= {name + "_bucket", name + "_sum", name + "_count"}
            else:
                names.add(name)
        return names


@pytest.fixture(scope="module")
def scrape(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exposition]:
    settings = {
        "assembler": {"grace_s": 0.05},
        "sampler": {"rates": {"base": 1.0}},
        "judging": {"poll_s": 0.05, "estimate_every_s": 0.2},
        "budget": {"calls_per_minute": 100000, "usd_per_day": 1000},
    }
    with live_server(Path(tmp_path_factory.mktemp("contract")), **settings) as server:
        summary = run_demo(server.url, requests=80, rate=0, seed=7)
        server.flush()
        deadline = time.monotonic() + 60
        while server.pipeline.judge_queue.stats().depth and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.pipeline.judge_queue.stats().depth == 0, "judging did not finish"
        # one more estimator pass after the last judgment: it comes every `estimate_every_s`, or
        # later after a pass that took more than a tenth of that (`estimate_wait_s`)
        judged_at = time.monotonic()
        with server.client() as client:
            while True:
                exposition = Exposition(client.get("/metrics").text)
                estimated = "ragmon_faithfulness_estimate" in exposition.samples
                if (estimated and time.monotonic() - judged_at > 0.5) or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        assert summary.traces == 80
        yield exposition


def _used_names() -> dict[str, set[str]]:
    recorded = recorded_names()
    used: dict[str, set[str]] = {}
    for where, expr in expressions().items():
        for name in metric_names(expr) - recorded - PROMETHEUS_SERIES:
            used.setdefault(name, set()).add(where)
    return used


def test_queries_read_only_recorded_or_ragmon_names() -> None:
    used = _used_names()
    assert used, "no PromQL found"
    assert {n for n in used if not n.startswith("ragmon_")} == set()


def _distributed_declared() -> set[str]:
    """What a Kafka-mode ingest (`KafkaBus`), sinks worker (`KafkaReceiver`) and both (`BacklogWatcher`)
    declare; no broker needed."""
    from prometheus_client import generate_latest

    from service.bus.backlog import BacklogWatcher
    from service.bus.kafka import KafkaReceiver
    from service.bus.kafka_bus import KafkaBus
    from service.bus.span_offsets import SpanOffsets
    from service.config import KafkaConfig
    from service.metrics import Metrics

    metrics, config = Metrics(), KafkaConfig()
    KafkaBus(config, metrics)
    BacklogWatcher(config, metrics)  # in ingest and in sinks workers
    KafkaReceiver(config, None, metrics, spans=None, offsets=None)  # type: ignore[arg-type]
    offsets = SpanOffsets(metrics)
    KafkaReceiver(config, None, metrics, group="other", spans=object(), offsets=offsets)  # type: ignore[arg-type]
    return Exposition(generate_latest(metrics.registry).decode()).declared()


def test_every_name_used_is_declared_by_ragmon(scrape: Exposition) -> None:
    declared = scrape.declared() | _distributed_declared()
    missing = {name: sorted(where)[:3] for name, where in _used_names().items() if name not in declared}
    assert missing == {}, "names used in rules or dashboards that ragmon never declares"


def test_every_name_used_has_samples_after_traffic_and_judging(scrape: Exposition) -> None:
    drift_ran = "ragmon_drift_runs_total" in scrape.samples
    missing = {
        name: sorted(where)[:3]
        for name, where in _used_names().items()
        if name not in scrape.samples
        and (drift_ran or not name.startswith(DRIFT_PREFIXES))
        and not name.startswith(PROBE_PREFIXES)
        and not name.startswith(CALIBRATION_PREFIXES)
        and not name.startswith(HUMAN_LABEL_PREFIXES)
        and not name.startswith(KAFKA_PREFIXES)
    }
    assert set(missing) - ONLY_ON_EVENT == set(), missing


def test_every_emitted_metric_is_documented(scrape: Exposition) -> None:
    documented = (DASHBOARDS / "METRICS.md").read_text()
    undocumented = sorted(
        name
        for name in scrape.declared()
        if name.startswith("ragmon_")
        and f"`{name.removesuffix('_bucket')}`" not in documented
        and f"`{name.removesuffix('_sum').removesuffix('_count')}`" not in documented
    )
    assert undocumented == [], "run `python -m dashboards.build` to regenerate METRICS.md"
