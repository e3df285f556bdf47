"""The alerts of `alerts.py` as Grafana-managed alert rules (provisioning files), for Grafana alerting.

Each Prometheus alert becomes one Grafana rule with the same name, PromQL,
`for`, severity and annotations: query A runs the alert's expression as an
instant query, and condition B (`is_number($A) || is_nan($A) || is_inf($A)`)
is true for every series A returns, which is how a Prometheus alert fires.
No data means OK, as in Prometheus. Rules are built with the pinned
grafana-foundation-sdk models and written in Grafana's provisioning layout
(`apiVersion: 1`, `groups:`). They read the recorded series of `rules.yml`,
so Prometheus must load that file too.
"""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders import alerting, expr, prometheus
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from dashboards.alerts import Alert, rule_groups
from dashboards.thresholds import Thresholds

__all__ = ["FIRING_CONDITION", "grafana_alert_rules", "grafana_template"]

FIRING_CONDITION = "is_number($A) || is_nan($A) || is_inf($A)"
# Keys the provisioning file sets once per group instead of per rule.
_GROUP_KEYS = ("folderUID", "ruleGroup", "orgID")


def grafana_template(text: str) -> str:
    """A Prometheus annotation template in Grafana's dialect ($value is query A's value there)."""
    return text.replace("$value", "$values.A.Value")


def _rule(alert: Alert, t: Thresholds, for_: str) -> dict[str, Any]:
    if len(alert.name) > 40:
        raise ValueError(f"alert name {alert.name!r} is too long for a Grafana uid")
    query = (
        alerting.Query("A")
        .datasource_uid(t.grafana.datasource_uid)
        .relative_time_range(alerting_time_range())
        .model(prometheus.Dataquery().expr(alert.expr).instant().ref_id("A"))
    )
    condition = (
        alerting.Query("B").datasource_uid("__expr__").model(expr.TypeMath().expression(FIRING_CONDITION))
    )
    rule = (
        alerting.Rule(alert.name)
        .uid(alert.name.lower())
        .condition("B")
        .with_query(query)
        .with_query(condition)
        .no_data_state("OK")
        .exec_err_state("Error")
        .for_val(for_)
        .labels({"severity": alert.severity})
        .annotations(
            {
                "summary": alert.summary,
                "description": grafana_template(alert.description),
                "runbook_url": t.runbook(alert.name),
            }
        )
        .is_paused(False)
    )
    data: dict[str, Any] = json.loads(json.dumps(rule.build(), cls=JSONEncoder))
    for key in _GROUP_KEYS:
        data.pop(key, None)
    # the math expression's model needs its refId, as the Grafana UI writes it
    data["data"][1]["model"]["refId"] = "B"
    return data


def alerting_time_range() -> Any:
    """Ten minutes back: enough for the instant queries, which carry their own range selectors."""
    from grafana_foundation_sdk.models.alerting import RelativeTimeRange

    return RelativeTimeRange(from_val=600, to=0)


def grafana_alert_rules(
    t: Thresholds, *, for_override: str | None = None, interval: str | None = None
) -> dict[str, Any]:
    """The provisioning file as data: one Grafana rule group per Prometheus alert group."""
    groups = []
    for group in rule_groups(t):
        rules = [_rule(r, t, for_override or r.for_ or t.for_) for r in group.rules if isinstance(r, Alert)]
        if rules:
            groups.append(
                {
                    "orgId": 1,
                    "name": group.name,
                    "folder": t.grafana.folder_uid,
                    "interval": interval or "1m",
                    "rules": rules,
                }
            )
    return {"apiVersion": 1, "groups": groups}
