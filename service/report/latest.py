"""Where the latest report is kept: `ragmon report` writes it, `GET /reports/latest` serves it."""

from __future__ import annotations

from pathlib import Path

from service.config import RagmonConfig

__all__ = ["LATEST_HTML", "LATEST_MD", "reports_dir"]

LATEST_HTML = "latest.html"
LATEST_MD = "latest.md"


def reports_dir(config: RagmonConfig) -> Path:
    """Where the latest report is kept: `<data-dir>/reports`."""
    return config.data_dir / "reports"
