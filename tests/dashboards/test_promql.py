"""Tests of dashboards/promql.py: the metric names it reads from PromQL."""

from __future__ import annotations

import pytest

from dashboards.promql import metric_names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("rate(ragmon_traces_total[5m])", {"ragmon_traces_total"}),
        (
            "histogram_quantile(0.95, sum by (le, app)"
            ' (rate(x_bucket{app=~"$app",le!="1e-05"}[$__rate_interval])))',
            {"x_bucket"},
        ),
        (
            "(a:b:rate5m > 8) * on (app) group_left (release) c:d:count or on (app) e",
            {"a:b:rate5m", "c:d:count", "e"},
        ),
        ('absent(up{job="ragmon"}) unless time() - ts offset 5m > 1e3', {"up", "ts"}),
        ("topk by (app) (1, sum without (instance, or_label) (m))", {"m"}),
        ('count(m{name="and or rate(x)"}) > bool 2', {"m"}),
    ],
)
def test_reads_the_selected_names_only(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names
