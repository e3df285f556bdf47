"""`ragmon report` and `/reports/latest`: an empty window says so; one with data has plots and numbers."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import sqlalchemy as sa

from detectors.regeneration_band import binomial_band
from service.cli import main as cli_main
from service.judge.store import judgments
from service.report.render import _count
from service.report.weekly import build_report, mean_interval, minute_utc, quantile_interval, rate_interval
from tests.live_server import live_server
from tests.service.drift.drift_traffic import send, traces


def test_report_over_an_empty_window_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = cli_main(["report", "--since", "7d", "--out", str(out), "--data-dir", str(tmp_path / "data")])
    assert code == 0
    html = (out / "report.html").read_text()
    markdown = (out / "report.md").read_text()
    assert "No traces in this window" in html and "nothing to report" in html
    assert "**No traces in this window**" in markdown
    assert (tmp_path / "data" / "reports" / "tenants" / "t-default" / "latest.md").read_text() == markdown
    assert "No traces in this window" in capsys.readouterr().out
    # times to the minute in UTC, as a person reads them, never ISO with microseconds
    for text in (html, markdown):
        assert not re.search(r"\d\d:\d\d:\d\d|T\d\d:|\+00:00", text), text
    assert re.search(r"No traces in this window\*\* \(\d{4}-\d\d-\d\d \d\d:\d\d UTC to ", markdown)


def test_counts_are_written_singular_for_one() -> None:
    assert [_count(n, "answer") for n in (0, 1, 2)] == ["0 answers", "1 answer", "2 answers"]
    assert _count(1, "detector run") == "1 detector run" and _count(3, "query", "queries") == "3 queries"
    local = datetime(2026, 11, 28, 10, 21, 29, 661298, tzinfo=timezone(timedelta(hours=1)))
    assert minute_utc(local) == "2026-11-28 09:21 UTC"


def test_reports_are_kept_and_served_per_tenant_and_app(tmp_path: Path) -> None:
    """Tenant A's key never reads tenant B's report; a report for one app does not replace the tenant's."""
    data = tmp_path / "data"
    keys = {"key-a": "tenant-a", "key-b": "tenant-b", "key-dots": ".."}
    with live_server(data, auth={"api_keys": keys}) as server:

        def latest(key: str, path: str = "/reports/latest.md", **params: str) -> tuple[int, str]:
            with server.client(headers={"authorization": f"Bearer {key}"}) as client:
                response = client.get(path, params=params)
            return response.status_code, response.text

        def report(*args: str) -> None:
            assert cli_main(["report", "--since", "7d", "--data-dir", str(data), *args]) == 0

        report("--tenant", "tenant-b")
        assert latest("key-a")[0] == 404 and "ragmon report" in latest("key-a")[1]
        status, b_markdown = latest("key-b")
        assert status == 200 and "tenant-b" in b_markdown
        assert latest("key-a", "/reports/latest")[0] == 404
        report("--tenant", "tenant-a", "--app", "shop")
        assert latest("key-a")[0] == 404  # only the app's report exists for tenant A
        assert latest("key-a", app="shop")[0] == 200
        assert latest("key-b", app="shop")[0] == 404
        assert latest("key-b") == (200, b_markdown)  # B's report is still B's
        # a tenant named ".." stays inside the reports folder
        report("--tenant", "..")
        assert latest("key-dots")[0] == 200
        assert not (data / "latest.md").exists() and not (data.parent / "latest.md").exists()
        with server.client() as anonymous:
            assert anonymous.get("/reports/latest").status_code == 401


def test_markdown_shows_html_from_traces_as_text(tmp_path: Path) -> None:
    """An app name or release a client sent is text in report.md, never markup (Markdown passes HTML)."""
    data = tmp_path / "data"
    hostile = "<img src=x onerror=alert(1)>"
    records = [
        {"trace_id": f"{n:032x}", "app": hostile, "release": "<b>r1</b>", "query": "q", "answer": "a"}
        for n in range(1, 6)
    ]
    with live_server(data) as server, server.client() as client:
        assert client.post("/api/v1/traces", json={"traces": records}).status_code == 200
        server.flush()
        out = tmp_path / "out"
        assert cli_main(["report", "--since", "1d", "--out", str(out), "--data-dir", str(data)]) == 0
    markdown = (out / "report.md").read_text()
    assert "## &lt;img src=x onerror=alert(1)&gt;" in markdown
    assert "<img" not in markdown and "<b>" not in markdown


def _pin_around(client: httpx.Client, start: datetime) -> list[dict[str, Any]]:
    """Pin the references of the six hours of traffic sent from `start` (an hour of margin each side)."""
    response = client.post(
        "/api/v1/drift/references",
        json={
            "from": (start - timedelta(hours=1)).isoformat(),
            "to": (start + timedelta(hours=7)).isoformat(),
        },
    )
    assert response.status_code == 200, response.text
    pinned: list[dict[str, Any]] = response.json()["pinned"]
    return pinned


