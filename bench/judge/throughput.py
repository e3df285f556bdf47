"""Judge throughput and CPU per judgment against a stub that answers after 300 ms, vs bare SDK calls.

Starts tests/fake_openai.py as its own process (so its CPU is not counted),
then in rounds, alternating order, runs N judgments through `LlmJudge` and N
bare `AsyncOpenAI.chat.completions.parse` calls with the same messages,
response format, timeout and connection pool, both at the same concurrency.
Reports judgments/s and client CPU (process time) per judgment for each, and
ragmon's overhead over the bare client's CPU per call (medians over rounds).

The CPU of 64 calls in flight against a server on the same two cores is noisy
(a few percent between rounds), so the overhead is also measured a second way:
both clients call one after another through an in-process transport that hands
back the same canned reply (no network, no server), in alternating rounds.
That isolates exactly what ragmon adds around the SDK call.

    python bench/judge/throughput.py [--n 600] [--concurrency 64] [--rounds 3] [--delay 0.3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
import httpx2
import openai

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from service.config import JudgeConfig  # noqa: E402
from service.judge.judgment import Verdict  # noqa: E402
from service.judge.llm import LlmJudge  # noqa: E402
from service.judge.prompt import build_messages  # noqa: E402
from service.model import Chunk, RagTrace, Retrieval  # noqa: E402

VERDICT = json.dumps(
    {
        "claims": ["Badr Hari is a kickboxer", "Badr Hari is Moroccan-Dutch"],
        "supported": [0, 1],
        "unsupported": [],
        "outcome": "scored",
        "failure_mode": "none",
        "context_sufficient": True,
        "rationale": "Both claims are stated in the context.",
    }
)
CONTEXT = (
    "Badr Hari (born 8 December 1984) is a Moroccan-Dutch super heavyweight kickboxer from Amsterdam, "
    "fighting out of Mike's Gym in Oostzaan. He was once considered the best kickboxer in the world."
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_stub(delay: float) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    # as a module from the repository root: it imports tests/openai_wire.py
    proc = subprocess.Popen([sys.executable, "-m", "tests.fake_openai", "--port", str(port)], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 15
    while True:
        try:
            httpx.get(f"{url}/healthz", timeout=1).raise_for_status()
            break
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.1)
    reply = {"content": VERDICT, "delay_s": delay, "prompt_tokens": 400, "completion_tokens": 60}
    httpx.put(f"{url}/_control/default", json=reply, timeout=5).raise_for_status()
    return proc, f"{url}/v1"


def trace(i: int) -> RagTrace:
    return RagTrace(
        trace_id=f"{i + 1:032x}",
        start_time=datetime(2026, 1, 1, tzinfo=UTC),
        query="Who was once considered the best kickboxer in the world?",
        retrieval=Retrieval(chunks=(Chunk(id="c0", rank=0, content=CONTEXT),)),
        answer="Badr Hari, a Moroccan-Dutch kickboxer.",
    )


async def bare_parse(client: openai.AsyncOpenAI, config: JudgeConfig, t: RagTrace) -> object:
    """The bare SDK call ragmon's judge is compared with: same messages, schema and limits, nothing else."""
    completion = await client.chat.completions.parse(
        model=config.model,
        messages=build_messages(t.query or "", [CONTEXT], t.answer or ""),
        response_format=Verdict,
        temperature=0,
        max_completion_tokens=config.max_completion_tokens,
    )
    return completion.choices[0].message.parsed


