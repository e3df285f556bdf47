"""`/docs` renders in a real browser with no internet: Swagger UI comes from ragmon itself, not a CDN."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.live_server import LiveServer, live_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("docs-ui")) as running:
        yield running


def test_the_docs_page_loads_only_from_ragmon(server: LiveServer) -> None:
    page = httpx.get(f"{server.url}/docs", timeout=10).text
    assert "/docs/assets/swagger-ui-bundle.js" in page and "cdn" not in page.lower()
    asset = httpx.get(f"{server.url}/docs/assets/swagger-ui-bundle.js", timeout=10)
    assert asset.status_code == 200 and len(asset.content) > 100_000
    assert httpx.get(f"{server.url}/docs/assets/index.html", timeout=10).status_code == 404  # allow-list


def test_the_docs_page_renders_offline(page: Page, server: LiveServer) -> None:
    outside: list[str] = []
    page.on("request", lambda r: None if r.url.startswith(server.url) else outside.append(r.url))
    page.goto(f"{server.url}/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("ragmon")
    expect(page.locator(".opblock-summary-path").first).to_be_visible()
    assert outside == []
