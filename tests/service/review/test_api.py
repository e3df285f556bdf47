"""`service/review/page.py` through a real server: sign-in, CSRF, tenants, leases, labels, metrics, export."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from service.cli import main as ragmon
from service.probes.golden import GoldenQuestion, parse_golden
from tests.live_server import LiveServer, live_server
from tests.review_server import API_KEYS, TOKENS, review_server, signed_in


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with review_server(tmp_path_factory.mktemp("review")) as running:
        yield running


def items(server: LiveServer, reviewer: str, **filters: str) -> list[dict[str, object]]:
    client, _ = signed_in(server, reviewer)
    with closing(client):
        response = client.get("/api/v1/review/items", params=filters)
        assert response.status_code == 200
        found: list[dict[str, object]] = response.json()["items"]
        return found


def test_sign_in_needs_the_login_token_and_a_known_reviewer_token(server: LiveServer) -> None:
    with server.client() as client:
        assert client.get("/api/v1/review/items").status_code == 401
        page = client.get("/review", follow_redirects=False)
        assert page.status_code == 303 and page.headers["location"] == "/review/login"
        login = client.get("/review/login")
        assert "script-src 'self'" in login.headers["content-security-policy"]
        assert "'unsafe-inline'" not in login.headers["content-security-policy"]
        token = client.cookies.get("ragmon_review_login")
        # no double-submit token: refused even with a good reviewer token
        refused = client.post("/api/v1/review/session", json={"token": TOKENS["alice"]})
        assert refused.status_code == 403
        # a made-up cookie and header pair, equal but not signed by this server: refused too
        made_up = client.post(
            "/api/v1/review/session",
            json={"token": TOKENS["alice"]},
            headers={"x-csrf-token": "made-up", "cookie": "ragmon_review_login=made-up"},
        )
        assert made_up.status_code == 403
        wrong = client.post("/api/v1/review/session", json={"token": "nope"}, headers={"x-csrf-token": token})
        assert wrong.status_code == 401
        ok = client.post(
            "/api/v1/review/session", json={"token": TOKENS["alice"]}, headers={"x-csrf-token": token}
        )
        assert ok.status_code == 200 and ok.json()["tenants"] == ["acme"]
        cookie = ok.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        assert client.get("/review").status_code == 200


def test_writes_with_the_session_cookie_need_the_csrf_token(server: LiveServer) -> None:
    client, csrf = signed_in(server, "alice")
    with closing(client):
        item = client.get("/api/v1/review/items", params={"queue": "flagged"}).json()["items"][0]
        assert client.post(f"/api/v1/review/items/{item['id']}/claim").status_code == 403
        assert (
            client.post(
                f"/api/v1/review/items/{item['id']}/claim", headers={"x-csrf-token": "x" + csrf}
            ).status_code
            == 403
        )
        claimed = client.post(f"/api/v1/review/items/{item['id']}/claim", headers={"x-csrf-token": csrf})
        assert claimed.status_code == 200 and claimed.json()["reviewer"] == "alice"
        client.post(f"/api/v1/review/items/{item['id']}/release", headers={"x-csrf-token": csrf})


def test_a_reviewer_sees_only_the_tenants_granted(server: LiveServer) -> None:
    acme = items(server, "alice")
    beta = items(server, "carol")
    assert acme and beta
    assert {i["tenant"] for i in acme} == {"acme"} and {i["tenant"] for i in beta} == {"beta"}
    client, csrf = signed_in(server, "carol")
    with closing(client):
        other = acme[0]["id"]
        assert client.get(f"/review/items/{other}").status_code == 404
        assert client.get(f"/api/v1/review/items/{other}").status_code == 404
        assert (
            client.post(f"/api/v1/review/items/{other}/claim", headers={"x-csrf-token": csrf}).status_code
            == 404
        )
        body = {"verdict": "faithful"}
        assert (
            client.post(
                f"/api/v1/review/items/{other}/review", json=body, headers={"x-csrf-token": csrf}
            ).status_code
            == 404
        )
        assert client.get("/review/items/999999").status_code == 404
        # release answers like every other action: another tenant's item does not exist
        for item_id in (other, 999999):
            released = client.post(f"/api/v1/review/items/{item_id}/release", headers={"x-csrf-token": csrf})
            assert released.status_code == 404, released.text


def test_a_second_reviewer_cannot_claim_a_leased_item(server: LiveServer) -> None:
    alice, alice_csrf = signed_in(server, "alice")
    bob, bob_csrf = signed_in(server, "bob")
    with closing(alice), closing(bob):
        item = alice.get("/api/v1/review/items", params={"queue": "flagged"}).json()["items"][0]
        assert (
            alice.post(
                f"/api/v1/review/items/{item['id']}/claim", headers={"x-csrf-token": alice_csrf}
            ).status_code
            == 200
        )
        taken = bob.post(f"/api/v1/review/items/{item['id']}/claim", headers={"x-csrf-token": bob_csrf})
        assert taken.status_code == 409 and taken.json()["reviewer"] == "alice"
        label = bob.post(
            f"/api/v1/review/items/{item['id']}/review",
            json={"verdict": "faithful"},
            headers={"x-csrf-token": bob_csrf},
        )
        assert label.status_code == 409
        alice.post(f"/api/v1/review/items/{item['id']}/release", headers={"x-csrf-token": alice_csrf})
        again = bob.post(f"/api/v1/review/items/{item['id']}/claim", headers={"x-csrf-token": bob_csrf})
        assert again.status_code == 200
        bob.post(f"/api/v1/review/items/{item['id']}/release", headers={"x-csrf-token": bob_csrf})


def test_blind_items_hide_the_judge_until_labelled_and_labels_move_calibration_and_metrics(
    tmp_path: Path,
) -> None:
    with review_server(tmp_path) as server:
        client, csrf = signed_in(server, "alice")
        with closing(client):
            blind = client.get("/api/v1/review/items", params={"queue": "blind"}).json()["items"]
            assert [r["reason"] for i in blind for r in i["reasons"]] == ["blind_sample"] * len(blind)
            assert all(i["diagnosis"] is None for i in blind)
            before = client.get("/api/v1/review/calibration").json()["calibration"]
            assert before == []
            with server.client(headers={"x-api-key": API_KEYS["acme"]}) as app_client:
                # the trace API, which a reviewer holding the app's key reaches, hides the judge too
                for item in blind:
                    trace = app_client.get(f"/api/v1/traces/{item['trace_id']}").json()
                    assert (trace["judge_hidden"], trace["judgments"], trace["review_flags"]) == (
                        True,
                        [],
                        [],
                    )
                    assert server.pipeline.judgments.for_trace("acme", item["trace_id"])[0], "not judged"
            for item in blind:
                detail = client.get(f"/api/v1/review/items/{item['id']}").json()
                assert detail["judge_hidden"] is True and detail["judgment"] is None
                client.post(f"/api/v1/review/items/{item['id']}/claim", headers={"x-csrf-token": csrf})
                # the reviewer calls both unfaithful: the judge called one of them faithful
                body = {
                    "verdict": "unfaithful",
                    "expected_chunk_ids": ["policy-9"],
                    "reference_answer": "30 days.",
                    "category": "refunds",
                    "expected_behaviour": "answer",
                    "failure_mode": "fabrication",
                }
                done = client.post(
                    f"/api/v1/review/items/{item['id']}/review", json=body, headers={"x-csrf-token": csrf}
                )
                assert done.status_code == 201
                shown = client.get(f"/api/v1/review/items/{item['id']}").json()
                assert shown["judge_hidden"] is False and shown["judgment"] is not None
                assert shown["review"]["verdict"] == "unfaithful"
            with server.client(headers={"x-api-key": API_KEYS["acme"]}) as app_client:
                for item in blind:
                    trace = app_client.get(f"/api/v1/traces/{item['trace_id']}").json()
                    assert trace["judge_hidden"] is False and len(trace["judgments"]) == 1
            [calibration] = client.get("/api/v1/review/calibration").json()["calibration"]
            assert calibration["sample"] == "blind" and calibration["pairs"] == 2
            assert calibration["false_approval"]["count"] == 1 and calibration["false_approval"]["total"] == 1
            assert calibration["agreement"]["value"] == 0.5
            progress = client.get("/api/v1/review/progress").json()
            assert progress["queues"]["blind"]["done"] == 2
            assert progress["reviewers"]["alice"]["done"] == 2
            version = calibration["judge_version"]
        assert server.metric("ragmon_reviews_total", queue="blind", verdict="unfaithful") == 2
        scrape = server.client().get("/metrics").text
        assert 'ragmon_review_items{queue="blind",state="done"} 2.0' in scrape
        assert f'ragmon_judge_agreement_ratio{{judge_version="{version}",sample="blind"}} 0.5' in scrape
        assert f'ragmon_judge_false_approval_ratio{{judge_version="{version}",sample="blind"}} 1.0' in scrape
        # the intervals the page shows, as gauges too (Wilson, 1 of 2 agree)
        labels = {"judge_version": version, "sample": "blind"}
        lower = server.metric("ragmon_judge_agreement_ratio_lower", **labels)
        upper = server.metric("ragmon_judge_agreement_ratio_upper", **labels)
        assert (lower, upper) == (
            pytest.approx(calibration["agreement"]["lower"]),
            pytest.approx(calibration["agreement"]["upper"]),
        )
        assert 0 < lower < 0.5 < upper < 1
        assert server.metric("ragmon_judge_false_approval_ratio_lower", **labels) < 1.0
        assert 'ragmon_review_reviewer_items{reviewer="alice",state="done"} 2.0' in scrape
        assert 'ragmon_review_oldest_open_age_seconds{queue="flagged"}' in scrape

        # export: API download and CLI give golden-set rows
        client, _ = signed_in(server, "alice")
        with closing(client):
            response = client.get("/api/v1/review/export")
            assert response.headers["content-disposition"].startswith("attachment")
            rows = [json.loads(line) for line in response.text.splitlines()]
            golden = client.get("/api/v1/review/export", params={"format": "golden"}).text
        assert len(rows) == 2
        for row in rows:
            assert row["reviewer"] == "alice" and row["reference_answer"] == "30 days."
            assert row["source_trace_id"] == row["question_id"]
            plain = GoldenQuestion.model_validate(
                {k: v for k, v in row.items() if k in GoldenQuestion.model_fields}
            )
            assert [g.chunk_id for g in plain.gold_chunks] == ["policy-9"]
            assert plain.category == "refunds" and plain.tenants == ("acme",)
        assert len(parse_golden(golden.splitlines())) == 2
        out = tmp_path / "golden.jsonl"
        code = ragmon(["review", "export", "--data-dir", str(tmp_path), "--out", str(out), "--golden"])
        assert code == 0
        assert {q.question_id for q in parse_golden(out.read_text().splitlines())} == {
            r["question_id"] for r in rows
        }
        future = tmp_path / "none.jsonl"
        ragmon(
            ["review", "export", "--data-dir", str(tmp_path), "--out", str(future), "--since", "2999-01-01"]
        )
        assert future.read_text() == ""


def test_apps_send_traces_to_review_with_their_api_key(server: LiveServer) -> None:
    trace_id = f"{0xC0FFEE000 + 1:032x}"
    with server.client(headers={"x-api-key": API_KEYS["acme"]}) as client:
        sent = client.post("/api/v1/review/items", json={"trace_id": trace_id, "note": "customer complaint"})
        assert sent.status_code in (200, 201), sent.text
        again = client.post("/api/v1/review/items", json={"trace_id": trace_id})
        assert again.status_code == 200 and again.json()["item_id"] == sent.json()["item_id"]
    with server.client(headers={"x-api-key": API_KEYS["beta"]}) as client:
        assert client.post("/api/v1/review/items", json={"trace_id": trace_id}).status_code == 404
    with server.client(headers={"x-api-key": "unknown"}) as client:
        assert client.post("/api/v1/review/items", json={"trace_id": trace_id}).status_code == 403
    [item] = items(server, "alice", reason="api")
    assert item["trace_id"] == trace_id and item["queue"] == "flagged"


def test_the_sign_in_page_says_how_to_add_a_reviewer_when_none_is_configured(tmp_path: Path) -> None:
    with live_server(tmp_path) as bare, bare.client() as client:
        page = client.get("/review/login")
        assert page.status_code == 200 and 'id="no-reviewers"' in page.text
        assert "RAGMON_REVIEW__REVIEWERS" in page.text and "token_sha256" in page.text
        answer = client.post(
            "/api/v1/review/session",
            json={"token": "anything-at-all"},
            headers={"x-csrf-token": client.cookies.get("ragmon_review_login") or ""},
        )
        assert answer.status_code == 401 and "no reviewers are configured" in answer.json()["detail"]


def test_the_sign_in_page_has_no_such_note_when_reviewers_exist(server: LiveServer) -> None:
    with server.client() as client:
        page = client.get("/review/login")
    assert 'id="no-reviewers"' not in page.text and "<!-- no-reviewers -->" not in page.text
