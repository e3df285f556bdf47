"""Tests of the Grafana dashboards and alert provisioning: SDK round trip, ids, grid, PromQL, same alerts."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.alerting import Rule
from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.alerts import alerts
from dashboards.thresholds import load_thresholds
from tests.dashboards.queries import DASHBOARDS, dashboard_files, expressions, rule_file

PROMTOOL = shutil.which("promtool")


def _round_trip_loss(original: Any, back: Any, path: str = "") -> list[str]:
    """Keys of `original` that the typed model dropped or changed (a typo such as `titel` shows up here)."""
    if isinstance(original, dict):
        if not isinstance(back, dict):
            return [path or "."]
        lost = []
        for key, value in original.items():
            if key not in back:
                lost.append(f"{path}.{key}")
            else:
                lost += _round_trip_loss(value, back[key], f"{path}.{key}")
        return lost
    if isinstance(original, list):
        if not isinstance(back, list) or len(back) != len(original):
            return [path]
        return [
            m
            for i, (a, b) in enumerate(zip(original, back, strict=True))
            for m in _round_trip_loss(a, b, f"{path}[{i}]")
        ]
    return [] if original == back else [path]


def _encode(model: Any) -> Any:
    return json.loads(json.dumps(model, cls=JSONEncoder))


@pytest.fixture(params=[p.name for p in dashboard_files()])
def board(request: pytest.FixtureRequest) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DASHBOARDS / "grafana" / request.param).read_text())
    return data


def test_three_dashboards_exist() -> None:
    assert {p.stem for p in dashboard_files()} == {"ragmon-overview", "ragmon-quality", "ragmon-drift"}


def test_dashboard_round_trips_through_the_sdk_models(board: dict[str, Any]) -> None:
    back = _encode(Dashboard.from_json(board))
    assert _round_trip_loss(board, back) == []


def test_round_trip_check_catches_a_typo(board: dict[str, Any]) -> None:
    broken = json.loads(json.dumps(board))
    broken["panels"][1]["titel"] = broken["panels"][1].pop("title")
    assert _round_trip_loss(broken, _encode(Dashboard.from_json(broken))) != []


def test_panels_have_unique_ids_grid_positions_and_queries(board: dict[str, Any]) -> None:
    panels = board["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        grid = panel.get("gridPos")
        assert grid and {"x", "y", "w", "h"} <= set(grid), panel["title"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
            assert panel["datasource"]["uid"] == "${datasource}"
    assert board["uid"].startswith("ragmon-") and board["title"].startswith("ragmon / ")


def test_panels_do_not_overlap(board: dict[str, Any]) -> None:
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        g = panel["gridPos"]
        area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & area, panel["title"]
        cells |= area


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package `prometheus`)")
def test_every_query_parses(tmp_path: Path) -> None:
    queries = expressions()
    rules = [{"record": f"check:q{n}:parse", "expr": expr} for n, expr in enumerate(queries.values())]
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "queries", "rules": rules}]}))
    out = subprocess.run([str(PROMTOOL), "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert len(queries) > 80


def _grafana_rules() -> list[dict[str, Any]]:
    data = yaml.safe_load((DASHBOARDS / "grafana-alerting" / "ragmon-alerts.yaml").read_text())
    assert data["apiVersion"] == 1
    return [r for g in data["groups"] for r in g["rules"]]


def test_grafana_rules_round_trip_through_the_sdk_models() -> None:
    for rule in _grafana_rules():
        back = _encode(Rule.from_json(rule))
        assert _round_trip_loss(rule, back) == [], rule["title"]


def test_grafana_rules_are_the_prometheus_alerts() -> None:
    prometheus = {r["alert"]: r for g in rule_file()["groups"] for r in g["rules"] if "alert" in r}
    grafana = {r["title"]: r for r in _grafana_rules()}
    notes = {a.name: a.query_note for a in alerts(load_thresholds())}
    assert grafana.keys() == prometheus.keys()
    for name, rule in grafana.items():
        source = prometheus[name]
        query = next(q for q in rule["data"] if q["refId"] == "A")
        assert query["model"]["expr"] == source["expr"]
        assert rule["for"] == source["for"] and rule["labels"] == source["labels"]
        assert rule["annotations"]["summary"] == source["annotations"]["summary"]
        assert rule["annotations"]["runbook_url"] == source["annotations"]["runbook_url"]
        # Grafana's templates have no `query`: the Prometheus-only note is left out there.
        description = source["annotations"]["description"]
        assert description.endswith(notes[name])
        assert rule["annotations"]["description"] == description.removesuffix(notes[name]).replace(
            "$value", "$values.A.Value"
        )
        assert "| query" not in rule["annotations"]["description"]
        assert rule["condition"] == "B" and rule["noDataState"] == "OK"
        assert len(rule["uid"]) <= 40
    assert len({r["uid"] for r in grafana.values()}) == len(grafana)