def test_report_with_data_has_plots_numbers_and_is_served(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now = datetime.now(UTC)
    past = now - timedelta(days=3)
    data = tmp_path / "data"
    sampler = {"rates": {"base": 0.2}}
    # A budget no sampled trace waits for: with the default 60 calls a minute, items deferred for the
    # budget come back one a second, so judgments would keep landing between the count below and the
    # report, and the report's n would not be the count's.
    budget = {"calls_per_minute": 1e6}
    with (
        live_server(
            data, drift={"min_window": 30, "flush_s": 3600.0}, sampler=sampler, budget=budget
        ) as server,
        server.client() as client,
    ):
        assert client.get("/reports/latest").status_code == 404
        before = traces(300, seed=11, start=past, span=timedelta(hours=6), regeneration_rate=0.08)
        after = traces(300, seed=12, start=now - timedelta(hours=3), span=timedelta(hours=2), shift=0.35)
        send(client, before)
        server.flush()
        pinned = _pin_around(client, past)
        assert pinned
        send(client, after)
        server.flush()
        assert client.post("/api/v1/drift/runs", json={}).status_code == 200
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            queue = server.pipeline.judge_queue.stats()
            if queue.depth == 0 and queue.deferred == 0:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"the judge queue did not drain in 60 s: {queue}")
        with server.pipeline.store.engine.connect() as conn:
            scored = conn.execute(
                sa.select(sa.func.count()).select_from(judgments).where(judgments.c.outcome == "scored")
            ).scalar_one()

        out = tmp_path / "week"
        code = cli_main(["report", "--since", "7d", "--out", str(out), "--data-dir", str(data)])
        assert code == 0
        capsys.readouterr()
        html = (out / "report.html").read_text()
        markdown = (out / "report.md").read_text()

        served = client.get("/reports/latest")
        assert served.status_code == 200 and served.headers["content-type"].startswith("text/html")
        assert served.text == html
        assert client.get("/reports/latest.md").text == markdown

    assert html.count("<svg") == 5
    # both readings of faithfulness, each with what is and is not in its denominator
    assert "faithfulness (share of claims supported): " in markdown
    assert "faithful answers (share with no unsupported claim): " in markdown
    assert "answers without claims not in it" not in markdown
    for title in (
        "Query drift over time",
        "Faithfulness estimate",
        "Regeneration rate",
        "latency",
        "Cost per query",
    ):
        assert title in html
    assert "no data in this window" in html  # no cost was sent: that panel says so
    assert "traces: 600" in markdown
    regenerations = sum(r["is_regeneration"] for r in before + after)
    assert f"{regenerations} of 600 traces" in markdown
    assert re.search(r"p95 total latency: [0-9.]+ s \(95 % CI [0-9.]+–[0-9.]+ s\), n = 600", markdown)
    assert re.search(r"drift: \d+ alarms? in \d+ detector runs?\b", markdown)
    if scored:
        assert f"n = {scored} judged" in markdown
    else:
        assert "no judgments in this period" in markdown
    # The new topic is named as a new query group, with examples.
    assert "crypto" in markdown.split("New query groups")[1]


def test_queries_ragmon_embedded_are_grouped_as_drift_run_groups_them(tmp_path: Path) -> None:
    """Queries sent without vectors are embedded by ragmon and compared by the query-text test in
    TF-IDF fitted on the reference. The report's "new query groups" come from that same space (they
    came from the hashing vectors before), so over the same window they are the groups `drift run`
    named: the same shares and examples, the new topic on top."""
    data = tmp_path / "data"
    now = datetime.now(UTC)
    past = now - timedelta(days=2)
    with (
        live_server(data, drift={"min_window": 30, "flush_s": 3600.0}) as server,
        server.client() as client,
    ):
        send(client, traces(300, seed=21, start=past, span=timedelta(hours=6), model=None))
        server.flush()
        pinned = _pin_around(client, past)
        assert [r["model_key"].startswith("ragmon-hashing") for r in pinned] == [True]
        after = traces(
            300, seed=22, start=now - timedelta(hours=3), span=timedelta(hours=2), shift=0.35, model=None
        )
        send(client, after)
        server.flush()
        items = client.post("/api/v1/drift/runs", json={}).json()["items"]
        query = next(r for r in items if r["detector"] == "query_text_knn")
        assert query["alarm"] or query["outcome"] == "drift", query
        named = [g for g in query["explanation"] if g["significant"]]
        report = build_report(
            server.pipeline.config,
            server.pipeline.store,
            server.pipeline.drift_store,
            tenant="default",
            since=now - timedelta(hours=4),  # the run's window: the traces after the reference
            until=datetime.now(UTC),
        )
    (app,) = report.apps
    grouped = [{k: v for k, v in g.items() if k != "reference"} for g in app.groups]
    assert grouped == named[:10]
    new_topic = sum("crypto" in r["query"] for r in after)
    assert all("crypto" in e for e in grouped[0]["examples"]) and grouped[0]["share_reference"] == 0.0
    crypto_groups = [g for g in grouped if all("crypto" in e for e in g["examples"])]
    assert sum(g["n_window"] for g in crypto_groups) >= 0.8 * new_topic, (new_topic, crypto_groups)


