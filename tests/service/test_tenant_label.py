"""metrics.tenant_label and the per-tenant label budgets: two tenants with the same app name stay two
series, a tenant's traces count only under its own tenant label, and one tenant's many apps, models,
intents, releases or golden sets never push another's into `other`; scraped from real servers."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.config import ConfigError, MetricsConfig, load_config
from service.metric_labels import OTHER
from service.metrics import Metrics
from service.probes.gauges import publish_probe_run
from tests.live_server import LiveServer, live_server
from tests.review_server import API_KEYS, send, settings, trace

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


def test_scrape_has_no_tenant_label_for_one_tenant(tmp_path: Path) -> None:
    one_tenant = {**settings(), "auth": {"api_keys": {API_KEYS["acme"]: "acme"}}}
    with live_server(tmp_path, **one_tenant) as live:
        send(live, "acme", [trace(1, *FAITHFUL)])
        samples = _scrape(live)
    assert _value(samples, "ragmon_traces_total", app="shop") == 1
    assert not [key for key in samples if "tenant" in dict(key[1])]


def test_the_tenant_label_is_on_as_soon_as_keys_name_two_tenants() -> None:
    def config(api_keys: dict[str, str], **metrics: object) -> MetricsConfig:
        return load_config(environ={}, overrides={"auth": {"api_keys": api_keys}, "metrics": metrics}).metrics

    assert config({}).tenant_label is False
    assert config({"k1": "acme", "k2": "acme"}).tenant_label is False
    assert config({"k1": "acme", "k2": "beta"}).tenant_label is True
    assert config({"k1": "acme"}, tenant_label=True).tenant_label is True
    with pytest.raises(ConfigError, match="name 2 tenants: their traces would count under each other's"):
        config({"k1": "acme", "k2": "beta"}, tenant_label=False)
    with pytest.raises(ConfigError, match=r"name 3 tenants, more than metrics\.max_tenants"):
        config({"k1": "a", "k2": "b", "k3": "c"}, max_tenants=2)


def test_each_tenant_has_its_own_label_caps_and_its_own_other() -> None:
    m = Metrics(
        MetricsConfig(tenant_label=True, max_apps=2, max_models=1, max_intents=1, max_releases=1),
        tenants=["a", "b"],
    )
    assert [m.scope("a", app) for app in ("a1", "a2", "a3")] == [("a", "a1"), ("a", "a2"), ("a", OTHER)]
    assert m.scope("b", "b1") == ("b", "b1"), "a's three apps took none of b's slots"
    assert m.scope("b", "a3") == ("b", "a3"), "b's own app of a name a overflowed with"
    for label in (m.model_label, m.intent_label, m.release_label):
        assert (label("a", "x"), label("a", "y"), label("b", "y")) == ("x", OTHER, "y")
    # a tenant the API keys do not name (stored under a key since removed) is never one of theirs
    assert m.scope("c", "a1") == (OTHER, "a1")
    assert m.scope("a", None) == ("a", "none")


def _score(recall: float) -> dict[str, object]:
    return {
        "ks": [5],
        "overall": {"recall@5": recall},
        "per_category": [{"category": "billing", "mean": {"recall@5": recall}}],
        "denominators": {"scored": 10},
        "filter_false_exclusion": {"rate": None},
        "correctness": {"rate": None},
        "diagnoses": {},
    }


def test_golden_sets_of_one_name_in_two_tenants_are_two_series() -> None:
    m = Metrics(MetricsConfig(tenant_label=True, max_golden_sets=1), tenants=["a", "b"])
    publish_probe_run(m, "a", "support", _score(0.5), datetime.now(UTC))
    publish_probe_run(m, "a", "faq", _score(0.1), datetime.now(UTC))
    publish_probe_run(m, "b", "support", _score(0.9), datetime.now(UTC))
    recall = m.registry.get_sample_value
    labels = {"k": "5", "category": "all"}
    assert recall("ragmon_probe_recall_ratio", {"tenant": "a", "golden": "support", **labels}) == 0.5
    assert recall("ragmon_probe_recall_ratio", {"tenant": "a", "golden": OTHER, **labels}) == 0.1
    assert recall("ragmon_probe_recall_ratio", {"tenant": "b", "golden": "support", **labels}) == 0.9
    one = Metrics(MetricsConfig())
    publish_probe_run(one, "a", "support", _score(0.5), datetime.now(UTC))
    assert one.registry.get_sample_value("ragmon_probe_recall_ratio", {"golden": "support", **labels}) == 0.5


def _json_trace(n: int, app: str, model: str = "gpt-4o-mini") -> dict[str, object]:
    return {
        "trace_id": f"{0x5A0A7000 + n:032x}",
        "app": app,
        "query": f"question {n}",
        "answer": "an answer",
        "usage": [{"model": model, "input_tokens": 10, "output_tokens": 5}],
    }


def _ingest(server: LiveServer, tenant: str, traces: list[dict[str, object]]) -> None:
    with server.client(headers={"x-api-key": API_KEYS[tenant]}) as client:
        response = client.post("/api/v1/traces", json={"traces": traces})
        assert response.status_code == 200, response.text
    server.flush()


def test_one_tenant_can_neither_squat_nor_spoof_anothers_series(tmp_path: Path) -> None:
    # the numbers: 25 apps of acme pushed beta's new app into `other`, and acme's 50 traces sent
    # under beta's app name moved beta's count from 3 to 53. The tenant label is on by default here
    # (two tenants' keys); nothing else is configured.
    two_tenants = {"auth": {"api_keys": {key: tenant for tenant, key in API_KEYS.items()}}}
    with live_server(tmp_path, **two_tenants, judging={"enabled": False}) as live:
        _ingest(live, "beta", [_json_trace(n, "beta-shop", "beta-model") for n in range(3)])
        _ingest(live, "acme", [_json_trace(300 + n, "beta-shop", "beta-model") for n in range(50)])
        _ingest(live, "acme", [_json_trace(100 + n, f"acme-app-{n}", f"acme-model-{n}") for n in range(25)])
        _ingest(live, "beta", [_json_trace(200, "beta-new", "beta-model-2")])
        samples = _scrape(live)
    traces = {
        (dict(labels)["tenant"], dict(labels)["app"]): value
        for (name, labels), value in samples.items()
        if name == "ragmon_traces_total"
    }
    assert traces[("beta", "beta-shop")] == 3, "acme's traces under beta's app name count as acme's"
    assert traces[("acme", "beta-shop")] == 50
    assert traces[("beta", "beta-new")] == 1, "acme's 25 apps took none of beta's app slots"
    assert traces[("acme", OTHER)] == 25 - 19, "acme's own cap: beta-shop and 19 of its 25 apps"
    assert sum(v for (tenant, _), v in traces.items() if tenant == "beta") == 4
    assert not [key for key in traces if key[0] not in ("acme", "beta")]
    tokens = {
        (dict(labels)["tenant"], dict(labels)["model"])
        for (name, labels), value in samples.items()
        if name == "ragmon_tokens_total" and value
    }
    assert {("beta", "beta-model"), ("beta", "beta-model-2")} <= tokens
    assert ("beta", OTHER) not in tokens
