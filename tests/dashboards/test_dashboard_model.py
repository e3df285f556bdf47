"""What the dashboards' JSON models must carry: shaded bands, threshold lines, links, real runbook URLs.

Each test reads the generated `dashboards/grafana/*.json` (the files Grafana provisions) and
checks it against `thresholds.yaml`, `METRICS.md` and the alert rules, so a panel that loses its
band, a threshold that drifts from the file or a link to a missing runbook fails here. No Grafana
server is installable from the registries this project uses (shared/RECIPES.md §4), so these
are checks of the model, not of rendering.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards.alerts import alerts
from dashboards.build import main as build
from dashboards.grafana_dashboards import DEFAULT_RAGMON_URL, RULES_NOTE, TAG
from dashboards.promql import metric_names
from dashboards.thresholds import RUNBOOK_BASE_ENV, load_thresholds
from tests.dashboards.queries import DASHBOARDS, dashboard_files, recorded_names

PROMTOOL = shutil.which("promtool")
_LINE_STYLES = {"line", "dashed", "line+area", "dashed+area"}
_BOUND = re.compile(r"_(band_)?(lower|upper)(_ratio)?$")


def _boards() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in dashboard_files()}


def _panels() -> list[tuple[str, dict[str, Any]]]:
    return [(name, p) for name, b in _boards().items() for p in b["panels"] if p["type"] != "row"]


def _metric(expr: str) -> str:
    """The one metric a target reads, or "" for one that combines several."""
    names = metric_names(expr)
    return names.pop() if len(names) == 1 else ""


def _overrides(panel: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """byName matcher -> {property id: value}."""
    found: dict[str, dict[str, Any]] = {}
    for o in panel.get("fieldConfig", {}).get("overrides", []):
        if o["matcher"]["id"] == "byName":
            found.setdefault(o["matcher"]["options"], {}).update(
                {p["id"]: p["value"] for p in o["properties"]}
            )
    return found


def _bound_pairs(panel: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(lower target, upper target) for each lower/upper gauge pair the panel queries."""
    targets = {_metric(t["expr"]): t for t in panel["targets"] if _BOUND.search(_metric(t["expr"]))}
    pairs = []
    for name, lower in targets.items():
        match = _BOUND.search(name)
        assert match
        if match.group(2) == "lower":
            upper = name[: match.start()] + match.group(0).replace("lower", "upper")
            assert upper in targets, f"{panel['title']}: {name} without {upper}"
            pairs.append((lower, targets[upper]))
    return pairs


def test_every_interval_gauge_is_drawn_as_a_band_somewhere() -> None:
    documented = set(
        re.findall(r"^\| `(ragmon_\w+)` \| gauge", (DASHBOARDS / "METRICS.md").read_text(), re.M)
    )
    lowers = {m for m in documented if _BOUND.search(m) and "lower" in m}
    banded = {_metric(lo["expr"]) for _, p in _panels() for lo, _ in _bound_pairs(p)}
    assert lowers and lowers <= banded, sorted(lowers - banded)


def test_each_lower_upper_pair_has_a_fill_between_override() -> None:
    checked = 0
    for board, panel in _panels():
        where = f"{board}: {panel['title']}"
        overrides = _overrides(panel)
        for lower, upper in _bound_pairs(panel):
            lo, up = lower["legendFormat"], upper["legendFormat"]
            # fillBelowTo names one series: a templated legend would name a different one per series
            assert "{{" not in lo + up, where
            assert overrides[up]["custom.fillBelowTo"] == lo, where
            assert overrides[up]["custom.fillOpacity"] > 0, where
            assert overrides[lo].get("custom.fillOpacity", 0) == 0, where
            for legend in (lo, up):
                assert overrides[legend]["custom.lineStyle"]["fill"] == "dash", where
            checked += 1
    # faithfulness and faithful answers, each judge-only and human-corrected; regeneration band,
    # agreement, false approval, false rejection, kappa; per-app judge-human agreement and kappa;
    # recall@k delta, MRR delta
    assert checked == 13


def test_band_panels_hold_every_multi_valued_label_fixed() -> None:
    """With fixed legends, a band panel must return one series per legend: one app (repeat) and one value
    of each further label (single-value variables)."""
    multi = {
        v["name"]
        for b in _boards().values()
        for v in b["templating"]["list"]
        if v.get("multi") or v.get("includeAll")
    }
    for board, panel in _panels():
        if not _bound_pairs(panel):
            continue
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"])) & multi
            assert used <= {"app", "tenant"}, f"{board}: {panel['title']} uses {used}"
            if "app" in used:
                assert panel.get("repeat") == "app", f"{board}: {panel['title']} must repeat per app"


