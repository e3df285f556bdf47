"""The LLM judge pointed at a local OpenAI-compatible model server (Ollama, vLLM, llama.cpp's server):
no key, no internet, a real HTTP server on loopback (tests/local_model.py) that judges the data it
is sent. One honours `response_format` (json_schema) and validates its reply against the schema the
judge sent; one ignores it and answers in prose; one ignores it but writes the JSON in a code fence.
The judge parses the first and third, and records the second as a counted failure, never a score.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from service.config import JudgeConfig
from service.judge.build import build_judge
from service.judge.judgment import Judgment
from service.judge.llm import LlmJudge
from service.model import Chunk, RagTrace, Retrieval
from tests.live_server import LiveServer, live_server
from tests.local_model import LocalModel, Mode

LOCAL_MODEL = "llama3.1:8b"  # an Ollama-style name: no price in the table, so no cost
CONTEXT = "Refunds are possible within 30 days of delivery. Shipping costs 5 euros."
ANSWER = "Refunds are possible within 30 days. Shipping is free for members."


@pytest.fixture
def no_openai_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "RAGMON_JUDGE_MODEL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def local() -> Iterator[LocalModel]:
    with LocalModel() as model:
        yield model


def trace(n: int = 1) -> RagTrace:
    return RagTrace(
        trace_id=f"{0xABC000 + n:032x}",
        app="shop",
        start_time=datetime(2026, 1, 1, tzinfo=UTC),
        query="What is the refund policy?",
        retrieval=Retrieval(chunks=(Chunk(id="policy", rank=0, content=CONTEXT),)),
        answer=ANSWER,
    )


async def judge_once(local: LocalModel, mode: Mode) -> Judgment:
    local.set_mode(mode)
    judge = build_judge(
        JudgeConfig(base_url=local.base_url, model=LOCAL_MODEL, backoff_base_s=0.01, backoff_max_s=0.02)
    )
    assert isinstance(judge, LlmJudge)  # a base_url alone selects the LLM judge, no key needed
    try:
        return await judge.judge(trace())
    finally:
        await judge.aclose()


@pytest.mark.usefixtures("no_openai_env")
async def test_a_local_server_honouring_the_schema_gives_a_parsed_verdict(local: LocalModel) -> None:
    judgment = await judge_once(local, "structured")

    assert judgment.outcome == "scored" and judgment.failure_reason is None
    assert judgment.claims == ("Refunds are possible within 30 days.", "Shipping is free for members.")
    assert judgment.supported == (0,) and judgment.unsupported == (1,)
    assert judgment.faithfulness == 0.5 and judgment.failure_mode == "fabrication"
    assert judgment.judge_model == LOCAL_MODEL and judgment.judge_version.startswith(f"llm/{LOCAL_MODEL}/")
    assert [c.status for c in judgment.calls] == ["ok"]
    assert judgment.prompt_tokens is not None and judgment.cost_usd is None  # local: no price
    assert local.validated == 1  # the reply was checked against the schema the judge sent
    (request,) = local.requests()
    assert request["response_format"]["type"] == "json_schema"
    assert request["response_format"]["json_schema"]["strict"] is True
    assert request["model"] == LOCAL_MODEL and request["temperature"] == 0


@pytest.mark.usefixtures("no_openai_env")
async def test_a_server_ignoring_the_schema_with_prose_is_a_failure_not_a_score(local: LocalModel) -> None:
    judgment = await judge_once(local, "prose")

    assert judgment.outcome == "failed" and judgment.failure_reason == "malformed"
    assert judgment.faithfulness is None and judgment.claims == ()
    assert not judgment.retryable
    # retried once at once (max_invalid_replies = 2), each call recorded with its tokens
    assert [c.status for c in judgment.calls] == ["malformed", "malformed"]
    assert all(c.prompt_tokens is not None for c in judgment.calls)
    assert len(local.requests()) == 2 and local.validated == 0


@pytest.mark.usefixtures("no_openai_env")
async def test_a_server_ignoring_the_schema_with_fenced_json_is_parsed(local: LocalModel) -> None:
    judgment = await judge_once(local, "fenced")

    assert judgment.outcome == "scored"
    assert judgment.supported == (0,) and judgment.unsupported == (1,)
    assert [c.status for c in judgment.calls] == ["ok"]
    assert len(local.requests()) == 1


def _wait(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def _send(server: LiveServer, first: int, n: int) -> None:
    records = [
        {
            "trace_id": f"{0xC0DE0000 + first + i:032x}",
            "app": "local-app",
            "query": "What is the refund policy?",
            "answer": ANSWER,
            "retrieval": {"chunks": [{"id": "policy", "score": 0.9, "content": CONTEXT}]},
        }
        for i in range(n)
    ]
    with server.client() as client:
        assert client.post("/api/v1/traces", json={"traces": records}).status_code == 200
    server.flush()


@pytest.mark.usefixtures("no_openai_env")
def test_the_service_counts_prose_replies_as_failures_and_scores_structured_ones(
    tmp_path: Path, local: LocalModel
) -> None:
    settings: dict[str, Any] = {
        "assembler": {"grace_s": 0.05},
        "sampler": {"rates": {"base": 1.0}},
        "judging": {"poll_s": 0.05, "estimate_every_s": 0.2, "concurrency": 1, "batch_size": 1},
        "budget": {"calls_per_minute": 100000, "usd_per_day": 1000},
        "judge": {"base_url": local.base_url, "model": LOCAL_MODEL, "backoff_base_s": 0.01, "timeout_s": 5},
    }
    local.set_mode("prose")
    with live_server(tmp_path, **settings) as server:

        def verdicts(v: str) -> float:
            return server.metric("ragmon_judge_verdicts_total", app="local-app", verdict=v, judge="llm")

        _send(server, 0, 3)
        _wait(lambda: verdicts("failed") == 3)
        assert server.metric("ragmon_judge_failures_total", reason="malformed") == 3
        assert len(local.requests()) == 6  # two replies a trace, then a recorded failure
        with server.client() as client:
            stored = client.get(f"/api/v1/traces/{0xC0DE0000:032x}").json()["judgments"][0]
        assert stored["outcome"] == "failed" and stored["faithfulness"] is None

        local.set_mode("structured")
        _send(server, 10, 2)
        _wait(lambda: verdicts("unfaithful") == 2)
        assert verdicts("faithful") == 0 and verdicts("failed") == 3
        assert local.validated == 2
        _wait(
            lambda: (
                server.metric("ragmon_faithfulness_sample_size", app="local-app", release="all", intent="all")
                == 2
            )
        )
    assert all(b["model"] == LOCAL_MODEL and b["temperature"] == 0 for b in local.requests())
