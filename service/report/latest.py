"""Where the latest report is kept: `ragmon report` writes it, `GET /reports/latest` serves it.

Reports are kept per tenant, and per app when the report was for one app:
`<data-dir>/reports/tenants/t-<tenant>/latest.html` (and `.../apps/a-<app>/`).
Names are percent-quoted and prefixed, so no tenant or app name (`..`, `a/b`)
can reach outside its own folder. A caller reads only its own tenant's reports.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from service.config import RagmonConfig

__all__ = ["LATEST_HTML", "LATEST_MD", "latest_dir", "reports_dir"]

LATEST_HTML = "latest.html"
LATEST_MD = "latest.md"


def reports_dir(config: RagmonConfig) -> Path:
    """Where reports are kept: `<data-dir>/reports`."""
    return config.data_dir / "reports"


def latest_dir(config: RagmonConfig, tenant: str, app: str | None = None) -> Path:
    """The folder of one tenant's latest report, or of its latest report for one app."""
    folder = reports_dir(config) / "tenants" / ("t-" + quote(tenant, safe=""))
    return folder / "apps" / ("a-" + quote(app, safe="")) if app else folder
