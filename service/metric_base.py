"""What every area of `Metrics` declares its series with: the registry, the label scopes, the buckets.

`MetricsBase` owns one process's `CollectorRegistry` and decides which label values a series
gets: the scope labels (`app`, or `tenant` and `app`), the tenant label's cap, and each
tenant's own `LabelBudget`. The area classes (service/metric_areas.py, metric_judge.py) and `Metrics`
(service/metrics.py) derive from it and declare their series on `registry` under
`scope_labels` / `tenant_scope_labels`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from prometheus_client import CollectorRegistry

from service.config import MetricsConfig
from service.metric_labels import BoundedLabel, LabelBudget
from service.metric_tally import StateCollector

# Latency buckets span fast retrieval (ms) to slow generation (tens of seconds).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)
# Cost per trace: a cached embedding call costs ~1e-6 USD, a long agent run dollars.
COST_BUCKETS = (1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
CHUNK_COUNT_BUCKETS = (0, 1, 2, 3, 5, 8, 10, 15, 20, 30, 50, 100)
# Similarity scores are mostly in [0, 1]; larger buckets catch BM25-style scores.
SCORE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0, 2.0, 5.0, 10.0, 25.0)


class MetricsBase:
    """The registry of one ragmon process and the label scopes of its series."""

    def __init__(self, config: MetricsConfig, *, tenants: Iterable[str] = ()) -> None:
        """`tenants`: the tenants the API keys name (`AuthConfig.tenants`); with the tenant label on,
        each is its own label value and any other tenant counts as `other` (without them, the first
        `max_tenants` seen are their own)."""
        self._label_config = config
        self.registry = CollectorRegistry(auto_describe=True)
        named = frozenset(tenants)
        self.tenant_label = BoundedLabel(config.max_tenants, named) if config.tenant_label else None
        self.scope_labels: tuple[str, ...] = ("tenant", "app") if config.tenant_label else ("app",)
        # `tenant` alone, on the per-tenant series that have no app (judge deferrals, probe gauges)
        self.tenant_scope_labels: tuple[str, ...] = ("tenant",) if config.tenant_label else ()
        # per tenant label value (one for all without the label): bounded by the tenant label's cap
        self._budgets: dict[str, LabelBudget] = {}
        self._budgets_lock = threading.Lock()
        # scrape-time gauges; `Metrics` registers it last, after every series it declares
        self.state = StateCollector()

    def _scoped(self, tenant: str | None, app: str | None) -> tuple[tuple[str, ...], LabelBudget]:
        """`scope(tenant, app)` and the label budget of the tenant's label value."""
        tenant_value = "" if self.tenant_label is None else self.tenant_label(tenant)
        budget = self._budgets.get(tenant_value)
        if budget is None:
            with self._budgets_lock:
                budget = self._budgets.setdefault(tenant_value, LabelBudget(self._label_config))
        app_value = budget.app(app)
        return ((app_value,) if self.tenant_label is None else (tenant_value, app_value)), budget

    def _named_tenants(self) -> list[str]:
        return sorted(self.tenant_label.allowed) if self.tenant_label is not None else []

    def tenant_scope(self, tenant: str | None) -> tuple[str, ...]:
        """The values of `tenant_scope_labels` for one tenant: its label value, or nothing."""
        return () if self.tenant_label is None else (self.tenant_label(tenant),)

    def probe_scope(self, tenant: str | None, golden: str) -> tuple[tuple[str, ...], LabelBudget]:
        """The values of `tenant_scope_labels` and `golden` for one tenant's golden set, and the
        tenant's label budget (for the set's categories)."""
        (*tenant_value, _), budget = self._scoped(tenant, None)
        return (*tenant_value, budget.golden(golden)), budget

    def label_budget(self, tenant: str | None) -> LabelBudget:
        """The tenant's own caps of app, model, intent and release values (one set for every tenant
        when the metrics carry no tenant label)."""
        return self._scoped(tenant, None)[1]

    def scope(self, tenant: str | None, app: str | None) -> tuple[str, ...]:
        """The bounded values of `scope_labels` for one tenant's app, in declaration order: the
        tenant's own label value and an app value from the tenant's own cap."""
        return self._scoped(tenant, app)[0]

    def scope_kw(self, tenant: str | None, app: str | None) -> dict[str, str]:
        """`scope` as keyword label values, for `metric.labels(**...)`."""
        return dict(zip(self.scope_labels, self.scope(tenant, app), strict=True))

    def model_label(self, tenant: str | None, model: str | None) -> str:
        return self.label_budget(tenant).model(model)

    def intent_label(self, tenant: str | None, intent: str | None) -> str:
        return self.label_budget(tenant).intent(intent)

    def release_label(self, tenant: str | None, release: str | None) -> str:
        return self.label_budget(tenant).release(release)