def test_intervals_cover_their_estimates() -> None:
    values = np.random.default_rng(0).exponential(1.0, 500)
    for q in (0.5, 0.95):
        found = quantile_interval(values, q)
        assert found is not None
        estimate, low, high = found
        assert low <= estimate <= high
    # The distribution-free interval covers the true median (ln 2) in about 95 % of samples.
    covered = 0
    for seed in range(200):
        sample = np.random.default_rng(seed).exponential(1.0, 200)
        found = quantile_interval(sample, 0.5)
        assert found is not None
        covered += found[1] <= np.log(2) <= found[2]
    assert 0.88 <= covered / 200 <= 0.995
    assert mean_interval(np.array([])) is None and quantile_interval(np.array([]), 0.5) is None
    rate = rate_interval(3, 40)
    assert rate is not None and rate[1] < 3 / 40 < rate[2]
    assert rate_interval(0, 0) is None


def _charts(html: str) -> dict[str, str]:
    """Each chart's SVG by its title."""
    found = re.findall(r'<svg[^>]*aria-label="([^"]*)"[^>]*>(.*?)</svg>', html, flags=re.S)
    return {title.replace("&#x27;", "'"): body for title, body in found}


def _axis_labels(svg: str) -> list[str]:
    return re.findall(r'<text x="[0-9.]+" y="[0-9.]+" text-anchor="middle">([^<]*)</text>', svg)


def test_a_week_with_one_day_of_traces_spans_the_week_and_draws_the_detectors_band(tmp_path: Path) -> None:
    """One day of traffic in a 7-day report: every daily chart's axis is the week, one label per day,
    and the regeneration chart shades the regeneration detector's band for that day."""
    now = datetime.now(UTC)
    data = tmp_path / "data"
    drift = {"regeneration_min_baseline": 50, "flush_s": 3600.0}
    with live_server(data, drift=drift) as server, server.client() as client:
        # The detector's first window only builds its baseline (warming up); the second is judged.
        today = now.replace(hour=0, minute=0, second=0, microsecond=0)
        start = max(today, now - timedelta(hours=2))  # all of it today, also just after midnight
        for seed in (21, 22):
            send(client, traces(200, seed=seed, start=start, span=(now - start) / 2))
            server.flush()
            server.pipeline.drift.run(trigger="schedule")
        judged = server.pipeline.drift.store.runs("default", detector="regeneration_band")
        assert [r.outcome for r in judged] == ["ok", "insufficient_data"]
        baseline = float(str(judged[0].result.details["baseline_rate"]))
        out = tmp_path / "week"
        # whole days, so today is a whole day of the axis also just after midnight (a period ending
        # now would end today's part, and its band, minutes after the day began)
        since, until = (today - timedelta(days=6)).isoformat(), (today + timedelta(days=1)).isoformat()
        args = ["report", "--since", since, "--until", until, "--out", str(out), "--data-dir", str(data)]
        assert cli_main(args) == 0
    html = (out / "report.html").read_text()
    charts = _charts(html)
    week = {f"{now - timedelta(days=d):%m-%d}" for d in range(7)}
    for name, svg in charts.items():
        if "no data in this window" in svg:
            continue
        labels = _axis_labels(svg)
        assert week <= set(labels), (name, labels)
        assert all(":" not in label for label in labels), (name, labels)
    title = "Regeneration rate per day (Wilson 95 % CI) and the regeneration detector's control band"
    assert title in charts
    bands = re.findall(r'<rect class="band" x="([0-9.]+)" y="[0-9.]+" width="([0-9.]+)"', charts[title])
    assert len(bands) == 1 and float(bands[0][1]) > 10.0  # one day of a week: a block, not a line
    lower, upper = binomial_band(400, baseline, 0.01)
    assert f"{100 * lower / 400:.3g}–{100 * upper / 400:.3g} %" in html  # the day's band in the table


def test_a_period_without_a_judged_band_says_why_in_the_title(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    data = tmp_path / "data"
    # sampled traces stay queued, never judged (no judge worker): the faithfulness chart has no data
    with live_server(data, judging={"workers": 0}) as server, server.client() as client:
        send(client, traces(50, seed=23, start=now - timedelta(hours=2), span=timedelta(hours=1)))
        server.flush()
        out = tmp_path / "week"
        assert cli_main(["report", "--since", "7d", "--out", str(out), "--data-dir", str(data)]) == 0
    html = (out / "report.html").read_text()
    charts = _charts(html)
    assert "Regeneration rate per day (Wilson 95 % CI); no control band in this period (see below)" in charts
    assert "No control band: the regeneration detector did not run in this period" in html
    assert '<rect class="band"' not in html
    # Nothing was judged and no cost was sent: those charts say so instead of drawing an empty axis.
    assert "no data in this window" in charts["Faithfulness estimate per day (judge-only Hájek, 95 % CI)"]
    assert "no data in this window" in charts["Cost per query per day (mean, 95 % CI)"]
