"""Headless Chromium for the page tests: the system browser (never a downloaded one), skipped when absent."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def chromium_path() -> str | None:
    for candidate in ("/usr/lib/chromium/chromium", shutil.which("chromium"), "/usr/bin/chromium"):
        if candidate and Path(candidate).exists():
            return candidate
    return None


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    executable = chromium_path()
    if executable is None:
        pytest.skip("Chromium is not installed (apt-get install chromium); the page tests need it")
    return {**browser_type_launch_args, "executable_path": executable, "args": CHROMIUM_ARGS}


@pytest.fixture(scope="session")
def base_url() -> str | None:
    """No base URL (tests go to the live server's own): this replaces pytest-playwright's fallback
    fixture, an instance method that pytest 9 warns about (and the warnings filter makes an error)."""
    return None
