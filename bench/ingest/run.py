"""Ingest benchmark: ragmon vs Arize Phoenix on identical OTLP protobuf RAG traces, same machine, same run.

For each server, started fresh on loopback with its default SQLite storage:

* closed loop: `--concurrency` senders post bodies of 100 traces (4 spans
  each: chain, embedding, retriever with 5 documents of ~500 characters, LLM)
  back to back; a 503 is retried after its Retry-After. Prints accepted
  traces/s (all answered 2xx), persisted traces/s (every trace queryable in
  the server's SQLite file: ragmon's `traces` rows, Phoenix's `spans` rows / 4),
  p50/p99 request latency and peak RSS of the server's process tree;
* then the ratios ragmon / Phoenix;
* and ragmon again with the write-ahead log off (`wal.ack=received`): what the durable
  acknowledgement (log + fsync before every 200) costs, as a ratio.

Then, for ragmon alone (fresh server): open loop at 80 % of its persisted rate
for `--open-seconds` (requests start on a fixed schedule whatever the answers;
latency is counted from the scheduled start, so a stall is not hidden), and
with `--long`, RSS after 10k and after 200k traces.

Phoenix must be installed in its own venv (default /tmp/bench-phoenix):
    python3 -m venv /tmp/bench-phoenix && /tmp/bench-phoenix/bin/pip install arize-phoenix

    python bench/ingest/run.py [--traces 20000] [--phoenix-traces 2000] [--dim 256] [--long] [--json out.json]

To measure a commit while the working tree changes under you:
    git archive HEAD | tar -x -C /tmp/ragmon-src && python bench/ingest/run.py --ragmon-src /tmp/ragmon-src
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
from scipy.stats import binom

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.ingest.payload import Batches
from bench.ingest.servers import REPO, Phoenix, Ragmon, Server

HEADERS = {"Content-Type": "application/x-protobuf"}


@dataclass
class LoadResult:
    """What one load phase measured against one server."""

    server: str
    traces: int
    requests: int = 0
    retried_503: int = 0
    failed: int = 0
    send_s: float = 0.0
    persist_s: float | None = None
    persisted: int = 0
    latencies_s: list[float] = field(default_factory=list, repr=False)
    peak_rss_bytes: int = 0
    startup_s: float = 0.0
    server_cpu_s: float | None = None
    load_avg_1m: tuple[float, float] = (0.0, 0.0)
    timeline: list[tuple[float, int]] = field(default_factory=list, repr=False)
    # (seconds from start, bytes), about 200 samples: shows a plateau from a slope
    rss_timeline: list[tuple[float, int]] = field(default_factory=list, repr=False)

    @property
    def accepted_per_s(self) -> float:
        return self.traces / self.send_s if self.send_s else 0.0

    @property
    def persisted_per_s(self) -> float | None:
        return self.traces / self.persist_s if self.persist_s else None

    @property
    def cpu_ms_per_trace(self) -> float | None:
        return self.server_cpu_s / self.traces * 1000 if self.server_cpu_s is not None else None

    def latency_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_s, q) * 1000) if self.latencies_s else float("nan")

    def latency_ci_ms(self, q: float, confidence: float = 0.95) -> tuple[float, float | None]:
        """Distribution-free interval for the q-th latency percentile: the order statistics whose
        ranks cover it with `confidence` (binomial). A p99 of 150 requests is about the second
        slowest and pins little down; this says how little. Upper None: beyond the slowest seen."""
        ordered = sorted(self.latencies_s)
        n = len(ordered)
        if not n:
            return float("nan"), None
        tail = (1 - confidence) / 2
        low_rank = int(binom.ppf(tail, n, q / 100))  # X(low_rank) is below the percentile
        high_rank = int(binom.ppf(1 - tail, n, q / 100)) + 1  # X(high_rank) is above it
        low = ordered[max(low_rank, 1) - 1] * 1000
        return low, (ordered[high_rank - 1] * 1000 if high_rank <= n else None)

    def summary(self) -> dict[str, object]:
        out = {k: v for k, v in asdict(self).items() if k != "latencies_s"}
        out |= {
            "cpu_ms_per_trace": self.cpu_ms_per_trace,
            "accepted_per_s": self.accepted_per_s,
            "persisted_per_s": self.persisted_per_s,
            "p50_ms": self.latency_ms(50),
            "p99_ms": self.latency_ms(99),
            "p99_ci_ms": self.latency_ci_ms(99),
            "requests_timed": len(self.latencies_s),
        }
        return out


class PersistWatch:
    """Polls a server's persisted count in a thread; records when it first reaches each milestone."""

    def __init__(self, server: Server, milestones: Iterable[int], interval_s: float = 0.2) -> None:
        self.server = server
        self.pending = sorted(milestones)
        self.reached: dict[int, tuple[float, int]] = {}  # milestone -> (monotonic time, RSS then)
        self.cpu_at: dict[int, float] = {}  # milestone -> server CPU seconds then
        self.timeline: list[tuple[float, int]] = []
        self.cpu_start = server.rss.cpu_seconds() if server.rss else 0.0
        self.last = 0
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set() and self.pending:
            self.last = self.server.persisted()
            now = time.monotonic()
            if not self.timeline or self.timeline[-1][1] != self.last:
                self.timeline.append((now, self.last))
            while self.pending and self.last >= self.pending[0]:
                sampler = self.server.rss
                milestone = self.pending.pop(0)
                self.reached[milestone] = (now, sampler.current() if sampler else 0)
                self.cpu_at[milestone] = (sampler.cpu_seconds() if sampler else 0.0) - self.cpu_start
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PersistWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def wait(self, timeout_s: float) -> bool:
        self._thread.join(timeout_s)
        return not self.pending


