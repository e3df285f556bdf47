"""The first run of a new user: a fresh clone, `ragmon demo`, and everything its list points at.

This tests the COMMITTED tree: the repository is cloned (`git clone` of this checkout, at its HEAD),
so uncommitted changes are not in it. The clone runs with this interpreter, whose packages are the
runtime's; the demo's code is the clone's own (checked first).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.live_server import free_port
from tests.test_project import look_list
from tests.ui.pages import wait_for_path

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::pytest.PytestRemovedIn10Warning")]

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 240  # `ragmon demo --exit` takes about a minute on a loaded 2-core machine


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout of ragmon to clone")
    target = tmp_path_factory.mktemp("first-run") / "ragmon"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(target)], check=True, timeout=120)
    where = subprocess.run(
        [sys.executable, "-c", "import service; print(service.__file__)"],
        cwd=target,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(target), f"the clone runs {where}, not its own code"
    return target


def demo_command(clone: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "service.cli",
        "demo",
        "--port",
        str(free_port()),
        "--grpc-port",
        "0",
        "--data-dir",
        str(clone / "ragmon-data"),
        *extra,
    ]


def test_a_fresh_clone_demo_shows_every_item_of_its_list(clone: Path) -> None:
    result = subprocess.run(
        demo_command(clone, "--exit"), cwd=clone, capture_output=True, text=True, timeout=DEADLINE_S
    )
    assert result.returncode == 0, result.stdout + result.stderr
    look = look_list(result.stdout)
    assert int(look["review items open"].split()[0]) > 0
    assert re.match(r"\S+: \w+, p = ", look["drift alarm"]), look["drift alarm"]
    assert "top group of" in result.stdout
    assert re.match(r"\S+/\S+: rate [\d.]+ (in band|OUT OF BAND) \[", look["regeneration band"])
    report = Path(look["weekly report"].split()[0])
    assert report.is_file() and report.is_relative_to(clone) and "<svg" in report.read_text()
    judged = look["judged traces"]
    assert int(judged.split(",")[0]) > 0 and "faithful share 0." in judged
    assert look["traces stored"].split()[0] == "300"


@pytest.fixture(scope="module")
def running_demo(clone: Path) -> Iterator[tuple[str, str]]:
    """A demo left running in the clone: (its URL, the demo reviewer's token), read from its output."""
    command = demo_command(clone, "--seed", "2")
    url = f"http://127.0.0.1:{command[command.index('--port') + 1]}"
    demo = subprocess.Popen(
        command,
        cwd=clone,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert demo.stdout is not None
    watchdog = threading.Timer(DEADLINE_S, demo.kill)  # a demo that hangs must not hang the suite
    watchdog.start()
    token, seen = None, []
    try:
        for line in demo.stdout:
            seen.append(line)
            if line.startswith("  demo reviewer token "):
                token = line.split()[-1]
            if "keeps running" in line:
                break
        assert token is not None and demo.poll() is None, "".join(seen)
        yield url, token
        demo.send_signal(signal.SIGTERM)
        rest, _ = demo.communicate(timeout=60)
        assert demo.returncode == 0, rest
    finally:
        watchdog.cancel()
        if demo.poll() is None:
            demo.kill()
            demo.communicate(timeout=30)


def test_the_printed_token_signs_in_and_the_review_queue_has_items(
    page: Page, running_demo: tuple[str, str]
) -> None:
    url, token = running_demo
    page.goto(url + "/review/login")
    page.fill("#token", token)
    page.keyboard.press("Enter")
    wait_for_path(page, url, "/review")
    expect(page.locator("#who")).to_contain_text("demo")
    expect(page.locator("#items tbody tr").first).to_be_visible()
    page.keyboard.press("Enter")  # opens the selected (first) item
    page.wait_for_url(lambda at: "/review/items/" in at)
    expect(page.locator("#answer")).not_to_be_empty()


def test_the_demo_docs_page_renders_offline(page: Page, running_demo: tuple[str, str]) -> None:
    url, _ = running_demo
    outside: list[str] = []
    page.on("request", lambda r: None if r.url.startswith(url) else outside.append(r.url))
    page.goto(f"{url}/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("ragmon")
    expect(page.locator(".opblock-summary-path").first).to_be_visible()
    assert outside == []
