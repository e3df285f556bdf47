"""Tests of the generated rule files: promtool checks and unit tests, naming, runbooks, freshness."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards.alerts import alerts
from dashboards.build import main as build
from dashboards.thresholds import load_thresholds
from detectors.registry import DETECTORS
from tests.dashboards.queries import DASHBOARDS, rule_file

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package `prometheus`; .ci/run installs it)"
)
_RECORD = re.compile(r"^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$")


def _alert_rules() -> list[dict[str, Any]]:
    return [r for g in rule_file()["groups"] for r in g["rules"] if "alert" in r]


def test_generated_files_are_up_to_date() -> None:
    # METRICS.md follows service/metrics.py; test_contract checks it against a live /metrics
    generated = ["rules.yml", "grafana-alerting/ragmon-alerts.yaml"] + [
        f"grafana/{p.name}" for p in (DASHBOARDS / "grafana").glob("*.json")
    ]
    only = [arg for rel in generated for arg in ("--only", rel)]
    assert build(["--check", *only]) == 0, "run `python -m dashboards.build` and commit the result"


@needs_promtool
def test_promtool_check_rules() -> None:
    out = subprocess.run(
        [str(PROMTOOL), "check", "rules", str(DASHBOARDS / "rules.yml")], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


@needs_promtool
def test_promtool_unit_tests_pass() -> None:
    files = sorted(str(p) for p in (DASHBOARDS / "tests").glob("*.yaml"))
    out = subprocess.run([str(PROMTOOL), "test", "rules", *files], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in (DASHBOARDS / "tests").glob("*.yaml"):
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {str(r["alert"]) for r in _alert_rules()}
    assert names - firing == set(), "alerts without a firing case"
    assert names - quiet == set(), "alerts without a non-firing case"


def test_alerts_follow_the_conventions() -> None:
    rules = _alert_rules()
    assert len(rules) >= 17
    for rule in rules:
        name = str(rule["alert"])
        assert re.fullmatch(r"Ragmon[A-Z][A-Za-z]+", name), name
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        minutes = int(str(rule["for"]).removesuffix("m"))
        assert 10 <= minutes <= 15, name
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, name
        assert "{{" not in annotations["summary"], f"{name}: summary must be static"
        assert "{{" in annotations["description"], f"{name}: description must be templated"


def test_every_runbook_url_resolves_to_a_runbook_with_the_triage_rule() -> None:
    t = load_thresholds()
    # the shipped base is the runbooks' path from the repository root
    assert t.runbook_base == "dashboards/runbooks"
    for rule in _alert_rules():
        url = str(rule["annotations"]["runbook_url"])
        assert url == f"{t.runbook_base}/{rule['alert']}.md", url
        path = DASHBOARDS.parent / url
        assert path.is_file(), f"{rule['alert']}: {path} missing"
        text = path.read_text()
        assert f"# {rule['alert']}" in text
        assert "drift" in text and "regression" in text and "traces" in text
    names = {str(r["alert"]) for r in _alert_rules()}
    assert {p.stem for p in (DASHBOARDS / "runbooks").glob("*.md")} == names, "a runbook without an alert"


def test_recording_rules_are_named_level_metric_operations() -> None:
    for group in rule_file()["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                record = rule["record"]
                assert _RECORD.fullmatch(record), record
                assert "_total:" not in record, f"{record}: strip _total after rate"
                assert "sum by" not in rule["expr"] or "count by" in rule["expr"], record


def test_drift_alerts_name_registered_detectors() -> None:
    d = load_thresholds().drift
    for name in (*d.query_detectors, *d.retrieval_detectors, *d.model_change_detectors):
        assert name in DETECTORS, f"{name} is not a detector in detectors/registry.py"


def test_alerts_on_app_series_carry_the_release() -> None:
    for alert in alerts(load_thresholds()):
        if "$labels.app" in alert.description:
            assert "release" in alert.expr, alert.name


def test_fast_variant_changes_only_timing(tmp_path: Path) -> None:
    assert build(["--out", str(tmp_path), "--for", "2s", "--interval", "1s", "--only", "rules.yml"]) == 0
    fast = yaml.safe_load((tmp_path / "rules.yml").read_text())
    shipped = rule_file()
    assert [g["name"] for g in fast["groups"]] == [g["name"] for g in shipped["groups"]]
    for f, s in zip(fast["groups"], shipped["groups"], strict=True):
        assert f["interval"] == "1s"
        for fr, sr in zip(f["rules"], s["rules"], strict=True):
            assert fr["expr"] == sr["expr"]
            if "alert" in fr:
                assert fr["for"] == "2s" and fr["annotations"] == sr["annotations"]


def test_the_readme_alert_table_names_every_alert_once() -> None:
    text = (DASHBOARDS / "README.md").read_text()
    listed = re.findall(r"^\| (Ragmon[A-Za-z]+) \|", text, flags=re.MULTILINE)
    assert sorted(listed) == sorted({str(r["alert"]) for r in _alert_rules()})


def _subclasses(cls: type) -> list[type]:
    return [cls, *(sub for direct in cls.__subclasses__() for sub in _subclasses(direct))]


def test_the_back_pressure_alert_counts_every_reason_ingest_answers_503_for() -> None:
    # every retryable error is a 503 + Retry-After; the modules that define ingest's own are imported
    # so that their classes are among the subclasses (the judge's is never raised at ingest)
    import service.bus.kafka_bus
    import service.ingest.wal
    from dashboards.alerts import BACK_PRESSURE_REASONS
    from service.errors import JudgeUnavailable, RetryableError, http_status

    assert service.bus.kafka_bus.QueueFull is service.ingest.wal.QueueFull  # both raise the same class

    retryable = {c for c in _subclasses(RetryableError) if c is not JudgeUnavailable}
    assert {http_status(c("x")) for c in retryable} == {503}
    assert sorted(BACK_PRESSURE_REASONS) == sorted({c.reason for c in retryable})