async def _post(client: httpx.AsyncClient, body: bytes, result: LoadResult, scheduled: float | None) -> None:
    while True:
        started = time.monotonic()
        try:
            response = await client.post("/v1/traces", content=body, headers=HEADERS)
        except httpx.HTTPError:
            result.failed += 1
            return
        result.latencies_s.append(time.monotonic() - (scheduled if scheduled is not None else started))
        result.requests += 1
        if response.status_code == 503:
            result.retried_503 += 1
            await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
            scheduled = None
            continue
        if not response.is_success:
            result.failed += 1
        return


async def closed_loop(url: str, bodies: Iterator[bytes], concurrency: int, result: LoadResult) -> float:
    """Posts every body with `concurrency` back-to-back senders; returns the monotonic start time."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        t0 = time.monotonic()

        async def sender() -> None:
            for body in bodies:  # one shared iterator: each body is taken by exactly one sender
                await _post(client, body, result, None)

        await asyncio.gather(*(sender() for _ in range(concurrency)))
        result.send_s = time.monotonic() - t0
    return t0


async def open_loop(url: str, bodies: list[bytes], interval_s: float, result: LoadResult) -> float:
    """Starts one request every `interval_s` regardless of answers; latency counts from the schedule."""
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        t0 = time.monotonic() + 0.2
        tasks = []
        for k, body in enumerate(bodies):
            at = t0 + k * interval_s
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            tasks.append(asyncio.create_task(_post(client, body, result, at)))
        await asyncio.gather(*tasks)
        result.send_s = time.monotonic() - t0
    return t0


def run_phase(
    server: Server,
    result: LoadResult,
    send: Callable[[], Coroutine[Any, Any, float]],
    persist_timeout_s: float,
    milestones: Iterable[int] = (),
) -> PersistWatch:
    """Runs one load phase and fills `result`: persistence time, server CPU, peak RSS, machine load."""
    result.startup_s = server.startup_s
    load_before = os.getloadavg()[0]
    with PersistWatch(server, {*milestones, result.traces}) as watch:
        t0 = asyncio.run(send())
        done = watch.wait(max(0.0, t0 + persist_timeout_s - time.monotonic()))
    result.persisted = server.persisted()
    if done:
        result.persist_s = watch.reached[result.traces][0] - t0
        result.server_cpu_s = watch.cpu_at[result.traces]
    result.peak_rss_bytes = server.rss.peak_bytes if server.rss else 0
    result.timeline = [(round(t - t0, 2), n) for t, n in watch.timeline]
    if server.rss:
        samples = [(at, rss) for at, rss in server.rss.samples if at >= t0]
        step = max(1, len(samples) // 200)
        result.rss_timeline = [(round(at - t0, 1), rss) for at, rss in samples[::step]]
    result.load_avg_1m = (load_before, os.getloadavg()[0])
    return watch


def _mb(n: float) -> str:
    return f"{n / 2**20:.0f} MB"


def _row(r: LoadResult) -> str:
    persisted = f"{r.persisted_per_s:,.0f}" if r.persisted_per_s else f"timeout ({r.persisted}/{r.traces})"
    cpu = f"{r.cpu_ms_per_trace:.1f}" if r.cpu_ms_per_trace is not None else "-"
    low, high = r.latency_ci_ms(99)
    p99 = f"{r.latency_ms(99):.0f} [{low:.0f}, {f'{high:.0f}' if high is not None else 'max'}]"
    return (
        f"| {r.server} | {r.traces:,} | {r.accepted_per_s:,.0f} | {persisted} | {r.latency_ms(50):.0f} | "
        f"{p99} | {_mb(r.peak_rss_bytes)} | {cpu} | {r.retried_503} | {r.failed} | "
        f"{r.load_avg_1m[0]:.1f}/{r.load_avg_1m[1]:.1f} |"
    )


TABLE_HEAD = (
    "| server | traces | accepted traces/s | persisted traces/s | p50 ms | p99 ms [95 % CI] | peak RSS "
    "| server CPU ms/trace | 503s | failed | load 1m before/after |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
)


def _revision(source: Path | None) -> str:
    """The commit the working tree is on, and whether service/ has uncommitted changes (what really ran)."""
    if source is not None:
        return f"source tree {source}"

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    dirty = git("status", "--porcelain", "--", "service")
    return git("rev-parse", "--short", "HEAD") + (" + uncommitted changes in service/" if dirty else "")


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add = parser.add_argument
    add("--traces", type=int, default=20_000, help="traces sent to ragmon (closed loop)")
    add("--phoenix-traces", type=int, default=2_000, help="traces sent to Phoenix (the same first N)")
    add("--concurrency", type=int, default=4, help="closed-loop senders")
    add(
        "--dim",
        type=int,
        default=256,
        help="numbers in each trace's query vector (1,536: OpenAI text-embedding-3-small)",
    )
    # 180 s is ~1,300 requests at ragmon's rate: a p99 from the 60 s used before (~440 requests,
    # the 5th slowest) had a 95 % interval as wide as [87, 134] ms, too wide to say which side
    # of 100 ms it is on
    add("--open-seconds", type=float, default=180.0, help="length of the open-loop phase")
    add("--open-fraction", type=float, default=0.8, help="open-loop rate / ragmon's persisted rate")
    add("--long", action="store_true", help="also RSS of ragmon after 10k and after --long-traces traces")
    add("--long-traces", type=int, default=200_000)
    add("--persist-timeout", type=float, default=900.0, help="seconds to wait for persistence, per phase")
    add("--phoenix", type=Path, default=Path("/tmp/bench-phoenix/bin/phoenix"), help="Phoenix executable")
    add("--ragmon-src", type=Path, help="run ragmon from this source tree (e.g. a `git archive` of a commit)")
    add("--skip-phoenix", action="store_true", help="measure ragmon only (no ratios)")
    add("--skip-no-log", action="store_true", help="skip the run without the write-ahead log")
    add("--skip-open-loop", action="store_true", help="skip the open-loop phase")
    add(
        "--ragmon-setting",
        action="append",
        default=[],
        metavar="RAGMON_X=Y",
        help="an environment setting for every ragmon server started (repeatable)",
    )
    add("--json", type=Path, help="write every result here as JSON")
    args = parser.parse_args(argv)
    per_request = 100
    settings = dict(s.split("=", 1) for s in args.ragmon_setting)
    for name in ("traces", "phoenix_traces", "long_traces"):
        if getattr(args, name) % per_request or getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be a positive multiple of {per_request}")
    if not args.skip_phoenix and not args.phoenix.exists():
        parser.error(f"{args.phoenix} not found; install Phoenix in its own venv (see the module docstring)")

    print("command: python bench/ingest/run.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    print(f"machine: {os.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB")
    revision = _revision(args.ragmon_src)
    print(f"ragmon: {revision}")
    out: dict[str, object] = {"argv": sys.argv[1:], "revision": revision}
    results: list[LoadResult] = []
    ratios: dict[str, float | None] = {}
    durable_cost: dict[str, float | None] = {}
    long_rss: dict[str, float | None] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="ragmon-bench-") as tmp:
            root = Path(tmp)
            batches = Batches(seed=1, traces_per_request=per_request, dim=args.dim)

            def closed(
                server: Server, traces: int, bodies: Iterator[bytes], result: LoadResult
            ) -> PersistWatch:
                return run_phase(
                    server,
                    result,
                    lambda: closed_loop(server.url, bodies, args.concurrency, result),
                    args.persist_timeout,
                    [10_000] if traces > 10_000 else [],
                )

            print(f"ragmon: {args.traces:,} traces, closed loop x{args.concurrency} ...", flush=True)
            ragmon = LoadResult(server="ragmon", traces=args.traces)
            with Ragmon(root / "ragmon", root, args.ragmon_src, settings) as server:
                closed(server, args.traces, iter(list(batches.bodies(args.traces // per_request))), ragmon)
            results.append(ragmon)
            if not args.skip_no_log:
                # the durable path's cost: the same traffic with the write-ahead log off (wal.ack=received)
                print(f"ragmon without the write-ahead log: {args.traces:,} traces ...", flush=True)
                no_log = LoadResult(server="ragmon ack=received", traces=args.traces)
                no_log_settings = {**settings, "RAGMON_WAL__ACK": "received"}
                with Ragmon(root / "ragmon-no-log", root, args.ragmon_src, no_log_settings) as server:
                    closed(
                        server, args.traces, iter(list(batches.bodies(args.traces // per_request))), no_log
                    )
                results.append(no_log)
                out["durable_vs_received"] = durable_cost = {
                    "persisted_per_s": _ratio(ragmon.persisted_per_s, no_log.persisted_per_s),
                    "accepted_per_s": _ratio(ragmon.accepted_per_s, no_log.accepted_per_s),
                    "p99_latency": _ratio(ragmon.latency_ms(99), no_log.latency_ms(99)),
                    "cpu_per_trace": _ratio(ragmon.cpu_ms_per_trace, no_log.cpu_ms_per_trace),
                }
            phoenix = None
            if not args.skip_phoenix:
                print(
                    f"phoenix: {args.phoenix_traces:,} traces, closed loop x{args.concurrency} ...",
                    flush=True,
                )
                phoenix = LoadResult(server="phoenix", traces=args.phoenix_traces)
                with Phoenix(root / "phoenix", root, args.phoenix) as server:
                    bodies = iter(list(batches.bodies(args.phoenix_traces // per_request)))
                    closed(server, args.phoenix_traces, bodies, phoenix)
                results.append(phoenix)
                out["ratios"] = ratios = {
                    "accepted_per_s": _ratio(ragmon.accepted_per_s, phoenix.accepted_per_s),
                    "persisted_per_s": _ratio(ragmon.persisted_per_s, phoenix.persisted_per_s),
                    "p50_latency": _ratio(ragmon.latency_ms(50), phoenix.latency_ms(50)),
                    "p99_latency": _ratio(ragmon.latency_ms(99), phoenix.latency_ms(99)),
                    "peak_rss": _ratio(ragmon.peak_rss_bytes, phoenix.peak_rss_bytes),
                    "cpu_per_trace": _ratio(ragmon.cpu_ms_per_trace, phoenix.cpu_ms_per_trace),
                }

            if not args.skip_open_loop:
                rate = (ragmon.persisted_per_s or ragmon.accepted_per_s) * args.open_fraction
                n_open = max(1, round(args.open_seconds * rate / per_request))
                print(f"ragmon: open loop at {rate:,.0f} per s ({args.open_fraction:.0%}), {n_open} requests")
                opened = LoadResult(server=f"ragmon open loop {rate:,.0f}/s", traces=n_open * per_request)
                open_batches = Batches(seed=2, traces_per_request=per_request, dim=args.dim)
                open_bodies = list(open_batches.bodies(n_open))
                with Ragmon(root / "ragmon-open", root, args.ragmon_src, settings) as server:
                    run_phase(
                        server,
                        opened,
                        lambda: open_loop(server.url, open_bodies, per_request / rate, opened),
                        args.persist_timeout,
                    )
                results.append(opened)
                out["open_loop_target_per_s"] = rate

            if args.long:
                print(f"ragmon: long run, {args.long_traces:,} traces ...", flush=True)
                long = LoadResult(server="ragmon long", traces=args.long_traces)
                long_bodies = Batches(seed=3, traces_per_request=per_request, dim=args.dim).bodies(
                    args.long_traces // per_request
                )
                with Ragmon(root / "ragmon-long", root, args.ragmon_src, settings) as server:
                    watch = closed(server, args.long_traces, long_bodies, long)
                    at_10k = watch.reached.get(10_000, (0.0, 0))
                    sampler = server.rss
                    peak_after = sampler.peak_since(at_10k[0]) if sampler and at_10k[0] else 0
                results.append(long)
                out["long"] = long_rss = {
                    "rss_at_10k_bytes": at_10k[1],
                    "rss_at_end_bytes": watch.reached.get(args.long_traces, (0.0, 0))[1],
                    "peak_rss_after_10k_bytes": peak_after,
                    "growth": peak_after / at_10k[1] if at_10k[1] else None,
                }

    finally:
        # report whatever finished, also when a later phase failed
        print("\n" + TABLE_HEAD)
        for r in results:
            print(_row(r))
        if ratios:
            print(
                "\nragmon / phoenix: "
                + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items() if v is not None)
            )
        if durable_cost:
            print(
                "\nragmon durable (write-ahead log, fsync) / ack=received: "
                + ", ".join(f"{k} {v:.2f}x" for k, v in durable_cost.items() if v is not None)
            )
        if long_rss:
            print(
                f"\nragmon RSS after 10k traces {_mb(long_rss['rss_at_10k_bytes'] or 0)}, "
                f"after {args.long_traces:,} {_mb(long_rss['rss_at_end_bytes'] or 0)}, "
                f"peak after 10k {_mb(long_rss['peak_rss_after_10k_bytes'] or 0)} "
                f"({long_rss['growth'] or float('nan'):.2f}x the 10k value)"
            )
        out["results"] = [r.summary() for r in results]
        if args.json:
            args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
