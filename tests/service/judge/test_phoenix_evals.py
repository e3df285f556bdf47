"""`PhoenixEvalsJudge` through a real OpenAI-compatible HTTP server: verdicts, record meaning, failures."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from service.config import JudgeConfig
from service.errors import JudgeUnavailable
from service.judge.build import build_judge
from service.judge.phoenix_evals import NOT_ASSESSED, PhoenixEvalsJudge
from service.model import Chunk, RagTrace, Retrieval
from tests.fake_openai import FakeOpenAI, Reply
from tests.live_server import live_server

QUERY = "How long do refunds take?"
CHUNK = "Refunds take 30 days after delivery."
ANSWER = "Refunds take 30 days. Shipping is free on Mondays."


def label(value: str, why: str = "checked against the context") -> Reply:
    return Reply(
        content=json.dumps({"explanation": why, "label": value}), prompt_tokens=210, completion_tokens=12
    )


def make_trace(answer: str | None = ANSWER, chunks: tuple[Chunk, ...] | None = None) -> RagTrace:
    return RagTrace(
        trace_id="0af7651916cd43dd8448eb211c80319c",
        start_time=datetime(2026, 1, 1, tzinfo=UTC),
        query=QUERY,
        answer=answer,
        retrieval=Retrieval(
            chunks=chunks if chunks is not None else (Chunk(id="p1", rank=0, content=CHUNK),)
        ),
    )


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


def config(fake: FakeOpenAI, **overrides: Any) -> JudgeConfig:
    settings: dict[str, Any] = {
        "base_url": fake.base_url,
        "api_key": "test",
        "model": "gpt-4o-mini",
        "backend": "phoenix_evals",
        "backoff_base_s": 0.01,
        "backoff_max_s": 0.02,
        "timeout_s": 2,
        **overrides,
    }
    return JudgeConfig.model_validate(settings)


@pytest.fixture
async def judge(fake: FakeOpenAI) -> AsyncIterator[PhoenixEvalsJudge]:
    fake.reset()
    built = build_judge(config(fake))
    assert isinstance(built, PhoenixEvalsJudge)
    yield built
    await built.aclose()


async def test_faithful_reply_is_one_supported_claim_with_usage_and_the_phoenix_prompt(
    judge: PhoenixEvalsJudge, fake: FakeOpenAI
) -> None:
    fake.script(label("faithful"))
    judgment = await judge.judge(make_trace())
    assert judgment.outcome == "scored"
    assert judgment.faithfulness == 1.0
    assert judgment.claims == (ANSWER,)
    assert judgment.unsupported == ()
    assert judgment.diagnosis == "ok"
    assert judgment.rationale is not None
    assert judgment.rationale.startswith("phoenix_evals/faithfulness: faithful.")
    assert NOT_ASSESSED in judgment.rationale
    assert judgment.judge_version.startswith("phoenix_evals/faithfulness/gpt-4o-mini/")
    (call,) = judgment.calls
    assert (call.status, call.http_status, call.prompt_tokens, call.completion_tokens) == ("ok", 200, 210, 12)
    assert call.cost_usd is not None and call.cost_usd > 0
    (request,) = fake.requests()
    prompt = request["body"]["messages"][-1]["content"]
    assert QUERY in prompt and CHUNK in prompt and ANSWER in prompt
    assert request["body"]["temperature"] == 0


async def test_unfaithful_reply_is_one_unsupported_claim_with_fixed_fields(
    judge: PhoenixEvalsJudge, fake: FakeOpenAI
) -> None:
    fake.script(label("unfaithful", "Mondays are not in the context"))
    judgment = await judge.judge(make_trace())
    assert judgment.faithfulness == 0.0
    assert judgment.unsupported == (0,)
    assert judgment.failure_mode == "fabrication"
    assert judgment.context_sufficient is True
    assert judgment.diagnosis == "generation_failure"
    assert judgment.rationale is not None and "Mondays are not in the context" in judgment.rationale


async def test_a_reply_without_a_valid_label_is_malformed(judge: PhoenixEvalsJudge, fake: FakeOpenAI) -> None:
    fake.script(label("maybe"))
    judgment = await judge.judge(make_trace())
    assert (judgment.outcome, judgment.failure_reason) == ("failed", "malformed")
    assert len(fake.requests()) == 1


async def test_nothing_to_judge_makes_no_call(judge: PhoenixEvalsJudge, fake: FakeOpenAI) -> None:
    assert (await judge.judge(make_trace(answer=" "))).failure_reason == "no_answer"
    no_text = (Chunk(id="p1", rank=0),)
    assert (await judge.judge(make_trace(chunks=no_text))).failure_reason == "no_context"
    assert fake.requests() == []


async def test_server_errors_are_retried_then_unavailable_or_recorded(fake: FakeOpenAI) -> None:
    fake.reset()
    fake.set_default(Reply(status=503))
    judge = PhoenixEvalsJudge(config(fake, max_attempts=3))
    try:
        with pytest.raises(JudgeUnavailable) as raised:
            await judge.judge(make_trace())
        assert raised.value.reason == "server_error"
        assert len(fake.requests()) == 3
    finally:
        await judge.aclose()
    fake.reset()
    fake.set_default(Reply(status=503))
    recording = PhoenixEvalsJudge(config(fake, max_attempts=2, when_unavailable="record"))
    try:
        judgment = await recording.judge(make_trace())
    finally:
        await recording.aclose()
    assert (judgment.outcome, judgment.failure_reason) == ("failed", "server_error")
    assert [c.http_status for c in judgment.calls] == [503, 503]
    fake.reset()


async def test_a_server_error_then_a_verdict_is_one_judgment(fake: FakeOpenAI) -> None:
    fake.reset()
    fake.script(Reply(status=502), label("faithful"))
    judge = PhoenixEvalsJudge(config(fake))
    try:
        judgment = await judge.judge(make_trace())
    finally:
        await judge.aclose()
    assert judgment.faithfulness == 1.0
    assert [c.status for c in judgment.calls] == ["server_error", "ok"]
    assert judgment.calls[1].waited_s > 0


async def test_hallucination_template_reads_grounded_and_hallucinated(fake: FakeOpenAI) -> None:
    fake.reset()
    fake.script(label("hallucinated"), label("grounded"))
    judge = PhoenixEvalsJudge(config(fake, phoenix_template="hallucination"))
    try:
        bad, good = await judge.judge(make_trace()), await judge.judge(make_trace())
    finally:
        await judge.aclose()
    assert (bad.faithfulness, good.faithfulness) == (0.0, 1.0)
    assert bad.judge_version.startswith("phoenix_evals/hallucination/")
    prompt = fake.requests()[0]["body"]["messages"][-1]["content"]
    assert f"User: {QUERY}" in prompt and CHUNK in prompt


def test_the_backend_needs_an_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ValueError, match="phoenix_evals needs an OpenAI-compatible endpoint"):
        build_judge(JudgeConfig(backend="phoenix_evals"))


def test_a_running_ragmon_judges_with_the_backend_it_is_configured_with(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    fake.reset()
    fake.set_default(label("unfaithful", "not in the context"))
    judge = config(fake).model_dump(mode="json") | {"api_key": "test"}
    settings: dict[str, Any] = {
        "assembler": {"grace_s": 0.05},
        "sampler": {"rates": {"base": 1.0}},
        "judging": {"poll_s": 0.05},
        "budget": {"calls_per_minute": 100000, "usd_per_day": 1000},
        "judge": judge,
    }
    records = [
        {
            "trace_id": f"{0xFEED00 + n:032x}",
            "app": "shop",
            "query": QUERY,
            "answer": ANSWER,
            "retrieval": {"chunks": [{"id": "p1", "content": CHUNK}]},
        }
        for n in range(3)
    ]
    with live_server(tmp_path, **settings) as server:
        assert server.pipeline.judge.version.startswith("phoenix_evals/faithfulness/")
        with server.client() as client:
            assert client.post("/api/v1/traces", json={"traces": records}).status_code == 200
        server.flush()
        deadline = time.monotonic() + 30
        while server.metric("ragmon_judge_verdicts_total", app="shop", verdict="unfaithful", judge="llm") < 3:
            assert time.monotonic() < deadline, "judgments did not arrive"
            time.sleep(0.05)
        stored, _ = server.pipeline.judgments.for_trace("default", records[0]["trace_id"])
    assert stored[0]["judge_version"] == server.pipeline.judge.version
    assert stored[0]["faithfulness"] == 0.0
    assert len(fake.requests()) == 3
