"""The human-corrected estimate end to end: a real server judges an app's answers with a judge that is
wrong in a known way, a signed-in reviewer labels the blind sample through the review page's API,
and `GET /api/v1/faithfulness` and the gauges show the corrected number with its n and interval.
Bad input on the way (another tenant's reviewer, flagged-only labels, claim marks that do not fit,
a second label of one item) changes nothing it should not."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.live_server import LiveServer, live_server
from tests.review_server import API_KEYS, send, settings, signed_in

CHUNK = "Refunds are possible within 30 days of delivery. Shipping takes 5 business days."
# (answer, the judge's verdict as measured, the truth: faithful?, the true mark of each judge claim)
FAITHFUL = "Refunds are possible within 30 days."
# words and a number of the context recombined: the offline judge passes it
NEGATED = "Refunds take 5 business days."
HALF = "Refunds are possible within 30 days. Shipping is free worldwide."
ANSWERS = [FAITHFUL] * 4 + [NEGATED] * 3 + [HALF] * 3
TRUTH: dict[str, tuple[bool, list[bool]]] = {
    FAITHFUL: (True, [True]),
    NEGATED: (False, [False]),
    HALF: (False, [True, False]),
}


def record(n: int, answer: str) -> dict[str, Any]:
    return {
        "trace_id": f"{0xC0AA0000 + n:032x}",
        "app": "shop",
        "query": f"When can I get a refund (question {n})?",
        "answer": answer,
        "retrieval": {"chunks": [{"id": f"policy-{n}", "score": 0.9, "content": CHUNK}]},
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(Path(tmp_path_factory.mktemp("corrected")), **settings(min_labels=4)) as running:
        send(running, "acme", [record(n, answer) for n, answer in enumerate(ANSWERS)])
        send(running, "beta", [record(99, FAITHFUL) | {"app": "bank"}])
        yield running


def readings(server: LiveServer) -> dict[str, Any]:
    with server.client(headers={"x-api-key": API_KEYS["acme"]}) as client:
        response = client.get("/api/v1/faithfulness")
        assert response.status_code == 200, response.text
        [item] = response.json()["items"]
        return {"claims": item["claims"], "answers": item["answers"]}


def label(client: httpx.Client, csrf: str, item_id: int, body: dict[str, Any]) -> httpx.Response:
    claimed = client.post(f"/api/v1/review/items/{item_id}/claim", headers={"x-csrf-token": csrf})
    assert claimed.status_code in (200, 404, 409), claimed.text  # 404: not the reviewer's tenant
    return client.post(f"/api/v1/review/items/{item_id}/review", json=body, headers={"x-csrf-token": csrf})


def test_reviewers_labels_correct_the_judge_and_the_api_shows_the_corrected_reading(
    server: LiveServer,
) -> None:
    by_trace = {record(n, a)["trace_id"]: a for n, a in enumerate(ANSWERS)}
    before = readings(server)
    # the judge's own readings: it passes the recombined answers, so 7 of 10 look faithful
    assert before["answers"]["estimate"] == pytest.approx(0.7)
    assert before["claims"]["estimate"] == pytest.approx(0.85)
    for reading in before.values():
        assert reading["human_corrected"] is None and reading["n_human"] == 0
        assert reading["human_corrected_reason"] == "0 blind labels, fewer than the 4 needed"

    # flagged items are labelled (by bob), but they are not random: no correction from them
    bob, bob_csrf = signed_in(server, "bob")
    with closing(bob):
        flagged = bob.get("/api/v1/review/items", params={"queue": "flagged"}).json()["items"]
        assert flagged
        for item in flagged:
            assert label(bob, bob_csrf, item["id"], {"verdict": "unfaithful"}).status_code == 201
    assert readings(server)["answers"]["human_corrected"] is None

    alice, csrf = signed_in(server, "alice")
    carol, carol_csrf = signed_in(server, "carol")
    with closing(alice), closing(carol):
        blind = alice.get("/api/v1/review/items", params={"queue": "blind"}).json()["items"]
        assert len(blind) == 10
        # a reviewer of another tenant cannot label acme's items: 404, nothing stored
        assert label(carol, carol_csrf, blind[0]["id"], {"verdict": "faithful"}).status_code == 404
        # leave one faithful and one half-supported answer unlabelled: a two-phase sample
        skipped = {FAITHFUL: 1, HALF: 1}
        labelled, slipped = 0, False
        for item in blind:
            answer = by_trace[item["trace_id"]]
            if skipped.get(answer):
                skipped[answer] -= 1
                continue
            detail = alice.get(f"/api/v1/review/items/{item['id']}").json()
            # the judge's claims are listed for marking, without its marks, while the item is blind
            assert detail["judge_hidden"] is True and detail["judgment"] is None
            to_mark = detail["claims_to_label"]
            assert [set(c) for c in to_mark] == [{"index", "text"}] * len(to_mark)
            faithful, marks = TRUTH[answer]
            assert len(to_mark) == len(marks)
            if answer == HALF:
                wrong_count = label(
                    alice, csrf, item["id"], {"verdict": "unfaithful", "claims_supported": [True]}
                )
                assert wrong_count.status_code == 422 and "2 claims" in wrong_count.json()["detail"]
                contradiction = label(
                    alice, csrf, item["id"], {"verdict": "faithful", "claims_supported": marks}
                )
                assert contradiction.status_code == 422
            if answer == NEGATED and not slipped:
                slipped = True
                # a slip, corrected: the later label replaces the first and counts once
                assert label(alice, csrf, item["id"], {"verdict": "faithful"}).status_code == 201
                again = label(alice, csrf, item["id"], {"verdict": "unfaithful", "claims_supported": marks})
                assert again.status_code == 200 and again.json()["replaced"] is True
            else:
                body = {"verdict": "faithful" if faithful else "unfaithful", "claims_supported": marks}
                assert label(alice, csrf, item["id"], body).status_code == 201
            labelled += 1
        assert labelled == 8

    after = readings(server)
    answers, claims = after["answers"], after["claims"]
    # the judge's own numbers are unchanged and still shown
    assert answers["estimate"] == pytest.approx(0.7) and claims["estimate"] == pytest.approx(0.85)
    # answers: 3 faithful (agree), 3 recombined (judge 1, truth 0), 2 half (judge 0, truth 0): 0.7 - 3/8
    fixed = answers["human_corrected"]
    assert fixed["n_human"] == 8 and fixed["n_judged"] == 10
    assert fixed["estimate"] == pytest.approx(0.7 - 3 / 8)
    assert fixed["mean_difference"] == pytest.approx(-3 / 8)
    assert 0.0 <= fixed["low"] < fixed["estimate"] < fixed["high"] <= 1.0
    # claims: the recombined answers' one claim is unsupported (judge 1.0), the half ones agree: 0.85 - 3/8
    assert claims["human_corrected"]["estimate"] == pytest.approx(0.85 - 3 / 8)
    assert claims["human_corrected"]["n_human"] == 8
    assert claims["human_corrected"]["low"] < claims["human_corrected"]["high"]

    server.pipeline.correction.export()
    # two tenants have keys, so every per-app series carries its tenant
    labels = {"tenant": "acme", "app": "shop", "release": "all", "intent": "all"}
    assert server.metric("ragmon_faithful_answers_corrected_ratio", **labels) == pytest.approx(0.325)
    assert server.metric("ragmon_faithful_answers_corrected_ratio_lower", **labels) == pytest.approx(
        fixed["low"]
    )
    assert server.metric("ragmon_faithfulness_human_labels", **labels, reading="claims") == 8
    assert server.metric("ragmon_judge_human_pairs", tenant="acme", app="shop") == 8
    assert server.metric("ragmon_judge_human_agreement_ratio", tenant="acme", app="shop") == pytest.approx(
        5 / 8
    )
    # reviews are counted as recorded, a relabel not again: 8 blind reviews, the slip among them
    assert server.metric("ragmon_reviews_total", queue="blind", verdict="faithful") == 4
    assert server.metric("ragmon_reviews_total", queue="blind", verdict="unfaithful") == 4
