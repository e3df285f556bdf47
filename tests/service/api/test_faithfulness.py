"""`GET /api/v1/faithfulness` (both readings, per app and release, tenant-scoped) and the diagnosis
evidence in `GET /api/v1/traces/{id}`, on a running server with the heuristic judge."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.live_server import LiveServer, live_server

KEYS = {"acme": "acme-key-0123456789", "beta": "beta-key-0123456789"}
CHUNK = {"id": "policy-1", "score": 0.9, "content": "Refunds are possible within 30 days of delivery."}


def trace(i: int, answer: str, release: str, query: str = "What is the refund window?") -> dict[str, Any]:
    return {
        "trace_id": f"{0xFA17_0000 + i:032x}",
        "app": "shop",
        "release": release,
        "query": query,
        "answer": answer,
        "retrieval": {"chunks": [CHUNK]},
    }


FAITHFUL = "Refunds are possible within 30 days."
HALF = "Refunds are possible within 30 days. Shipping is free worldwide."  # 1 of 2 claims supported
OFF_TOPIC = "The espresso machine has a two-year warranty."


def wait_until(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    settings = {
        "assembler": {"grace_s": 0.05},
        "sampler": {"rates": {"base": 1.0}},
        "judging": {"poll_s": 0.05, "estimate_every_s": 60},
        "budget": {"calls_per_minute": 100000, "usd_per_day": 1000},
        "auth": {"api_keys": {key: tenant for tenant, key in KEYS.items()}},
    }
    with live_server(tmp_path_factory.mktemp("faithfulness"), **settings) as running:
        # release r1: 3 faithful answers, 1 with half its claims supported, 1 abstention;
        # release r2: 2 answers with half their claims supported
        records = [trace(i, FAITHFUL, "r1") for i in range(3)]
        records += [trace(3, HALF, "r1"), trace(4, "I don't know.", "r1")]
        records += [trace(5, HALF, "r2"), trace(6, HALF, "r2")]
        records.append(trace(7, OFF_TOPIC, "r2", query="What warranty does the espresso machine have?"))
        with running.client(headers={"x-api-key": KEYS["acme"]}) as client:
            assert client.post("/api/v1/traces", json={"traces": records}).status_code == 200
        running.flush()
        wait_until(lambda: running.pipeline.judge_queue.stats().done == len(records))
        yield running


def get(server: LiveServer, path: str, tenant: str = "acme", **params: str) -> dict[str, Any]:
    with server.client(headers={"x-api-key": KEYS[tenant]}) as client:
        response = client.get(path, params=params)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body


def test_both_readings_per_app_with_n_and_the_no_claims_count(server: LiveServer) -> None:
    body = get(server, "/api/v1/faithfulness")
    [item] = body["items"]
    assert item["app"] == "shop" and body["by"] == "app"
    claims, answers = item["claims"], item["answers"]
    # 7 answers with claims (every trace sampled at rate 1, so the weights are equal): claim-level
    # (3 * 1 + 3 * 0.5 + 0) / 7, answer-level 3 / 7; the abstention is in neither denominator
    assert claims["estimate"] == pytest.approx(4.5 / 7)
    assert answers["estimate"] == pytest.approx(3 / 7)
    for reading in (claims, answers):
        assert (reading["n_judged"], reading["n_no_claims"], reading["n_failed"]) == (7, 1, 0)
        assert reading["lower"] <= reading["estimate"] <= reading["upper"]
        assert reading["method"] == "wilson_kish"  # fewer than 30 scored answers
        # no reviewer labelled the blind sample: no human-corrected reading, and why
        assert reading["human_corrected"] is None and reading["n_human"] == 0
        assert reading["human_corrected_reason"] == "0 blind labels, fewer than the 30 needed"
    assert body["min_labels"] == 30


def test_per_release_and_filtered(server: LiveServer) -> None:
    by_release = {i["release"]: i for i in get(server, "/api/v1/faithfulness", by="release")["items"]}
    assert set(by_release) == {"r1", "r2"}
    assert by_release["r1"]["claims"]["estimate"] == pytest.approx(3.5 / 4)
    assert by_release["r1"]["answers"]["estimate"] == pytest.approx(3 / 4)
    assert by_release["r1"]["answers"]["n_no_claims"] == 1
    assert by_release["r2"]["claims"]["estimate"] == pytest.approx(1 / 3)
    assert by_release["r2"]["answers"]["estimate"] == 0.0
    [only] = get(server, "/api/v1/faithfulness", release="r2")["items"]
    assert only["release"] == "r2" and only["answers"]["n_judged"] == 3


def test_another_tenant_sees_none_of_it(server: LiveServer) -> None:
    assert get(server, "/api/v1/faithfulness", tenant="beta")["items"] == []


def test_the_trace_view_shows_the_diagnosis_with_its_evidence(server: LiveServer) -> None:
    half = get(server, f"/api/v1/traces/{0xFA17_0000 + 5:032x}")
    [judgment] = half["judgments"]
    assert judgment["diagnosis"] == "generation_failure"
    evidence = judgment["evidence"]
    assert [(c["claim"], c["supported"], c["chunks"]) for c in evidence["claims"]] == [
        (0, True, ["policy-1"]),
        (1, False, []),
    ]
    assert evidence["claims"][1]["missing_words"] == ["shipping", "free", "worldwide"]
    off = get(server, f"/api/v1/traces/{0xFA17_0000 + 7:032x}")["judgments"][0]
    assert off["diagnosis"] == "retrieval_failure"
    assert off["evidence"]["missing_question_terms"] == ["warranty", "espresso", "machine"]
    assert off["evidence"]["summary"].startswith(
        "retrieval: 3 of 3 question terms are in none of the 1 chunks"
    )
