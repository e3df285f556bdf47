"""What the page tests share beyond fixtures: waiting for a page whatever the query its script adds."""

from __future__ import annotations

from playwright.sync_api import Page


def wait_for_path(page: Page, url: str, path: str) -> None:
    """Wait until the page is at `url` + `path`, with any query string.

    The review list rewrites its own URL to carry its filters (`history.replaceState` to
    `/review?state=open...`) as soon as its script runs. That can happen before Playwright first
    reads the URL after the navigation, so a wait for the exact `/review` could miss its only
    chance and time out; the path is what the navigation decides, the query is the page's."""
    page.wait_for_url(lambda at: at.split("?", 1)[0].split("#", 1)[0] == url + path)
