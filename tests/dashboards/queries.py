"""Every PromQL expression ragmon ships: rules, dashboard targets and variables, Grafana alert queries."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
# Grafana's variables, replaced by values PromQL accepts
_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "${datasource}": "prom"}


def rule_file() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DASHBOARDS / "rules.yml").read_text())
    return data


def recorded_names() -> set[str]:
    return {r["record"] for g in rule_file()["groups"] for r in g["rules"] if "record" in r}


def dashboard_files() -> list[Path]:
    return sorted((DASHBOARDS / "grafana").glob("*.json"))


def _grafana(expr: str) -> str:
    for name, value in _VARIABLES.items():
        expr = expr.replace(name, value)
    return re.sub(r"\$\w+", "x", expr)


def expressions() -> dict[str, str]:
    """Where -> PromQL, Grafana variables substituted."""
    found: dict[str, str] = {}
    for group in rule_file()["groups"]:
        for rule in group["rules"]:
            found[f"rules.yml {rule.get('record') or rule.get('alert')} ({group['name']})"] = rule["expr"]
    for path in dashboard_files():
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                found[f"{path.name} panel {panel['id']} {target['refId']}"] = _grafana(target["expr"])
        for variable in board["templating"]["list"]:
            query = variable.get("query")
            if variable["type"] == "query":
                text = query if isinstance(query, str) else query["query"]
                inner = re.fullmatch(r"label_values\((.*),\s*\w+\)", text)
                found[f"{path.name} variable {variable['name']}"] = inner.group(1) if inner else text
    for path in sorted((DASHBOARDS / "grafana-alerting").glob("*.yaml")):
        provisioning = yaml.safe_load(path.read_text())
        for group in provisioning["groups"]:
            for rule in group["rules"]:
                for query in rule["data"]:
                    if "expr" in query["model"]:
                        found[f"{path.name} {rule['title']} {query['refId']}"] = query["model"]["expr"]
    return found
