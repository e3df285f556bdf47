"""The builder of ragmon's Grafana dashboards on the pinned grafana-foundation-sdk: `Board` and its panels.

A `Board` returns a provisioning-ready dashboard as plain JSON data: a
Prometheus data-source picker, a `tenant` and an `app` variable on top, rows of panels
whose ids are unique and whose grid positions are set. Queries read the
recorded series of `rules.yml` where one exists, so dashboards and alerts
compute the same numbers; such panels say so in their description, since they
stay empty unless Prometheus loads that file.

Styling that carries meaning:
* an interval or control band (`_lower`/`_upper` gauges) is a shaded area: the
  upper series fills down to the lower one (`custom.fillBelowTo`), both bound
  lines dashed and thin, the estimate solid. `fillBelowTo` names one series by
  its display name, so a band panel shows one app (it repeats per `app`) with
  fixed legends, and one value of any further label (a single-value variable);
* every number of `thresholds.yaml` that an alert compares a panel's series
  with is a dashed threshold line on that panel (stat panels: its colour step);
* every dashboard links to the others (by the `ragmon` tag), to ragmon's
  review page and latest report (`ragmon_url` variable) and to the runbooks
  (`runbook_base` variable, defaulting to the build's runbook base); panels
  an alert watches link to its runbook.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import GraphThresholdsStyleMode
from grafana_foundation_sdk.models.dashboard import (
    DashboardLinkType,
    DataSourceRef,
    DynamicConfigValue,
    Threshold,
    ThresholdsMode,
    VariableOption,
    VariableRefresh,
    VariableSort,
)

from dashboards.alerts import Recording, rule_groups
from dashboards.promql import metric_names
from dashboards.thresholds import Thresholds

__all__ = [
    "APPS",
    "DEFAULT_RAGMON_URL",
    "RULES_NOTE",
    "TAG",
    "Band",
    "Board",
    "Limit",
    "interval_panel",
    "single_value",
]

_DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
# label matchers of the apps (and tenants) that the dashboard's variables select;
# `tenant` is empty (and matched by the "All" value) unless metrics.tenant_label is on
APPS = 'tenant=~"$tenant",app=~"$app"'
_Query = tuple[str, str]  # (PromQL, legend)
TAG = "ragmon"
DEFAULT_RAGMON_URL = "http://127.0.0.1:4318"
RULES_NOTE = "Reads recorded series of dashboards/rules.yml: empty unless Prometheus loads that file."
_BAND_FILL_OPACITY = 20
_DASH = [6.0, 4.0]


@dataclass(frozen=True)
class Band:
    """An interval drawn as a shaded area: `upper` fills down to `lower` (legend names of its series)."""

    lower: str
    upper: str
    estimate: str | None = None


@dataclass(frozen=True)
class Limit:
    """Threshold lines from thresholds.yaml; `floor`: values under the line are the bad side."""

    values: tuple[float, ...]
    floor: bool = False


def _recorded() -> frozenset[str]:
    # the recording names do not depend on the numbers in thresholds.yaml
    from dashboards.thresholds import load_thresholds

    return frozenset(
        r.record for g in rule_groups(load_thresholds()) for r in g.rules if isinstance(r, Recording)
    )


def _band_overrides(panel: Any, band: Band) -> Any:
    bound_line = [
        DynamicConfigValue("custom.lineWidth", 1),
        DynamicConfigValue("custom.lineStyle", {"fill": "dash", "dash": _DASH}),
    ]
    panel = panel.override_by_name(
        band.upper,
        [
            DynamicConfigValue("custom.fillBelowTo", band.lower),
            DynamicConfigValue("custom.fillOpacity", _BAND_FILL_OPACITY),
            *bound_line,
        ],
    )
    panel = panel.override_by_name(band.lower, [DynamicConfigValue("custom.fillOpacity", 0), *bound_line])
    if band.estimate is not None:
        panel = panel.override_by_name(band.estimate, [DynamicConfigValue("custom.lineWidth", 2)])
    return panel


def _steps(limit: Limit) -> Any:
    good, bad = "green", "red"
    steps = [Threshold(value=None, color=bad if limit.floor else good)]
    steps += [Threshold(value=v, color=good if limit.floor else bad) for v in sorted(set(limit.values))]
    return db.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(steps)


def _link(title: str, url: str, tooltip: str) -> db.DashboardLink:
    return (
        db.DashboardLink(title)
        .type(DashboardLinkType.LINK)
        .url(url)
        .tooltip(tooltip)
        .target_blank(True)
        .include_vars(False)
        .keep_time(False)
    )


class Board:
    """Collects panels, numbering them and sizing them half or full width."""

    def __init__(self, t: Thresholds, title: str, uid: str, description: str) -> None:
        self.next_id = 1
        self.recorded = _recorded()
        self.board = (
            db.Dashboard(title)
            .uid(uid)
            .description(description)
            .tags([TAG])
            .refresh("30s")
            .time("now-6h", "now")
            .timezone("browser")
            .editable()
            .with_variable(db.DatasourceVariable("datasource").label("Data source").type("prometheus"))
            .with_variable(
                db.QueryVariable("tenant")
                .label("Tenant")
                .description("set when ragmon runs with metrics.tenant_label; empty otherwise")
                .datasource(_DS)
                .query("label_values(ragmon_traces_total, tenant)")
                .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
                .multi(True)
                .include_all(True)
                .all_value(".*")
                .sort(VariableSort.ALPHABETICAL_ASC)
            )
            .with_variable(
                db.QueryVariable("app")
                .label("App")
                .datasource(_DS)
                .query("label_values(ragmon_traces_total, app)")
                .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
                .multi(True)
                .include_all(True)
                .all_value(".*")
                .sort(VariableSort.ALPHABETICAL_ASC)
            )
            .with_variable(
                db.TextBoxVariable("ragmon_url")
                .label("ragmon URL")
                .description("where ragmon serves /review and /reports/latest, as the browser reaches it")
                .default_value(DEFAULT_RAGMON_URL)
                .current(_option(DEFAULT_RAGMON_URL))
            )
            .with_variable(
                db.TextBoxVariable("runbook_base")
                .label("Runbooks")
                .description("prefix of runbooks/<AlertName>.md (runbook_base_url of the build)")
                .default_value(t.runbook_base)
                .current(_option(t.runbook_base))
            )
            .links(
                [
                    db.DashboardLink("ragmon dashboards")
                    .type(DashboardLinkType.DASHBOARDS)
                    .tags([TAG])
                    .as_dropdown(False)
                    .include_vars(True)
                    .keep_time(True)
                    .target_blank(False)
                    .tooltip("the other ragmon dashboards, same apps and time range"),
                    _link("Review queue", "${ragmon_url}/review", "answers flagged for a human, on ragmon"),
                    _link("Latest report", "${ragmon_url}/reports/latest", "ragmon's newest weekly report"),
                    _link("Runbooks", "${runbook_base}", "one runbook per alert"),
                ]
            )
        )

    def row(self, title: str) -> Board:
        self.board.with_row(db.Row(title).id(self._id()))
        return self

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def _common(
        self,
        panel: Any,
        description: str,
        queries: list[_Query],
        *,
        instant: bool,
        runbooks: Sequence[str],
        data_links: Sequence[tuple[str, str]],
    ) -> Any:
        if any(metric_names(expr) & self.recorded for expr, _ in queries):
            description = f"{description} ({RULES_NOTE})" if description else RULES_NOTE
        panel = panel.description(description)
        for n, (expr, legend) in enumerate(queries):
            query = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + n))
            panel = panel.with_target(query.instant() if instant else query)
        if runbooks:
            panel = panel.links(
                [
                    _link(f"Runbook: {name}", f"${{runbook_base}}/{name}.md", f"what to do when {name} fires")
                    for name in runbooks
                ]
            )
        if data_links:
            panel = panel.data_links(
                [db.DashboardLink(title).url(url).target_blank(True) for title, url in data_links]
            )
        return panel

    def series(
        self,
        title: str,
        description: str,
        unit: str,
        queries: list[_Query],
        *,
        width: int = 12,
        bands: Sequence[Band] = (),
        limit: Limit | None = None,
        repeat: str | None = None,
        runbooks: Sequence[str] = (),
        data_links: Sequence[tuple[str, str]] = (),
        counts: str | None = None,
    ) -> Board:
        """A time series panel; `counts`: a regular expression of the legends that are counts (n, no
        claims), drawn on a right axis in plain numbers beside the estimates they qualify."""
        panel = (
            timeseries.Panel().id(self._id()).title(title).datasource(_DS).unit(unit).span(width).height(8)
        )
        panel = self._common(
            panel, description, queries, instant=False, runbooks=runbooks, data_links=data_links
        )
        for band in bands:
            panel = _band_overrides(panel, band)
        if counts is not None:
            panel = panel.override_by_regexp(
                counts,
                [
                    DynamicConfigValue("custom.axisPlacement", "right"),
                    DynamicConfigValue("unit", "short"),
                    DynamicConfigValue("custom.lineStyle", {"fill": "dot", "dash": [2.0, 4.0]}),
                ],
            )
        if limit is not None:
            panel = panel.thresholds(_steps(limit)).thresholds_style(
                common_builders.GraphThresholdsStyleConfig().mode(GraphThresholdsStyleMode.DASHED)
            )
        if repeat is not None:
            panel = panel.repeat(repeat).repeat_direction("h").max_per_row(24 // width)
        self.board.with_panel(panel)
        return self

    def single(
        self,
        title: str,
        description: str,
        unit: str,
        queries: list[_Query],
        *,
        width: int = 6,
        limit: Limit | None = None,
        runbooks: Sequence[str] = (),
        data_links: Sequence[tuple[str, str]] = (),
    ) -> Board:
        panel = stat.Panel().id(self._id()).title(title).datasource(_DS).unit(unit).span(width).height(5)
        panel = self._common(
            panel, description, queries, instant=True, runbooks=runbooks, data_links=data_links
        )
        if limit is not None:
            panel = panel.thresholds(_steps(limit))
        self.board.with_panel(panel)
        return self

    def variable(self, variable: Any) -> Board:
        self.board.with_variable(variable)
        return self

    def json(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(json.dumps(self.board.build(), cls=JSONEncoder))
        return data


def single_value(name: str, label: str, query: str, description: str, default: str | None = None) -> Any:
    """A one-value query variable, for the label a band panel must hold fixed."""
    variable = (
        db.QueryVariable(name)
        .label(label)
        .description(description)
        .datasource(_DS)
        .query(query)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(False)
        .include_all(False)
        .sort(VariableSort.ALPHABETICAL_ASC)
    )
    if default is not None:
        variable = variable.current(_option(default))
    return variable


def _option(value: str) -> VariableOption:
    return VariableOption(selected=True, text=value, value=value)


def interval_panel(
    b: Board,
    what: str,
    description: str,
    unit: str,
    metric: str,
    selector: str,
    by: str,
    *,
    limit: Limit | None = None,
    runbooks: Sequence[str] = (),
    width: int = 12,
    lower: str | None = None,
    upper: str | None = None,
) -> None:
    """One app's estimate with its interval (`lower`/`upper`: metric names, default `<metric>_lower`/`_upper`)
    as a shaded band; the panel repeats per selected app."""
    b.series(
        f"{what}: $app",
        description + "; one panel per app (with metrics.tenant_label, select one tenant), the shaded"
        " area is the interval",
        unit,
        [
            (f"max by ({by}) ({metric}{selector})", "estimate"),
            (f"max by ({by}) ({lower or metric + '_lower'}{selector})", "lower"),
            (f"max by ({by}) ({upper or metric + '_upper'}{selector})", "upper"),
        ],
        bands=[Band("lower", "upper", "estimate")],
        limit=limit,
        repeat="app",
        runbooks=runbooks,
        width=width,
    )
