"""Take the README's screenshots from a running `ragmon demo` in headless Chromium.

python scripts/screenshots.py [--out docs/images]

It starts `ragmon demo` on a free port with a reviewer configured through RAGMON_REVIEW__REVIEWERS,
waits until the judge has judged the sampled traces and the review queue has items, writes a weekly
report with `ragmon report`, then captures four pages at 1200 px wide: the review queue (signed in
as that reviewer), one review item, the weekly report and the API docs (`/docs`). The PNGs are
shrunk with pngquant when it is installed (`apt-get install pngquant`): a few hundred KB in all.

Needs the test extras (playwright) and the system Chromium (`apt-get install chromium`); the
browser is the one the page tests use (tests/ui/conftest.py), never a downloaded one. There is no
Grafana server to be had from the package registries here, so the charts shown are the report's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from playwright.sync_api import Page, sync_playwright

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.live_server import free_port  # noqa: E402
from tests.ui.conftest import CHROMIUM_ARGS, chromium_path  # noqa: E402

REVIEWER = "screenshots"  # not "demo": `ragmon demo` adds its own reviewer of that name
# A clear-text token is accepted for local trials (review.reviewers.<name>.token); a real install
# stores only its sha256.
REVIEWER_TOKEN = "screenshots-reviewer-token"
WIDTH = 1200
HEIGHT = 760
REPORT_CLIP = {"x": 0, "y": 0, "width": WIDTH, "height": 1150}
DEADLINE_S = 240.0


def _metric_sum(metrics: str, name: str, **labels: str) -> float:
    """Sum of every sample of `name` whose labels include `labels` (Prometheus text format)."""
    total = 0.0
    for match in re.finditer(rf"^{name}(\{{[^}}]*\}})? (\S+)$", metrics, re.MULTILINE):
        label_text = match.group(1) or ""
        if all(f'{key}="{value}"' in label_text for key, value in labels.items()):
            total += float(match.group(2))
    return total


@contextmanager
def running_demo(data_dir: Path, port: int) -> Iterator[str]:
    """`ragmon demo` on `port` with the screenshot reviewer, stopped (Ctrl-C) on leaving; its log goes
    to <data_dir>/../demo.log (a pipe nobody reads would fill up and stall it)."""
    reviewers = {REVIEWER: {"token": REVIEWER_TOKEN, "tenants": ["default"]}}
    env = {**os.environ, "RAGMON_REVIEW__REVIEWERS": json.dumps(reviewers)}
    command = [sys.executable, "-m", "service.cli", "demo", "--port", str(port), "--grpc-port", "0"]
    command += ["--data-dir", str(data_dir), "--seed", "0", "--fixed-ids"]  # the same traffic every run
    log = (data_dir.parent / "demo.log").open("wb")
    demo = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        demo.send_signal(signal.SIGINT)
        try:
            demo.wait(timeout=60)
        except subprocess.TimeoutExpired:
            demo.kill()
            demo.wait(timeout=30)
        log.close()


def wait_for_judged_traces(url: str, deadline_s: float = DEADLINE_S) -> None:
    """Until the demo's traffic is stored, the judge queue is empty and review items are open."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            metrics = httpx.get(f"{url}/metrics", timeout=5).text
        except httpx.HTTPError:
            metrics = ""
        traces = _metric_sum(metrics, "ragmon_traces_total")
        verdicts = _metric_sum(metrics, "ragmon_judge_verdicts_total")
        waiting = _metric_sum(metrics, "ragmon_judge_queue_depth")
        open_items = _metric_sum(metrics, "ragmon_review_items", state="open")
        if traces >= 300 and verdicts > 0 and waiting == 0 and open_items > 0:
            print(f"{traces:.0f} traces, {verdicts:.0f} judged, {open_items:.0f} review items open")
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"the demo did not get there in {deadline_s:.0f} s: {traces=} {verdicts=}")
        time.sleep(1.0)


def write_report(data_dir: Path) -> None:
    """`ragmon report` into the tenant's reports folder, which `/reports/latest` serves."""
    command = [sys.executable, "-m", "service.cli", "report", "--since", "7d", "--data-dir", str(data_dir)]
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def sign_in(page: Page, url: str) -> None:
    page.goto(f"{url}/review/login")
    page.fill("#token", REVIEWER_TOKEN)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{url}/review")
    page.locator("#items tbody tr").first.wait_for()


def capture(url: str, out: Path) -> list[Path]:
    """The four pages, in the README's order."""
    executable = chromium_path()
    if executable is None:
        raise SystemExit("Chromium is not installed (apt-get install chromium)")
    shots: list[Path] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT}, device_scale_factor=1)
        sign_in(page, url)
        shots.append(out / "review-queue.png")
        page.screenshot(path=shots[-1])
        page.keyboard.press("Enter")  # opens the selected (first) item
        page.wait_for_url("**/review/items/**")
        page.locator("#chunks").wait_for()
        shots.append(out / "review-item.png")
        page.screenshot(path=shots[-1])
        page.goto(f"{url}/reports/latest")
        shots.append(out / "report.png")
        # the first app's section: its summary and charts (the whole report is several screens tall)
        page.screenshot(path=shots[-1], full_page=True, clip=REPORT_CLIP)
        page.goto(f"{url}/docs")
        page.locator(".opblock-summary-path").first.wait_for()
        shots.append(out / "api-docs.png")
        page.screenshot(path=shots[-1])
        browser.close()
    return shots


def shrink(paths: list[Path]) -> None:
    """A 256-colour palette (pngquant) takes a text-heavy page to about a third of its size."""
    if shutil.which("pngquant") is None:
        print("pngquant not found: the PNGs are left as Chromium wrote them")
        return
    for path in paths:
        quality = ["--force", "--skip-if-larger", "--quality", "65-95"]
        subprocess.run(["pngquant", *quality, "--output", str(path), str(path)], check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ragmon-screenshots-") as tmp:
        data_dir = Path(tmp) / "data"
        with running_demo(data_dir, free_port()) as url:
            wait_for_judged_traces(url)
            write_report(data_dir)
            shots = capture(url, args.out)
    shrink(shots)
    for path in shots:
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        print(f"{shown}: {path.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
