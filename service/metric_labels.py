"""Label cardinality: a label whose distinct values are capped, and one tenant's caps.

Every per-app label value ragmon exports passes through a `BoundedLabel`: the first `limit`
values seen are their own series, the rest count as `other` (an empty value as `none`), so
no app, model, intent or release name can grow the number of series without bound. `Metrics`
keeps one `LabelBudget` per tenant label value, so one tenant's values cannot push another's
new value into `other`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from service.config import MetricsConfig

OTHER = "other"
NONE = "none"


class BoundedLabel:
    """A label whose distinct values are capped: the first `limit` values seen pass, the rest are `other`.

    With an explicit `allowed` set, only those pass. Thread-safe; never grows past the cap.
    """

    def __init__(self, limit: int, allowed: Iterable[str] = ()) -> None:
        if limit <= 0:
            raise ValueError("limit must be positive")
        self.limit = limit
        self.allowed = frozenset(allowed)
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str | None) -> str:
        if not value:
            return NONE
        if self.allowed:
            return value if value in self.allowed else OTHER
        if value in self._seen:
            return value
        with self._lock:
            if len(self._seen) < self.limit:
                self._seen.add(value)
                return value
        return OTHER


class LabelBudget:
    """One tenant's label values: its own capped sets of app, model, intent and release values (and
    golden-set names and categories), each overflowing into its own `other`, so no tenant's values
    can push another's out."""

    __slots__ = ("app", "golden", "intent", "model", "probe_category", "release")

    def __init__(self, config: MetricsConfig) -> None:
        self.app = BoundedLabel(config.max_apps)
        self.model = BoundedLabel(config.max_models)
        self.intent = BoundedLabel(config.max_intents, config.intents)
        self.release = BoundedLabel(config.max_releases)
        self.golden = BoundedLabel(config.max_golden_sets)
        self.probe_category = BoundedLabel(config.max_probe_categories)
