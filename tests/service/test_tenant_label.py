"""metrics.tenant_label: two tenants with the same app name stay two series, scraped from a real server."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.config import MetricsConfig
from service.metrics import OTHER, Metrics
from tests.live_server import LiveServer, live_server
from tests.review_server import send, settings, trace

FAITHFUL = ("Refunds take 30 days.", "Refunds take 30 days after delivery.")
UNFAITHFUL = ("Refunds take 30 days. Shipping is always free on Mondays.", "Refunds take 30 days.")


def _scrape(server: LiveServer) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with server.client() as client:
        body = client.get("/metrics").text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def _value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> LiveServer:
    # acme: two "shop" answers, one of them with an unsupported claim; beta: one faithful "shop" answer
    extra = {"metrics": {"tenant_label": True, "max_tenants": 2}}
    with live_server(tmp_path_factory.mktemp("tenant-label"), **{**settings(), **extra}) as live:
        send(live, "acme", [trace(1, *FAITHFUL), trace(2, *UNFAITHFUL)])
        send(live, "beta", [trace(3, *FAITHFUL)])
        live.pipeline.estimator.export()
        yield live  # type: ignore[misc]


def test_equal_app_names_of_two_tenants_are_not_summed(server: LiveServer) -> None:
    samples = _scrape(server)
    assert _value(samples, "ragmon_traces_total", tenant="acme", app="shop") == 2
    assert _value(samples, "ragmon_traces_total", tenant="beta", app="shop") == 1
    assert not [key for key in samples if key[0] == "ragmon_traces_total" and ("app", "shop") in key[1]][2:]
    verdicts = {
        (tenant, verdict): _value(
            samples,
            "ragmon_judge_verdicts_total",
            tenant=tenant,
            app="shop",
            verdict=verdict,
            judge="heuristic",
        )
        for tenant, verdict in (("acme", "faithful"), ("acme", "unfaithful"), ("beta", "faithful"))
    }
    assert verdicts == {("acme", "faithful"): 1, ("acme", "unfaithful"): 1, ("beta", "faithful"): 1}
    assert (
        "ragmon_judge_verdicts_total",
        frozenset({"tenant": "beta", "app": "shop", "verdict": "unfaithful", "judge": "heuristic"}.items()),
    ) not in samples


def test_faithfulness_is_estimated_per_tenant(server: LiveServer) -> None:
    samples = _scrape(server)
    whole = {"app": "shop", "release": "all", "intent": "all"}
    acme_n = _value(samples, "ragmon_faithfulness_sample_size", tenant="acme", **whole)
    beta_n = _value(samples, "ragmon_faithfulness_sample_size", tenant="beta", **whole)
    assert (acme_n, beta_n) == (2, 1)
    assert _value(samples, "ragmon_faithful_answers_ratio", tenant="beta", **whole) == 1.0
    assert _value(samples, "ragmon_faithful_answers_ratio", tenant="acme", **whole) == 0.5
    # no series summed over the tenants is left behind
    assert not [
        k for k in samples if k[0] == "ragmon_faithfulness_sample_size" and "tenant" not in dict(k[1])
    ]


def test_the_tenant_label_is_capped_and_off_by_default() -> None:
    capped = Metrics(MetricsConfig(tenant_label=True, max_tenants=2))
    assert [capped.scope(t, "shop") for t in ("a", "b", "c", "a")] == [
        ("a", "shop"),
        ("b", "shop"),
        (OTHER, "shop"),
        ("a", "shop"),
    ]
    assert capped.scope_kw("a", None) == {"tenant": "a", "app": "none"}
    plain = Metrics(MetricsConfig())
    assert plain.scope("a", "shop") == ("shop",)
    assert plain.traces._labelnames == ("app",)
    assert capped.traces._labelnames == ("tenant", "app")


def test_scrape_has_no_tenant_label_when_it_is_off(tmp_path: Path) -> None:
    with live_server(tmp_path, **settings()) as live:
        send(live, "acme", [trace(1, *FAITHFUL)])
        samples = _scrape(live)
    assert _value(samples, "ragmon_traces_total", app="shop") == 1
    assert not [key for key in samples if "tenant" in dict(key[1])]
