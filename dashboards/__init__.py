"""ragmon's alerting and dashboards as code: rules, dashboards and provisioning, built from one source.

`thresholds.yaml` holds every number; `alerts.py` defines each recording rule
and alert once; `python -m dashboards.build` writes `rules.yml`,
`grafana/*.json`, `grafana-alerting/*.yaml` and `METRICS.md` from them.
"""

from dashboards.alerts import Alert, Recording, RuleGroup, rule_groups
from dashboards.thresholds import Thresholds, load_thresholds

__all__ = ["Alert", "Recording", "RuleGroup", "Thresholds", "load_thresholds", "rule_groups"]