def _expected_limits() -> dict[str, tuple[set[float], bool]]:
    """Panel title -> (threshold values from thresholds.yaml, whether lower is worse)."""
    t = load_thresholds()
    slo, p = t.latency.stage_p95_seconds, t.probes
    floor = {t.faithfulness.upper_bound_min}
    return {
        "Open-trace buffer": ({t.ingest.open_trace_buffer_fill_ratio}, False),
        "p95 latency per stage": ({v for s, v in slo.items() if s != "total"}, False),
        "End-to-end latency p50 / p95 / p99": ({slo["total"]}, False),
        "Time to first token p50 / p95 / p99": ({t.latency.ttft_p95_seconds}, False),
        "Cost per query p50 / p99": ({t.cost.query_p50_usd, t.cost.query_p99_usd}, False),
        "Ingest Kafka buffer": ({t.ingest.kafka_buffer_fill_ratio}, False),
        "Kafka consumer lag": ({t.ingest.kafka_consumer_lag_records}, False),
        "Faithfulness with 95% interval: $app": (floor, True),
        "Faithfulness by release": (floor, True),
        "Faithfulness by intent": (floor, True),
        "Judge spend, last 24h": ({t.cost.judge_usd_per_day}, False),
        "Judge failures per call": ({t.judge.failure_ratio}, False),
        "Queue depth and failed items": ({float(t.judge.backlog_min_items)}, False),
        "Since the last judgment": ({t.judge.stalled_after_seconds}, False),
        "Oldest open review item": ({t.judge.review_oldest_open_seconds}, False),
        f"recall@{p.recall_k} change with its paired interval, golden set $golden": (
            {-p.recall_drop_budget},
            True,
        ),
        "MRR change with its paired interval, golden set $golden": ({-p.mrr_drop_budget}, True),
        "Filter false exclusions": ({p.false_exclusion_ratio}, False),
    }


def test_threshold_lines_are_the_values_of_thresholds_yaml() -> None:
    expected = _expected_limits()
    seen = set()
    for board, panel in _panels():
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        steps = defaults.get("thresholds", {}).get("steps", [])
        values = {s["value"] for s in steps if s["value"] is not None}
        if panel["title"] not in expected:
            assert not values, f"{board}: {panel['title']} has thresholds no test expects"
            continue
        seen.add(panel["title"])
        want, floor = expected[panel["title"]]
        assert values == want, f"{board}: {panel['title']}"
        assert steps[0]["value"] is None and steps[0]["color"] == ("red" if floor else "green")
        assert defaults["thresholds"]["mode"] == "absolute"
        if panel["type"] == "timeseries":
            assert defaults["custom"]["thresholdsStyle"]["mode"] in _LINE_STYLES, panel["title"]
    assert seen == set(expected)


def test_threshold_lines_follow_an_edited_thresholds_file(tmp_path: Path) -> None:
    edited = yaml.safe_load((DASHBOARDS / "thresholds.yaml").read_text())
    edited["latency"]["ttft_p95_seconds"] = 3.25
    edited["faithfulness"]["upper_bound_min"] = 0.55
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(edited))
    only = ["--only", "grafana/ragmon-overview.json", "--only", "grafana/ragmon-quality.json"]
    assert build(["--thresholds", str(tmp_path / "t.yaml"), "--out", str(tmp_path), *only]) == 0

    def steps(board: str, title: str) -> list[Any]:
        data = json.loads((tmp_path / "grafana" / f"{board}.json").read_text())
        (panel,) = [p for p in data["panels"] if p["title"] == title]
        return [s["value"] for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]]

    assert steps("ragmon-overview", "Time to first token p50 / p95 / p99") == [None, 3.25]
    assert steps("ragmon-quality", "Faithfulness with 95% interval: $app") == [None, 0.55]


def test_dashboards_link_each_other_review_report_and_runbooks() -> None:
    t = load_thresholds()
    for name, board in _boards().items():
        assert TAG in board["tags"], name
        links = board["links"]
        by_tag = [link for link in links if link["type"] == "dashboards"]
        assert len(by_tag) == 1 and by_tag[0]["tags"] == [TAG], name
        assert by_tag[0]["includeVars"] and by_tag[0]["keepTime"], name
        urls = {link["url"] for link in links if link["type"] == "link"}
        assert urls == {"${ragmon_url}/review", "${ragmon_url}/reports/latest", "${runbook_base}"}, name
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["ragmon_url"]["type"] == "textbox", name
        assert variables["ragmon_url"]["query"] == DEFAULT_RAGMON_URL == "http://127.0.0.1:4318"
        assert variables["runbook_base"]["query"] == t.runbook_base, name
        # the lead's tenant variable and grouping stay
        assert variables["tenant"]["multi"] and variables["app"]["multi"], name


