"""`/metrics` of a worker (service/scrape.py, shared with `ragmon serve`): the scrape token, the
`name[]` filter, and a slow scrape-time gauge that must not hold up the worker's event loop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.config import load_config
from service.metrics import Metrics
from service.worker import create_worker_app

TOKEN = "scrape-token-0123456789"


def _samples(text: str) -> dict[str, float]:
    return {
        sample.name + str(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _worker_app(tmp_path: Path, metrics: Metrics, **metrics_settings: object) -> FastAPI:
    config = load_config(
        environ={},
        overrides={"data_dir": str(tmp_path), "judging": {"poll_s": 0.05}, "metrics": metrics_settings},
    )
    return create_worker_app(config, ["judge"], metrics)


def test_a_worker_asks_for_the_scrape_token_and_counts_the_refusals(tmp_path: Path) -> None:
    config = load_config(environ={}, overrides={"metrics": {"scrape_token": TOKEN}})
    metrics = Metrics(config.metrics)
    with TestClient(_worker_app(tmp_path, metrics, scrape_token=TOKEN)) as client:
        assert client.get("/metrics").status_code == 401
        refused = client.get("/metrics", headers={"authorization": "Bearer wrong"})
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        answered = client.get("/metrics", headers={"authorization": f"Bearer {TOKEN}"})
        assert answered.status_code == 200
        samples = _samples(answered.text)
        assert samples["ragmon_ingest_rejected_total[('reason', 'unauthenticated')]"] == 2
        assert TOKEN not in answered.text


def test_name_filter_answers_those_samples_and_reads_only_those_gauges(tmp_path: Path) -> None:
    metrics = Metrics(load_config(environ={}).metrics)
    reads = {"ragmon_test_asked": 0, "ragmon_test_not_asked": 0}

    def reader(name: str) -> Callable[[], float]:
        def read() -> float:
            reads[name] += 1
            return 7.0

        return read

    for name in reads:
        metrics.state.add(name, "a scrape-time gauge of this test", reader(name))
    with TestClient(_worker_app(tmp_path, metrics)) as client:
        full = client.get("/metrics")
        assert reads == {"ragmon_test_asked": 1, "ragmon_test_not_asked": 1}
        assert "ragmon_traces_total" in full.text and "ragmon_test_not_asked 7.0" in full.text

        named = client.get("/metrics?name[]=ragmon_test_asked&name[]=ragmon_dead_letters_total")
        assert named.status_code == 200
        assert reads == {"ragmon_test_asked": 2, "ragmon_test_not_asked": 1}, "an unasked gauge was read"
        samples = _samples(named.text)
        assert samples == {
            "ragmon_test_asked[]": 7.0,
            "ragmon_dead_letters_total[('kind', 'feedback')]": 0.0,
            "ragmon_dead_letters_total[('kind', 'trace')]": 0.0,
        }

        assert _samples(client.get("/metrics?name[]=ragmon_no_such_metric").text) == {}


def test_a_slow_scrape_gauge_does_not_hold_up_the_worker(tmp_path: Path) -> None:
    """The judge queue's and review queue's gauges ask the database at scrape time; a slow answer
    (or a connect timeout while it is down) must not stop the worker's loop: /healthz still answers."""
    metrics = Metrics(load_config(environ={}).metrics)
    release, gauge_returned = threading.Event(), threading.Event()

    def slow_gauge() -> float:
        release.wait(10)
        gauge_returned.set()
        return 1.0

    metrics.state.add("ragmon_test_slow", "blocks until released", slow_gauge)
    with TestClient(_worker_app(tmp_path, metrics)) as client:
        scraped: list[int] = []
        scrape = threading.Thread(target=lambda: scraped.append(client.get("/metrics").status_code))
        scrape.start()
        time.sleep(0.3)  # the scrape is waiting on its gauge now
        try:
            health = client.get("/healthz")
            answered_while_blocked = not gauge_returned.is_set()
        finally:
            release.set()
        scrape.join(10)
        assert health.status_code == 200
        assert answered_while_blocked, "/healthz waited for the scrape's gauge"
        assert scraped == [200]
