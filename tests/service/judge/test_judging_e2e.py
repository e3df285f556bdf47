"""Judging in the running service: sampling into the durable queue, the judge worker, faults, restarts.

The invariant under every fault: each enqueued trace ends judged or in a
visible failed state; none disappears; none is judged twice for one judge version.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.fake_openai import FakeOpenAI, Reply
from tests.live_server import LiveServer, live_server

FAITHFUL = json.dumps(
    {
        "claims": ["Refunds are possible within 30 days."],
        "supported": [0],
        "unsupported": [],
        "outcome": "scored",
        "failure_mode": "none",
        "context_sufficient": True,
        "rationale": "stated in policy-1",
    }
)
UNFAITHFUL = json.dumps(
    {
        "claims": ["Refunds are possible within 30 days.", "Shipping is free."],
        "supported": [0],
        "unsupported": [1],
        "outcome": "scored",
        "failure_mode": "fabrication",
        "context_sufficient": True,
        "rationale": "no shipping info",
    }
)
BROKEN_PARTITION = json.dumps(
    {
        "claims": ["a", "b"],
        "supported": [0],
        "unsupported": [0],
        "outcome": "scored",
        "failure_mode": "none",
        "context_sufficient": True,
        "rationale": "x",
    }
)


T_ANY = datetime(2000, 1, 1, tzinfo=UTC)


def traces(n: int, offset: int = 0, app: str = "judge-app") -> list[dict[str, Any]]:
    return [
        {
            "trace_id": f"{0xFEED0000 + offset + i:032x}",
            "app": app,
            "query": f"What is the refund window {i}?",
            "answer": "Refunds are possible within 30 days.",
            "retrieval": {
                "chunks": [
                    {
                        "id": "policy-1",
                        "score": 0.9,
                        "content": "Refunds are possible within 30 days of delivery.",
                    }
                ]
            },
        }
        for i in range(n)
    ]


def send(server: LiveServer, records: list[dict[str, Any]]) -> None:
    with server.client() as client:
        response = client.post("/api/v1/traces", json={"traces": records})
        assert response.status_code == 200, response.text
    server.flush()


def wait_until(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def queue_states(server: LiveServer) -> dict[str, int]:
    stats = server.pipeline.judge_queue.stats()
    return {
        "pending": stats.pending,
        "leased": stats.leased,
        "done": stats.done,
        "failed": stats.failed,
        "skipped": stats.skipped,
    }


def judge_settings(fake: FakeOpenAI | None, **judging: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "assembler": {"grace_s": 0.05},
        "sampler": {"rates": {"base": 1.0}},
        "judging": {"poll_s": 0.05, "estimate_every_s": 0.2, **judging},
        "budget": {"calls_per_minute": 100000, "usd_per_day": 1000},
    }
    if fake is not None:
        settings["judge"] = {
            "base_url": fake.base_url,
            "api_key": "test",
            "model": "gpt-4o-mini",
            "backoff_base_s": 0.01,
            "backoff_max_s": 0.05,
            "timeout_s": 2,
        }
    return settings


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


def test_heuristic_judge_by_default_labels_everything_and_estimates(tmp_path: Path) -> None:
    with live_server(tmp_path, **judge_settings(None)) as server:
        send(server, traces(12))
        wait_until(lambda: queue_states(server)["done"] == 12)
        verdicts = sum(
            server.metric("ragmon_judge_verdicts_total", app="judge-app", verdict=v, judge="heuristic")
            for v in ("faithful", "unfaithful", "no_claims", "failed")
        )
        assert verdicts == 12
        wait_until(
            lambda: (
                server.metric("ragmon_faithfulness_sample_size", app="judge-app", release="all", intent="all")
                == 12
            )
        )
        estimate = server.metric("ragmon_faithfulness_estimate", app="judge-app", release="all", intent="all")
        lower = server.metric(
            "ragmon_faithfulness_estimate_lower", app="judge-app", release="all", intent="all"
        )
        upper = server.metric(
            "ragmon_faithfulness_estimate_upper", app="judge-app", release="all", intent="all"
        )
        assert 0 <= lower <= estimate <= upper <= 1
        with server.client() as client:
            record = client.get(f"/api/v1/traces/{traces(1)[0]['trace_id']}").json()
        assert record["judgments"][0]["judge"] == "heuristic"
        assert record["sampling"]["stratum"] == "base" and record["sampling"]["inclusion_probability"] == 1.0
        assert record["sampling"]["queue_state"] == "done"


def test_llm_judge_verdicts_flags_and_trace_view(tmp_path: Path, fake_openai: FakeOpenAI) -> None:
    fake_openai.script(Reply(content=FAITHFUL), Reply(content=UNFAITHFUL))
    with live_server(tmp_path, **judge_settings(fake_openai, concurrency=1, batch_size=1)) as server:
        send(server, traces(2))
        wait_until(lambda: queue_states(server)["done"] == 2)
        assert (
            server.metric("ragmon_judge_verdicts_total", app="judge-app", verdict="faithful", judge="llm")
            == 1
        )
        assert (
            server.metric("ragmon_judge_verdicts_total", app="judge-app", verdict="unfaithful", judge="llm")
            == 1
        )
        assert server.metric("ragmon_judge_cost_usd_total", judge="llm") > 0
        assert server.metric("ragmon_review_flags_total", app="judge-app", reason="unfaithful") == 1
        with server.client() as client:
            second = client.get(f"/api/v1/traces/{traces(2)[1]['trace_id']}").json()
        judgment = second["judgments"][0]
        assert judgment["faithfulness"] == 0.5 and judgment["diagnosis"] == "generation_failure"
        assert {f["reason"] for f in second["review_flags"]} == {"unfaithful"}
    # the prompt carried the untrusted text only as data
    bodies = [r["body"] for r in fake_openai.requests()]
    assert len(bodies) == 2 and all(b["temperature"] == 0 for b in bodies)


def test_faults_end_judged_or_visibly_failed_never_twice(tmp_path: Path, fake_openai: FakeOpenAI) -> None:
    fake_openai.script(
        Reply(status=429, headers={"retry-after": "0"}),
        Reply(status=429, headers={"retry-after": "0"}),
        Reply(status=500),
        Reply(raw_body="this is not json"),
        Reply(content=BROKEN_PARTITION),
    )
    fake_openai.set_default(Reply(content=FAITHFUL))
    with live_server(tmp_path, **judge_settings(fake_openai, concurrency=2)) as server:
        send(server, traces(8))
        wait_until(lambda: queue_states(server)["done"] + queue_states(server)["failed"] == 8)
        states = queue_states(server)
        completed = server.metric("ragmon_judge_completed_total", judge="llm")
        assert states["pending"] == states["leased"] == 0
        assert completed == states["done"] == 8  # each trace judged exactly once
        # Every scripted fault was one call, then retried. Whether a trace's judgment ends failed
        # (two bad replies in a row for one trace) or the worker pauses (four unavailable replies)
        # depends on how the two workers interleave, so the exact count is of calls.
        calls = server.metric("ragmon_judge_requests_total", judge="llm")
        ended_failed = server.metric(
            "ragmon_judge_verdicts_total", app="judge-app", verdict="failed", judge="llm"
        )
        assert calls == 5 + 8 - ended_failed
        failures = sum(
            server.metric("ragmon_judge_failures_total", reason=r)
            for r in ("rate_limited", "server_error", "malformed", "partition_violation")
        )
        assert failures >= ended_failed


def test_restart_mid_queue_loses_nothing(tmp_path: Path) -> None:
    with live_server(tmp_path, **judge_settings(None, workers=0)) as first:
        send(first, traces(10))
        assert queue_states(first)["pending"] == 10  # enqueued, nobody judging
    with live_server(tmp_path, **judge_settings(None)) as second:
        wait_until(lambda: queue_states(second)["done"] == 10)
        assert second.metric("ragmon_judge_completed_total", judge="heuristic") == 10


def test_late_thumbs_down_enqueues_the_trace(tmp_path: Path) -> None:
    settings = judge_settings(None, workers=0)
    settings["sampler"] = {"rates": {"base": 0.0, "thumbs_down": 1.0}}
    with live_server(tmp_path, **settings) as server:
        records = traces(3)
        send(server, records)
        assert queue_states(server)["pending"] == 0
        with server.client() as client:
            client.post("/api/v1/feedback", json={"trace_id": records[1]["trace_id"], "kind": "down"})
        server.flush()
        wait_until(lambda: queue_states(server)["pending"] == 1)
        with server.client() as client:
            view = client.get(f"/api/v1/traces/{records[1]['trace_id']}").json()["sampling"]
        assert view["stratum"] == "thumbs_down" and view["queue_state"] == "pending"
        assert server.metric("ragmon_judge_sampled_total", stratum="thumbs_down") == 1


def test_a_late_thumbs_down_on_a_sampled_trace_is_not_a_second_sample(tmp_path: Path) -> None:
    """ragmon_judge_sampled_total counts each queued trace once: a thumbs-down that raises an already
    queued trace's probability moves its stratum, and used to count it again."""
    settings = judge_settings(None, workers=0)
    settings["sampler"] = {"rates": {"base": 0.5, "thumbs_down": 1.0}}
    with live_server(tmp_path, **settings) as server:
        records = traces(40)
        send(server, records)
        sampled_first = queue_states(server)["pending"]
        assert 0 < sampled_first < 40
        with server.client() as client:
            events = [
                {"trace_id": r["trace_id"], "kind": "down", "event_id": f"d-{i}"}
                for i, r in enumerate(records)
            ]
            assert client.post("/api/v1/feedback", json=events).status_code == 200
        server.flush()
        wait_until(lambda: queue_states(server)["pending"] == 40)
        counted = sum(server.metric("ragmon_judge_sampled_total", stratum=s) for s in ("base", "thumbs_down"))
        assert counted == 40  # one a queued trace (it was 40 + the ones sampled before the thumbs-down)
        assert server.metric("ragmon_judge_sampled_total", stratum="thumbs_down") == 40 - sampled_first


