"""Judgments and reviewers' labels as annotations on root spans in a real Phoenix; retries never duplicate."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from phoenix.client import Client

from service.judge.judgment import Judgment
from service.phoenix.annotations import judgment_annotation
from tests.live_server import LiveServer, live_server
from tests.phoenix.conftest import PhoenixServer
from tests.phoenix.rag_traces import RagApp, SentTrace
from tests.review_server import API_KEYS, settings, signed_in

PROTOBUF = {"content-type": "application/x-protobuf", "x-api-key": API_KEYS["acme"]}
CHUNK = "Refunds take 30 days after delivery."
MADE_UP = "Shipping is always free on Mondays."


def wait_until(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.1)


def drain(server: LiveServer) -> None:
    pipeline = server.pipeline
    assert server.call(pipeline.phoenix_forward.drain(30), 35)
    assert server.call(pipeline.phoenix_annotations.drain(30), 35)


def on_spans(url: str, project: str, span_ids: list[str]) -> list[dict[str, Any]]:
    found = Client(base_url=url).spans.get_span_annotations(
        span_ids=span_ids, project_identifier=project, include_annotation_names=["faithfulness"]
    )
    return [dict(a) for a in found]


def stored_judgment(server: LiveServer, trace_id: str) -> Judgment:
    records, _ = server.pipeline.judgments.for_trace("acme", trace_id)
    assert len(records) == 1
    return Judgment.model_validate(records[0])


@pytest.mark.slow
def test_judgments_and_reviews_land_on_root_spans_once(phoenix: PhoenixServer, tmp_path: Path) -> None:
    # Both traces are in the blind sample (blind_rate 1): the judge's annotation waits for the label,
    # so a reviewer reading the Phoenix project cannot see the verdict first.
    project = f"annotate-{uuid.uuid4().hex[:8]}"
    app = RagApp(project)
    phoenix_settings = {
        "endpoint": phoenix.url,
        "project": project,
        "backoff_base_s": 0.2,
        "backoff_max_s": 1,
    }
    with live_server(tmp_path, **settings(), phoenix=phoenix_settings) as server:
        faithful = app.rag("How long do refunds take?", "Refunds take 30 days.", CHUNK)
        unfaithful = app.rag("How long do refunds take?", f"Refunds take 30 days. {MADE_UP}", CHUNK)
        sent: list[SentTrace] = [faithful, unfaithful]
        with server.client() as client:
            body = app.request(sent).SerializeToString()
            assert client.post("/v1/traces", content=body, headers=PROTOBUF).status_code == 200
        server.flush()
        reviews = server.pipeline.reviews
        wait_until(lambda: all(reviews.find("acme", "blind", t.trace_id) is not None for t in sent))
        drain(server)
        roots = [t.root_span_id for t in sent]
        wait_until(lambda: all(_has_span(phoenix.url, project, root) for root in roots))
        assert on_spans(phoenix.url, project, roots) == [], "a blind item's judgment was annotated early"
        assert server.metric("ragmon_phoenix_annotations_total", kind="llm") == 0

        # the reviewer labels both: the HUMAN annotation and the held LLM one are written
        client, csrf = signed_in(server, "alice")
        try:
            headers = {"x-csrf-token": csrf}
            for trace, verdict in ((faithful, "faithful"), (unfaithful, "unfaithful")):
                item = reviews.find("acme", "blind", trace.trace_id)
                assert item is not None
                claim = client.post(f"/api/v1/review/items/{item.id}/claim", headers=headers)
                assert claim.status_code == 200
                review = {
                    "verdict": verdict,
                    "note": "Mondays are made up" if verdict == "unfaithful" else "",
                }
                if verdict == "unfaithful":
                    review["failure_mode"] = "fabrication"
                response = client.post(f"/api/v1/review/items/{item.id}/review", json=review, headers=headers)
                assert response.status_code == 201, response.text
        finally:
            client.close()
        drain(server)
        wait_until(lambda: len(on_spans(phoenix.url, project, roots)) == 4)

        version = server.pipeline.judge.version
        llm = [a for a in on_spans(phoenix.url, project, roots) if a["annotator_kind"] == "LLM"]
        for trace in sent:
            judgment = stored_judgment(server, trace.trace_id)
            (found,) = [a for a in llm if a["span_id"] == trace.root_span_id]
            assert found["name"] == "faithfulness"
            assert found["identifier"] == version
            result = found["result"]
            assert result["label"] == ("unfaithful" if judgment.unsupported else "faithful")
            assert result["score"] == pytest.approx(judgment.faithfulness)
            assert str(judgment.diagnosis) in result["explanation"]
            for i in judgment.unsupported:
                assert judgment.claims[i] in result["explanation"]
            assert found["metadata"]["judge_version"] == version
        assert stored_judgment(server, unfaithful.trace_id).unsupported, (
            "the heuristic judge missed the made-up claim"
        )

        # a redelivered judgment (same judge version) updates, never duplicates
        before = {(a["span_id"], a["annotator_kind"]): a["id"] for a in on_spans(phoenix.url, project, roots)}
        for trace in sent:
            server.call(
                server.pipeline.phoenix_annotations.after_judgment(stored_judgment(server, trace.trace_id))
            )
        drain(server)
        after = on_spans(phoenix.url, project, roots)
        assert {(a["span_id"], a["annotator_kind"]): a["id"] for a in after} == before

        (human,) = [
            a
            for a in on_spans(phoenix.url, project, [unfaithful.root_span_id])
            if a["annotator_kind"] == "HUMAN"
        ]
        assert human["identifier"] == "review/alice"
        assert human["result"]["label"] == "unfaithful"
        assert human["result"]["score"] == 0.0
        assert "Mondays are made up" in human["result"]["explanation"]
        assert server.metric("ragmon_phoenix_annotations_total", kind="human") == 2
        assert server.metric("ragmon_phoenix_annotations_total", kind="llm") == 4  # 2 released, 2 upserted
        # no lookup was counted as a failure, nothing was dropped
        assert server.metric("ragmon_phoenix_annotation_failures_total", reason="not_found") == 0
        reasons = ("buffer_full", "retries_exhausted", "rejected", "root_span_missing", "shutdown")
        dropped = {r: server.metric("ragmon_phoenix_annotations_dropped_total", reason=r) for r in reasons}
        assert sum(dropped.values()) == 0, dropped


@pytest.mark.slow
def test_a_trace_phoenix_never_received_is_dropped_and_counted(
    phoenix: PhoenixServer, tmp_path: Path
) -> None:
    project = f"missing-{uuid.uuid4().hex[:8]}"
    app = RagApp(project)
    known = app.rag("q?", "Refunds take 30 days.", CHUNK)
    phoenix_settings = {
        "endpoint": phoenix.url,
        "project": project,
        "forward": True,
        "max_attempts": 3,
        "backoff_base_s": 0.05,
        "backoff_max_s": 0.1,
    }
    with live_server(tmp_path, phoenix=phoenix_settings, judging={"enabled": False}) as server:
        with server.client() as client:
            body = app.request([known]).SerializeToString()
            response = client.post(
                "/v1/traces", content=body, headers={"content-type": PROTOBUF["content-type"]}
            )
            assert response.status_code == 200
        server.flush()
        drain(server)
        wait_until(lambda: _has_span(phoenix.url, project, known.root_span_id))
        now = datetime.now(UTC)
        ghost = Judgment(
            trace_id=f"{uuid.uuid4().int:032x}",
            judge="heuristic",
            judge_version="test",
            outcome="no_claims",
            failure_mode="none",
            context_sufficient=False,
            diagnosis="correct_abstention",
            judged_at=now,
        )
        assert judgment_annotation(ghost) is not None
        server.call(server.pipeline.phoenix_annotations.after_judgment(ghost))
        drain(server)
        assert server.metric("ragmon_phoenix_annotations_dropped_total", reason="root_span_missing") == 1
        # the lookups that missed were retried quietly: one final miss, counted as the drop only
        assert server.metric("ragmon_phoenix_annotation_failures_total", reason="not_found") == 0


def _has_span(url: str, project: str, span_id: str) -> bool:
    try:
        return bool(Client(base_url=url).spans.get_spans(project_identifier=project, span_ids=[span_id]))
    except Exception:
        return False


@pytest.mark.slow
def test_a_trace_naming_its_own_project_is_annotated_there(phoenix: PhoenixServer, tmp_path: Path) -> None:
    # phoenix.project names another project: Phoenix filed the trace under the one its spans name
    own = f"own-{uuid.uuid4().hex[:8]}"
    app = RagApp(own)
    phoenix_settings = {
        "endpoint": phoenix.url,
        "project": f"configured-{uuid.uuid4().hex[:8]}",
        "max_attempts": 4,
        "backoff_base_s": 0.2,
        "backoff_max_s": 0.5,
    }
    with live_server(tmp_path, **settings(blind_rate=0.0), phoenix=phoenix_settings) as server:
        trace = app.rag("How long do refunds take?", "Refunds take 30 days.", CHUNK)
        with server.client() as client:
            body = app.request([trace]).SerializeToString()
            assert client.post("/v1/traces", content=body, headers=PROTOBUF).status_code == 200
        server.flush()
        wait_until(lambda: bool(server.pipeline.judgments.for_trace("acme", trace.trace_id)[0]))
        drain(server)
        wait_until(lambda: len(on_spans(phoenix.url, own, [trace.root_span_id])) == 1)
        (found,) = on_spans(phoenix.url, own, [trace.root_span_id])
        assert found["annotator_kind"] == "LLM" and found["identifier"] == server.pipeline.judge.version
        assert server.metric("ragmon_phoenix_annotations_dropped_total", reason="root_span_missing") == 0
        assert server.metric("ragmon_phoenix_annotations_total", kind="llm") == 1
        assert server.metric("ragmon_phoenix_annotation_failures_total", reason="not_found") == 0