def test_panel_runbook_links_name_existing_runbooks_and_cover_every_alert() -> None:
    names = {a.name for a in alerts(load_thresholds())}
    linked = set()
    for board, panel in _panels():
        for link in panel.get("links", []):
            match = re.fullmatch(r"\$\{runbook_base\}/(\w+)\.md", link["url"])
            assert match, f"{board}: {panel['title']}: {link['url']}"
            assert match.group(1) in names, link["url"]
            assert (DASHBOARDS / "runbooks" / f"{match.group(1)}.md").is_file()
            linked.add(match.group(1))
    assert linked == names, sorted(names - linked)


def test_data_links_point_at_ragmon() -> None:
    count = 0
    for board, panel in _panels():
        for link in panel.get("fieldConfig", {}).get("defaults", {}).get("links", []):
            assert link["url"].startswith("${ragmon_url}/"), f"{board}: {panel['title']}"
            count += 1
    # verdicts, diagnoses, review flags, faithfulness by release, calibration, judge and reviewers, drift
    assert count == 7


def test_no_placeholder_urls_in_generated_files() -> None:
    generated = [
        *dashboard_files(),
        DASHBOARDS / "rules.yml",
        DASHBOARDS / "grafana-alerting" / "ragmon-alerts.yaml",
    ]
    for path in generated:
        text = path.read_text()
        for placeholder in ("github.com/ragmon", "example.com", "example.org", "TODO", "localhost:3000"):
            assert placeholder not in text, f"{path.name}: {placeholder}"


def test_panels_reading_recorded_series_say_rules_yml_is_needed() -> None:
    recorded = recorded_names()
    noted = 0
    for board, panel in _panels():
        uses = any(metric_names(t["expr"]) & recorded for t in panel["targets"])
        assert (RULES_NOTE in panel["description"]) == uses, f"{board}: {panel['title']}"
        noted += uses
    assert noted >= 10


def _build_with_base(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Path:
    out = tmp_path / "out"
    cmd = ["-m", "dashboards.build", "--out", str(out), *args]
    for rel in ("rules.yml", "grafana/ragmon-quality.json", "grafana-alerting/ragmon-alerts.yaml"):
        cmd += ["--only", rel]
    done = subprocess.run(
        [sys.executable, *cmd],
        cwd=DASHBOARDS.parent,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return out


BASE = "https://runbooks.ragmon.test/ops/ragmon/dashboards/runbooks"


@pytest.mark.parametrize("how", ["option", "environment"])
def test_runbook_base_is_set_at_build_time(tmp_path: Path, how: str) -> None:
    env = dict(os.environ)
    env.pop(RUNBOOK_BASE_ENV, None)
    if how == "option":
        out = _build_with_base(tmp_path, "--runbook-base-url", BASE + "/", env=env)
    else:
        out = _build_with_base(tmp_path, env={**env, RUNBOOK_BASE_ENV: BASE})
    rules = yaml.safe_load((out / "rules.yml").read_text())
    urls = {
        r["alert"]: r["annotations"]["runbook_url"]
        for g in rules["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    assert urls and all(url == f"{BASE}/{name}.md" for name, url in urls.items())
    grafana = yaml.safe_load((out / "grafana-alerting" / "ragmon-alerts.yaml").read_text())
    assert {r["annotations"]["runbook_url"] for g in grafana["groups"] for r in g["rules"]} == set(
        urls.values()
    )
    board = json.loads((out / "grafana" / "ragmon-quality.json").read_text())
    (variable,) = [v for v in board["templating"]["list"] if v["name"] == "runbook_base"]
    assert variable["query"] == BASE


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package `prometheus`)")
def test_promtool_unit_tests_agree_with_another_runbook_base(tmp_path: Path) -> None:
    """The shipped unit tests expect the default base; rewritten to another base they pass against rules
    built with it, so the base is the only thing the two share."""
    env = {k: v for k, v in os.environ.items() if k != RUNBOOK_BASE_ENV}
    out = _build_with_base(tmp_path, "--runbook-base-url", BASE, env=env)
    default = load_thresholds().runbook_base
    (out / "tests").mkdir()
    for path in sorted((DASHBOARDS / "tests").glob("*.yaml")):
        text = path.read_text()
        assert f"runbook_url: {default}/" in text, path.name
        (out / "tests" / path.name).write_text(
            text.replace(f"runbook_url: {default}/", f"runbook_url: {BASE}/")
        )
    files = sorted(str(p) for p in (out / "tests").glob("*.yaml"))
    done = subprocess.run([str(PROMTOOL), "test", "rules", *files], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    # and the unchanged unit tests fail against those rules: the check can fail
    (out / "tests" / "quality_drift.yaml").write_text(
        (DASHBOARDS / "tests" / "quality_drift.yaml").read_text()
    )
    done = subprocess.run(
        [str(PROMTOOL), "test", "rules", str(out / "tests" / "quality_drift.yaml")],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