async def run(n: int, concurrency: int, one: Callable[[int], Awaitable[object]]) -> tuple[float, float]:
    """(wall seconds, client CPU seconds) for n calls of `one`, at most `concurrency` in flight."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            await one(queue.get_nowait())

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - wall, time.process_time() - cpu


async def bench(base_url: str, n: int, concurrency: int, rounds: int) -> dict[str, list[float]]:
    config = JudgeConfig(base_url=base_url, api_key="bench", model="gpt-4o-mini", max_connections=concurrency)
    judge = LlmJudge(config)
    timeout = httpx2.Timeout(config.timeout_s, connect=config.connect_timeout_s)
    bare = openai.AsyncOpenAI(
        base_url=base_url,
        api_key="bench",
        max_retries=0,
        timeout=timeout,
        http_client=httpx2.AsyncClient(
            timeout=timeout,
            limits=httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
        ),
    )
    traces = [trace(i) for i in range(n)]

    async def ragmon_one(i: int) -> object:
        judgment = await judge.judge(traces[i])
        if judgment.outcome != "scored":
            raise RuntimeError(f"unexpected judgment {judgment.outcome} {judgment.failure_reason}")
        return judgment

    async def bare_one(i: int) -> object:
        return await bare_parse(bare, config, traces[i])

    results: dict[str, list[float]] = {k: [] for k in ("ragmon_rate", "ragmon_cpu", "bare_rate", "bare_cpu")}
    await run(min(n, 100), concurrency, ragmon_one)  # warm up connections and imports
    await run(min(n, 100), concurrency, bare_one)
    for r in range(rounds):
        order = [("ragmon", ragmon_one), ("bare", bare_one)]
        for name, one in order if r % 2 == 0 else order[::-1]:
            wall, cpu = await run(n, concurrency, one)
            results[f"{name}_rate"].append(n / wall)
            results[f"{name}_cpu"].append(cpu / n)
    await judge.aclose()
    await bare.close()
    return results


def canned_transport() -> httpx2.MockTransport:
    """An httpx transport that answers every request with the stub's verdict, without a socket."""
    body = json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt-4o-mini",
            "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": VERDICT}}
            ],
            "usage": {"prompt_tokens": 400, "completion_tokens": 60, "total_tokens": 460},
        }
    ).encode()
    headers = {"content-type": "application/json"}
    return httpx2.MockTransport(lambda request: httpx2.Response(200, content=body, headers=headers))


async def sequential_cpu(n: int, rounds: int) -> dict[str, list[float]]:
    """CPU seconds per call of ragmon's judge and of the bare SDK parse, one call at a time, no network."""
    config = JudgeConfig(base_url="http://canned/v1", api_key="bench", model="gpt-4o-mini")
    sdk = {
        name: openai.AsyncOpenAI(
            base_url=config.base_url,
            api_key="bench",
            max_retries=0,
            http_client=httpx2.AsyncClient(transport=canned_transport()),
        )
        for name in ("ragmon", "bare")
    }
    judge = LlmJudge(config, client=sdk["ragmon"])
    traces = [trace(i) for i in range(n)]

    async def ragmon_one(t: RagTrace) -> object:
        return await judge.judge(t)

    async def bare_one(t: RagTrace) -> object:
        return await bare_parse(sdk["bare"], config, t)

    results: dict[str, list[float]] = {"ragmon": [], "bare": []}
    order = [("ragmon", ragmon_one), ("bare", bare_one)]
    for _, one in order:  # warm up
        for t in traces[:100]:
            await one(t)
    for r in range(rounds):
        for name, one in order if r % 2 == 0 else order[::-1]:
            cpu = time.process_time()
            for t in traces:
                await one(t)
            results[name].append((time.process_time() - cpu) / n)
    for client in sdk.values():
        await client.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--delay", type=float, default=0.3)
    parser.add_argument("--sequential-n", type=int, default=1000, help="calls a round, no-network check")
    parser.add_argument("--sequential-rounds", type=int, default=6)
    args = parser.parse_args()
    proc, base_url = start_stub(args.delay)
    try:
        res = asyncio.run(bench(base_url, args.n, args.concurrency, args.rounds))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    med = {k: statistics.median(v) for k, v in res.items()}
    overhead = (med["ragmon_cpu"] - med["bare_cpu"]) / med["bare_cpu"]
    setup = f"stub delay {args.delay * 1e3:.0f} ms, concurrency {args.concurrency}, n {args.n}"
    print(f"{setup}, rounds {args.rounds}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    ragmon_cpu_ms = med["ragmon_cpu"] * 1e3
    print(f"ragmon LlmJudge : {med['ragmon_rate']:7.1f} judgments/s, CPU {ragmon_cpu_ms:.2f} ms/judgment")
    print(f"bare SDK parse  : {med['bare_rate']:7.1f} calls/s,     CPU {med['bare_cpu'] * 1e3:.2f} ms/call")
    print(f"ragmon CPU overhead over the bare client: {overhead * 100:+.1f} %")
    print("per round:", {k: [round(x, 5) for x in v] for k, v in res.items()})
    seq = asyncio.run(sequential_cpu(args.sequential_n, args.sequential_rounds))
    ours, bare_cpu = statistics.median(seq["ragmon"]), statistics.median(seq["bare"])
    setup = f"{args.sequential_n} calls x {args.sequential_rounds} rounds"
    overhead = (ours - bare_cpu) / bare_cpu
    print(
        f"one call at a time, in-process transport ({setup}): "
        f"ragmon {ours * 1e3:.2f} ms, bare {bare_cpu * 1e3:.2f} ms, overhead {overhead * 100:+.1f} %"
    )
    print("per round:", {k: [round(x * 1e3, 3) for x in v] for k, v in seq.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