def test_late_regenerate_enqueues_the_trace_once(tmp_path: Path) -> None:
    """A regenerate click after the trace was decided puts it in the regeneration stratum: queued once,
    however often the click is sent (the stored record already says regeneration: that must not hide it)."""
    settings = judge_settings(None, workers=0)
    settings["sampler"] = {"rates": {"base": 0.0, "regeneration": 1.0}}
    with live_server(tmp_path, **settings) as server:
        records = traces(3)
        send(server, records)
        assert queue_states(server)["pending"] == 0
        with server.client() as client:
            for event_id in ("click-1", "click-1", "click-2"):
                client.post(
                    "/api/v1/feedback",
                    json={"trace_id": records[2]["trace_id"], "kind": "regenerate", "event_id": event_id},
                )
                server.flush()
        wait_until(lambda: queue_states(server)["pending"] == 1)
        with server.client() as client:
            view = client.get(f"/api/v1/traces/{records[2]['trace_id']}").json()["sampling"]
        assert view["stratum"] == "regeneration" and view["queue_state"] == "pending"
        assert queue_states(server)["pending"] == 1


def test_one_tenant_floods_and_anothers_few_traces_are_all_judged(tmp_path: Path) -> None:
    """The issue's run on a real server: acme sends a flood, then beta 5 traces. The budget (2 calls
    a second after a burst of 10) is shared in turns between the tenants waiting, so beta's 5 are
    judged within seconds while acme's flood waits in the queue, deferred: nothing is skipped."""
    keys = {"acme": "acme-key-0123456789", "beta": "beta-key-0123456789"}
    settings = judge_settings(None)
    settings["budget"] = {"calls_per_minute": 120, "burst_calls": 10, "usd_per_day": 1000, "lease_calls": 1}
    settings["auth"] = {"api_keys": {key: tenant for tenant, key in keys.items()}}

    def send_as(server: LiveServer, tenant: str, records: list[dict[str, Any]]) -> None:
        with server.client(headers={"x-api-key": keys[tenant]}) as client:
            response = client.post("/api/v1/traces", json={"traces": records})
            assert response.status_code == 200, response.text
        server.flush()

    with live_server(tmp_path, **settings) as server:
        queue = server.pipeline.judge_queue
        send_as(server, "acme", traces(150))
        wait_until(lambda: queue.stats().deferred > 0)  # the burst is spent: acme's flood waits
        send_as(server, "beta", traces(5, offset=1000))

        def beta_done() -> int:
            return sum(r.state == "done" for r in queue.records(since=T_ANY, tenant="beta"))

        wait_until(lambda: beta_done() == 5, timeout=60)
        acme = queue.records(since=T_ANY, tenant="acme")
        assert queue.stats().skipped == 0, "no trace is skipped for lack of budget"
        assert sum(r.state == "done" for r in acme) < 150, "acme's flood still waits its turns"
        assert sum(r.deferred for r in acme) > 0
        assert server.metric("ragmon_judge_deferred_total", tenant="acme") > 0
        judged = {r.item.inclusion_probability for r in acme if r.state == "done"}
        assert judged == {1.0}, "a deferred trace judged later keeps its probability"
