"""A request whose spans arrive over minutes is stored whole (issue 34, item 1), end to end through a real
server: OTLP protobuf over HTTP in, the stored trace, its metrics and its judgment out. Time is the
test's: the assembler's clock and the span archive's are replaced by one the test moves, nothing sleeps.

* 40 s, 3 min and 10 min requests, a streamed answer that comes as a log record after its span, one
  trace split over several OTLP requests: each ends stored whole;
* a trace flushed early is completed by its late spans: the stored row is replaced, the counters grow
  by exactly the difference (no second count), the per-trace histograms are observed once, and the
  judge, which saw the trace without its answer, judges it again (one judgment in the estimate);
* every span dropped is counted with its reason (too late, duplicate), exactly;
* the open-trace buffer at its bound answers 503 + Retry-After, and the tick makes room.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from sampler.queue import ItemKey
from tests.fake_openai import FakeOpenAI, Reply
from tests.live_server import LiveServer, live_server
from tests.rag_spans import RagRequest, body

PROTOBUF = {"content-type": "application/x-protobuf"}
APP = "shop"


class Clock:
    """One clock for the assembler (monotonic seconds) and the span archive (wall time)."""

    def __init__(self) -> None:
        self.now = 10_000.0
        self.origin = datetime.now(UTC)

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return self.origin + timedelta(seconds=self.now - 10_000.0)


@pytest.fixture(scope="module")
def clock() -> Clock:
    return Clock()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, clock: Clock) -> Iterator[LiveServer]:
    settings: dict[str, Any] = {
        "assembler": {"grace_s": 0.5, "idle_s": 120, "max_age_s": 900, "late_window_s": 1800},
        "sampler": {"rates": {"base": 1.0}},  # every trace is judged: the re-judgment is visible
        "judging": {"poll_s": 0.05},
        "budget": {"calls_per_minute": 6000, "scope": "process"},
    }
    with live_server(tmp_path_factory.mktemp("ragmon"), **settings) as live:
        live.pipeline.assembler.clock = clock.monotonic
        live.pipeline.span_archive.clock = clock.wall
        yield live


def post(server: LiveServer, data: bytes, path: str = "/v1/traces") -> httpx.Response:
    with server.client(headers=PROTOBUF) as client:
        return client.post(path, content=data)


def send(server: LiveServer, *spans: Any) -> None:
    response = post(server, body(*spans, app=APP))
    assert response.status_code == 200, response.text


def advance(server: LiveServer, clock: Clock, seconds: float) -> None:
    """Move time on and let the assembler flush what is due, then the bus deliver it."""
    clock.now += seconds
    server.call(server.pipeline.assembler.flush_due())
    assert server.call(server.pipeline.bus.drain(10))


def stored(server: LiveServer, trace_id: str) -> dict[str, Any]:
    with server.client() as client:
        response = client.get(f"/api/v1/traces/{trace_id}")
    assert response.status_code == 200, response.text
    record: dict[str, Any] = response.json()
    return record


def metric(server: LiveServer, name: str, **labels: str) -> float:
    return server.metric(name, **labels)


COUNTERS = {
    "traces": ("ragmon_traces_total", {"app": APP}),
    "partial": ("ragmon_partial_traces_total", {"app": APP}),
    "completed": ("ragmon_partial_traces_completed_total", {"app": APP}),
    "updated": ("ragmon_traces_updated_total", {"app": APP}),
    "input": ("ragmon_tokens_total", {"app": APP, "model": "gpt-4o-mini", "kind": "input"}),
    "output": ("ragmon_tokens_total", {"app": APP, "model": "gpt-4o-mini", "kind": "output"}),
    "totals": ("ragmon_stage_duration_seconds_count", {"app": APP, "stage": "total"}),
    "total_sum": ("ragmon_stage_duration_seconds_sum", {"app": APP, "stage": "total"}),
    "late": ("ragmon_late_spans_total", {}),
    "too_late": ("ragmon_dropped_spans_total", {"reason": "too_late"}),
    "duplicate": ("ragmon_dropped_spans_total", {"reason": "duplicate"}),
    "rejudged": ("ragmon_judge_rejudged_total", {}),
}


def counters(server: LiveServer) -> dict[str, float]:
    return {name: metric(server, m, **labels) for name, (m, labels) in COUNTERS.items()}


def grown(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: round(after[k] - before[k], 6) for k in before if round(after[k] - before[k], 6)}


def judgments(
    server: LiveServer, trace_id: str, *, wait_for_revision: int, timeout_s: float = 20.0
) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        found, _ = server.pipeline.judgments.for_trace("default", trace_id)
        if found and found[-1].get("trace_revision", 0) >= wait_for_revision:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"no judgment of revision {wait_for_revision}: {found}")
        time.sleep(0.05)


def test_a_40_s_request_is_stored_whole_at_its_first_flush(server: LiveServer, clock: Clock) -> None:
    request = RagRequest(duration_s=40)
    before = counters(server)
    send(server, request.retrieve)  # the batch exporter sends the retrieval span at once
    advance(server, clock, 40)  # the LLM answers 40 s later
    send(server, request.generate, request.root)
    advance(server, clock, 0.6)
    record = stored(server, request.trace_id)
    assert record["span_count"] == 3 and record["flags"]["partial"] is False
    assert record["answer"] == request.answer
    assert (record["input_tokens"], record["output_tokens"]) == (1000, 200)
    assert record["timings"]["total_s"] == pytest.approx(40.0)
    # counted once, whole: nothing to correct
    assert grown(before, counters(server)) == {
        "traces": 1,
        "input": 1000,
        "output": 200,
        "totals": 1,
        "total_sum": pytest.approx(40.0),
    }


@pytest.mark.parametrize("minutes", [3, 10])
def test_a_request_of_minutes_is_flushed_early_then_completed_by_its_late_spans(
    server: LiveServer, clock: Clock, minutes: int
) -> None:
    duration = minutes * 60.0
    request = RagRequest(duration_s=duration)
    before = counters(server)
    started = clock.now
    send(server, request.retrieve)
    advance(server, clock, 121)  # idle: flushed without its root, stored partial
    first = stored(server, request.trace_id)
    assert (first["span_count"], first["flags"]["partial"], first["answer"]) == (1, True, None)
    assert (first["input_tokens"], first["output_tokens"]) == (0, 0)
    # a partial version's total (0.2 s: the extent of one span) is not observed
    assert grown(before, counters(server)) == {"traces": 1, "partial": 1}
    judged = judgments(server, request.trace_id, wait_for_revision=1)
    assert (judged[-1]["outcome"], judged[-1]["failure_reason"]) == ("failed", "no_answer")
    steps = 0
    if minutes == 10:  # an agent's tool call at 5 min: a second late part
        advance(server, clock, 300 - 121)
        send(server, request.step(1, 300))
        advance(server, clock, 121)
        steps = 1
        assert stored(server, request.trace_id)["span_count"] == 2
    advance(server, clock, duration - (clock.now - started))
    send(server, request.generate, request.root)
    advance(server, clock, 0.6)
    record = stored(server, request.trace_id)
    assert record["span_count"] == 3 + steps and record["flags"]["partial"] is False
    assert record["answer"] == request.answer
    assert (record["input_tokens"], record["output_tokens"]) == (1000, 200)
    assert record["timings"]["total_s"] == pytest.approx(duration)
    assert record["context"]["revision"] == 3 + steps
    # counted once; the corrections are exactly the difference, the total observed once, when whole
    assert grown(before, counters(server)) == {
        "traces": 1,
        "partial": 1,
        "completed": 1,
        "updated": 1 + steps,
        "input": 1000,
        "output": 200,
        "totals": 1,
        "total_sum": pytest.approx(duration),
        "late": 2 + steps,
        "rejudged": 1,
    }
    # the judge saw the answer that came late: one judgment of the trace, the latest
    judged = judgments(server, request.trace_id, wait_for_revision=3 + steps)
    assert len(judged) == 1 and judged[0]["outcome"] == "scored"


def test_a_streamed_answer_sent_as_a_log_record_after_its_span_completes_the_trace(
    server: LiveServer, clock: Clock
) -> None:
    request = RagRequest(duration_s=95, genai=True)
    before = counters(server)
    send(server, request.retrieve, request.generate, request.root)
    advance(server, clock, 0.6)  # root + grace: flushed, and stored without an answer
    first = stored(server, request.trace_id)
    assert (first["span_count"], first["answer"], first["flags"]["partial"]) == (3, None, False)
    assert judgments(server, request.trace_id, wait_for_revision=3)[-1]["failure_reason"] == "no_answer"
    # the logs exporter sends the streamed answer 30 s later
    advance(server, clock, 30)
    response = post(server, request.choice_body(APP), "/v1/logs")
    assert response.status_code == 200, response.text
    advance(server, clock, 0.6)  # a late part of a trace flushed with its root waits grace_s only
    record = stored(server, request.trace_id)
    assert record["answer"] == request.answer and record["context"]["revision"] == 4
    assert grown(before, counters(server)) == {
        "traces": 1,
        "updated": 1,
        "input": 1000,
        "output": 200,
        "totals": 1,
        "total_sum": pytest.approx(95.0),
        "late": 1,
        "rejudged": 1,
    }
    judged = judgments(server, request.trace_id, wait_for_revision=4)
    assert len(judged) == 1 and judged[0]["outcome"] == "scored"


def test_one_trace_split_over_several_otlp_requests_is_stored_once_whole(
    server: LiveServer, clock: Clock
) -> None:
    request = RagRequest(duration_s=12)
    before = counters(server)
    send(server, request.retrieve)
    advance(server, clock, 5)
    send(server, request.generate)
    advance(server, clock, 7)
    send(server, request.root)
    advance(server, clock, 0.6)
    record = stored(server, request.trace_id)
    assert (record["span_count"], record["flags"]["partial"], record["answer"]) == (3, False, request.answer)
    assert grown(before, counters(server)) == {
        "traces": 1,
        "input": 1000,
        "output": 200,
        "totals": 1,
        "total_sum": pytest.approx(12.0),
    }


def test_every_dropped_span_is_counted_with_its_reason(server: LiveServer, clock: Clock) -> None:
    request = RagRequest(duration_s=2)
    send(server, request.retrieve, request.generate, request.root)
    advance(server, clock, 0.6)
    before = counters(server)
    send(server, request.retrieve, request.generate)  # a client's retry: kept already
    advance(server, clock, 0.6)
    assert grown(before, counters(server)) == {"duplicate": 2}
    # past the late window of its first flush: dropped, counted, the stored trace left alone
    advance(server, clock, 1800)
    send(server, request.step(1, 1), request.step(2, 1.5), request.step(3, 1.7))
    advance(server, clock, 121)  # forgotten here too: flushed when idle
    assert grown(before, counters(server)) == {"duplicate": 2, "too_late": 3}
    assert stored(server, request.trace_id)["span_count"] == 3


def test_a_partial_trace_whose_root_never_comes_has_its_total_observed_when_its_window_closes(
    server: LiveServer, clock: Clock
) -> None:
    request = RagRequest(duration_s=30)
    send(server, request.retrieve, request.step(1, 3))
    before = counters(server)
    advance(server, clock, 121)
    assert grown(before, counters(server)) == {"traces": 1, "partial": 1}
    advance(server, clock, 1801)
    assert server.call(_expire(server)) >= 1
    extent = 4.0 - 0.05  # from the retrieval's start to the tool call's end
    assert grown(before, counters(server)) == {
        "traces": 1,
        "partial": 1,
        "totals": 1,
        "total_sum": pytest.approx(extent),
    }


async def _expire(server: LiveServer) -> int:
    import asyncio

    return await asyncio.to_thread(server.pipeline.span_expiry.expire)


def test_the_open_trace_buffer_at_its_bound_answers_503_with_retry_after(tmp_path: Any) -> None:
    clock = Clock()
    settings = {
        "assembler": {"max_spans": 4, "tick_s": 3600, "evict_above": 0.5},
        "judging": {"enabled": False},
    }
    with live_server(tmp_path, **settings) as server:
        server.pipeline.assembler.clock = clock.monotonic
        server.pipeline.span_archive.clock = clock.wall
        requests = [RagRequest(duration_s=60) for _ in range(3)]
        send(server, requests[0].retrieve, requests[0].step(1, 1))
        send(server, requests[1].retrieve, requests[1].step(1, 1))  # 4 spans: at the bound
        refused = post(server, body(requests[2].retrieve, app=APP))
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert metric(server, "ragmon_ingest_rejected_total", reason="queue_full") == 1
        with server.client() as client:
            ready = client.get("/readyz")  # it answers (503s that exporters retry): ready, degraded
            assert ready.status_code == 200 and "open-trace buffer" in ready.json()["detail"]
        # the tick flushes the least recently active trace early, down to evict_above (2 spans)
        advance(server, clock, 0.1)
        assert metric(server, "ragmon_assembled_traces_total", reason="evicted") == 1
        assert stored(server, requests[0].trace_id)["span_count"] == 2
        send(server, requests[2].retrieve)
        # what was flushed early is completed by its later spans
        send(server, requests[0].generate, requests[0].root)
        advance(server, clock, 0.6)
        assert stored(server, requests[0].trace_id)["span_count"] == 4


JUDGED = json.dumps(
    {
        "claims": ["Refunds take five working days."],
        "supported": [0],
        "unsupported": [],
        "outcome": "scored",
        "failure_mode": "none",
        "context_sufficient": True,
        "rationale": "stated in refund-policy",
    }
)


def test_an_answer_that_changes_while_the_judge_works_is_judged_again(tmp_path: Any) -> None:
    clock = Clock()
    with FakeOpenAI() as fake:
        fake.set_default(Reply(content=JUDGED, delay_s=3.0))  # a slow judge: the update lands meanwhile
        settings: dict[str, Any] = {
            "sampler": {"rates": {"base": 1.0}},
            "judging": {"poll_s": 0.05},
            "budget": {"calls_per_minute": 6000, "scope": "process"},
            "judge": {"base_url": fake.base_url, "api_key": "test", "model": "gpt-4o-mini", "timeout_s": 10},
        }
        with live_server(tmp_path, **settings) as server:
            server.pipeline.assembler.clock = clock.monotonic
            server.pipeline.span_archive.clock = clock.wall
            request = RagRequest(duration_s=150, answer="Refunds take five working days.")
            draft = RagRequest(duration_s=150, answer="Refunds take a while.", trace_id=request.trace_id)
            send(server, request.retrieve, draft.generate)  # the LLM span's draft answer, no root yet
            advance(server, clock, 121)
            key = ItemKey("default", request.trace_id, server.pipeline.judge.version)
            deadline = time.monotonic() + 20
            while (record := server.pipeline.judge_queue.get(key)) is None or record.state != "leased":
                assert time.monotonic() < deadline, "the trace was never claimed"
                time.sleep(0.02)
            send(server, request.root)  # the root's own answer, while the judge reads the draft
            advance(server, clock, 0.6)
            assert stored(server, request.trace_id)["answer"] == request.answer
            judged = judgments(server, request.trace_id, wait_for_revision=3)
            assert len(judged) == 1 and judged[0]["outcome"] == "scored"
            asked = [json.dumps(r) for r in fake.requests()]
            assert len(asked) == 2 and "a while" in asked[0] and "five working days" in asked[1]
            assert metric(server, "ragmon_judge_rejudged_total") == 1
