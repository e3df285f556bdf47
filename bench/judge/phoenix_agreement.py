"""How ragmon's claim-level judge and the Phoenix evals backend agree on HaluEval QA, through a stub model.

PLUMBING ONLY. No real model is called: a local OpenAI-compatible stub (this
script's `stub` command, run as its own process) plays the model for both
judges. For every request it finds the row in the prompt, asks ragmon's
offline heuristic judge about it, and answers in the format the prompt asks
for: ragmon's claim-level verdict JSON (claims, partition, failure mode) or
Phoenix's `{"label": faithful|unfaithful, "explanation"}`. Both judges thus
receive the same decision, and what is measured is everything around it:
prompt building, structured output, parsing and the mapping onto ragmon's
`Judgment` (Phoenix's whole-answer label vs ragmon's claim partition). It
says nothing about how two real LLM judges would agree; run the same script
with `--base-url` at a real endpoint for that (`--no-stub`).

    python bench/judge/phoenix_agreement.py [--rows 2000] [--concurrency 32] [--json out.json]
    python bench/judge/phoenix_agreement.py --no-stub --base-url https://api.openai.com/v1 --rows 200

Reports, per judge: judged-faithful rate, balanced accuracy against the gold
label, calls, prompt characters and client CPU per judgment; between them:
agreement and Cohen's kappa on the faithful/unfaithful decision, with 95 %
Wilson and bootstrap intervals.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import json
import os
import re
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from scipy.stats import norm

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from service.config import JudgeConfig  # noqa: E402
from service.judge.build import build_judge  # noqa: E402
from service.judge.heuristic import HeuristicJudge  # noqa: E402
from service.judge.judgment import Judge, Judgment  # noqa: E402
from service.judge.prompt import DATA_CLOSE, DATA_OPEN  # noqa: E402
from service.model import Chunk, RagTrace, Retrieval  # noqa: E402

DATA = (
    Path(os.environ.get("RAGMON_SHARED_DATA") or ROOT / ".." / "shared" / "data")
    / "faithfulness"
    / "halueval_qa_dev.jsonl"
)


def load_rows(limit: int) -> list[dict[str, Any]]:
    if not DATA.exists():
        raise SystemExit(f"{DATA} not found (set RAGMON_SHARED_DATA)")
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines() if line.strip()]
    return rows[:limit]


def trace_of(index: int, row: dict[str, Any]) -> RagTrace:
    return RagTrace(
        trace_id=f"{index + 1:032x}",
        start_time=datetime(2026, 1, 1, tzinfo=UTC),
        query=row["question"],
        answer=row["answer"],
        retrieval=Retrieval(
            chunks=tuple(Chunk(id=f"c{i}", rank=i, content=c) for i, c in enumerate(row["contexts"]))
        ),
    )


# ---- the stub model (its own process) ---------------------------------------------------------------


def _key(question: str, answer: str) -> tuple[str, str]:
    return (" ".join(html.unescape(question).split()), " ".join(html.unescape(answer).split()))


def _between(text: str, start: str, end: str) -> str | None:
    match = re.search(re.escape(start) + r"\s*(.*?)\s*" + re.escape(end), text, re.S)
    return match.group(1) if match else None


def serve_stub(port: int, rows: int) -> None:
    data = load_rows(rows)
    by_key = {_key(r["question"], r["answer"]): trace_of(i, r) for i, r in enumerate(data)}
    heuristic = HeuristicJudge()
    decided: dict[tuple[str, str], Judgment] = {}
    app = FastAPI()

    async def decide(key: tuple[str, str]) -> Judgment:
        if key not in decided:
            decided[key] = await heuristic.judge(by_key[key])
        return decided[key]

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        # the data is in the last (user) message; ragmon's system message names the tags too
        prompt = str(body["messages"][-1].get("content") or "")
        block = _between(prompt, DATA_OPEN, DATA_CLOSE)
        if block is not None and block.lstrip().startswith("{"):
            fields = json.loads(block)
            judgment = await decide(_key(fields["question"], fields["answer"]))
            content = json.dumps(
                {
                    "claims": list(judgment.claims),
                    "supported": list(judgment.supported),
                    "unsupported": list(judgment.unsupported),
                    "outcome": judgment.outcome if judgment.outcome != "failed" else "no_claims",
                    "failure_mode": judgment.failure_mode or "none",
                    "context_sufficient": bool(judgment.context_sufficient),
                    "rationale": judgment.rationale or "",
                }
            )
        else:
            query, answer = (
                _between(prompt, "<query>", "</query>"),
                _between(prompt, "<response>", "</response>"),
            )
            if query is None or answer is None:
                raise ValueError("prompt is neither ragmon's nor Phoenix's faithfulness template")
            judgment = await decide(_key(query, answer))
            content = json.dumps(
                {
                    "explanation": judgment.rationale or "",
                    "label": "unfaithful" if judgment.unsupported else "faithful",
                }
            )
        prompt_chars = sum(len(str(m.get("content") or "")) for m in body["messages"])
        prompt_chars += len(json.dumps(body.get("response_format") or body.get("tools") or ""))
        return {
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "stub"),
            "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}
            ],
            # characters, not tokens: the stub has no tokenizer; the report says so
            "usage": {"prompt_tokens": prompt_chars, "completion_tokens": len(content), "total_tokens": 0},
        }

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# ---- the measurement ----------------------------------------------------------------------------------


def wilson(k: int, n: int) -> tuple[float, float]:
    if n == 0:
        return (float("nan"), float("nan"))
    z = float(norm.ppf(0.975))
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n)
    return (centre - half, centre + half)


def kappa(a: np.ndarray, b: np.ndarray) -> float:
    observed = float(np.mean(a == b))
    pa, pb = float(np.mean(a)), float(np.mean(b))
    expected = pa * pb + (1 - pa) * (1 - pb)
    return (observed - expected) / (1 - expected) if expected < 1 else 1.0


def balanced_accuracy(pred: np.ndarray, gold: np.ndarray) -> float:
    return float((np.mean(pred[gold]) + np.mean(~pred[~gold])) / 2)


def faithful_of(judgment: Judgment) -> bool | None:
    """The faithful/unfaithful decision; None for a failed judgment. No claims counts as faithful."""
    if judgment.outcome == "failed":
        return None
    return not judgment.unsupported


async def run_judge(judge: Judge, traces: list[RagTrace], concurrency: int) -> tuple[list[Judgment], float]:
    gate = asyncio.Semaphore(concurrency)

    async def one(trace: RagTrace) -> Judgment:
        async with gate:
            return await judge.judge(trace)

    cpu = time.process_time()
    results = await asyncio.gather(*(one(t) for t in traces))
    return list(results), time.process_time() - cpu


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    rows = load_rows(args.rows)
    traces = [trace_of(i, r) for i, r in enumerate(rows)]
    gold = np.array([bool(r["label_faithful"]) for r in rows])
    common = {
        "base_url": args.base_url,
        "model": args.model,
        "timeout_s": 60,
        "max_connections": args.concurrency,
    }
    if args.api_key:
        common["api_key"] = args.api_key
    judges = {
        "ragmon": build_judge(
            JudgeConfig.model_validate({**common, "backend": "ragmon", "api_key": args.api_key or "stub"})
        ),
        "phoenix_evals": build_judge(
            JudgeConfig.model_validate(
                {**common, "backend": "phoenix_evals", "api_key": args.api_key or "stub"}
            )
        ),
    }
    report: dict[str, Any] = {"rows": len(rows), "stub": not args.no_stub, "model": args.model, "judges": {}}
    decisions: dict[str, list[bool | None]] = {}
    for name, judge in judges.items():
        judgments, cpu_s = await run_judge(judge, traces, args.concurrency)
        await judge.aclose()
        decided = [faithful_of(j) for j in judgments]
        decisions[name] = decided
        ok = np.array([d is not None for d in decided])
        pred = np.array([bool(d) for d in decided])
        calls = [len(j.calls) for j in judgments]
        prompt = [j.prompt_tokens for j in judgments]
        report["judges"][name] = {
            "version": judge.version,
            "failed": int((~ok).sum()),
            "no_claims": sum(j.outcome == "no_claims" for j in judgments),
            "judged_faithful_rate": float(pred[ok].mean()),
            "balanced_accuracy_vs_gold": balanced_accuracy(pred[ok], gold[ok]),
            "calls_per_judgment": float(np.mean(calls)),
            "prompt_chars_per_judgment" if not args.no_stub else "prompt_tokens_per_judgment": float(
                np.mean(prompt)
            ),
            "client_cpu_ms_per_judgment": 1000 * cpu_s / len(traces),
        }
    both = np.array([a is not None and b is not None for a, b in zip(*decisions.values(), strict=True)])
    a = np.array([bool(x) for x in decisions["ragmon"]])[both]
    b = np.array([bool(x) for x in decisions["phoenix_evals"]])[both]
    agree = int((a == b).sum())
    rng = np.random.default_rng(0)
    boot = []
    for _ in range(args.boot):
        idx = rng.integers(0, len(a), len(a))
        boot.append(kappa(a[idx], b[idx]))
    report["agreement"] = {
        "rows_both_decided": int(both.sum()),
        "agreement": agree / len(a),
        "agreement_wilson_95": wilson(agree, len(a)),
        "cohen_kappa": kappa(a, b),
        "cohen_kappa_bootstrap_95": (float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))),
        "ragmon_faithful_phoenix_unfaithful": int((a & ~b).sum()),
        "ragmon_unfaithful_phoenix_faithful": int((~a & b).sum()),
    }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command")
    stub = sub.add_parser("stub", help="run the stub model (started by the measurement)")
    stub.add_argument("--port", type=int, required=True)
    stub.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--boot", type=int, default=2000)
    parser.add_argument("--model", default="gpt-4o-mini")
    parser.add_argument("--base-url", default=None)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--no-stub", action="store_true", help="judge through --base-url (a real model)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.command == "stub":
        serve_stub(args.port, args.rows)
        return
    process = None
    if not args.no_stub:
        port = free_port()
        process = subprocess.Popen(
            [sys.executable, __file__, "stub", "--port", str(port), "--rows", str(args.rows)]
        )
        args.base_url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/docs", timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise SystemExit("stub did not start") from None
                time.sleep(0.2)
    elif not args.base_url:
        parser.error("--no-stub needs --base-url")
    try:
        report = asyncio.run(measure(args))
    finally:
        if process is not None:
            process.terminate()
            process.wait(10)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
