"""The Grafana dashboards (overview, quality, drift), built as code with the pinned grafana-foundation-sdk.

`DASHBOARDS` maps each dashboard's name (`grafana/<name>.json`) to its builder. The panels,
bands, threshold lines, variables and links are built by `grafana_board.py`; each dashboard is a
module of its own (`grafana_overview.py`, `grafana_quality.py`, `grafana_drift.py`). The names
other code imports from here stay importable from here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dashboards.grafana_board import DEFAULT_RAGMON_URL, RULES_NOTE, TAG, Band, Limit
from dashboards.grafana_drift import drift
from dashboards.grafana_overview import overview
from dashboards.grafana_quality import quality
from dashboards.thresholds import Thresholds

__all__ = [
    "DASHBOARDS",
    "DEFAULT_RAGMON_URL",
    "RULES_NOTE",
    "TAG",
    "Band",
    "Limit",
    "drift",
    "overview",
    "quality",
]


DASHBOARDS: dict[str, Callable[[Thresholds], dict[str, Any]]] = {
    "ragmon-overview": overview,
    "ragmon-quality": quality,
    "ragmon-drift": drift,
}
