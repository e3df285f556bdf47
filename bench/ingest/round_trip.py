"""Micro-benchmark: a decode round trip to a worker process, three ways of getting there.

A request's body goes to a decoder process and its spans come back (service/ingest/pool.py).
This sends one real bench body (`payload.Batches`: 100 traces, ~750 KB) to a decoder
(`_decode_packed`, what the server calls) from an asyncio event loop, as the server does, and
waits for the answer, `--calls` times, while 0, 1 or 2 threads of this process keep the GIL
busy, as the server's sink threads do. The three take turns:

* `executor`: `ProcessPoolExecutor` with its pipes as it makes them (64 KiB), called with
  `loop.run_in_executor` (ragmon before 04be8ff);
* `widened`: the same with both pipes widened to 1 MiB (ragmon 04be8ff to the loop pool);
* `loop pool`: `LoopProcessPool` (service/ingest/loop_pool.py), whose pipes the event loop itself
  writes and reads (ragmon now).

Prints p50 and p99 round-trip milliseconds for each, and the ratios to the loop pool.

    python bench/ingest/round_trip.py [--calls 200] [--busy 0 1 2]
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import functools
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.ingest.payload import Batches  # noqa: E402
from service.ingest.loop_pool import LoopProcessPool  # noqa: E402
from service.ingest.otlp import DecodedBatch  # noqa: E402
from service.ingest.pool import _decode_packed  # noqa: E402
from service.processes import pipe_limit, worker_context  # noqa: E402
from service.runtime import SWITCH_INTERVAL_S  # noqa: E402

Call = Callable[[], Awaitable[DecodedBatch]]


def keep_gil_busy(stop: threading.Event) -> None:
    total = 0
    while not stop.is_set():
        for i in range(1000):
            total += i


def widen_executor_pipes(executor: ProcessPoolExecutor) -> None:
    """What ragmon 04be8ff did to its executors: both pipes to 1 MiB (CPython 3.11-3.13 names)."""
    for queue in (executor._call_queue, executor._result_queue):  # type: ignore[attr-defined]
        fcntl.fcntl(queue._reader.fileno(), fcntl.F_SETPIPE_SZ, pipe_limit())


async def round_trips(call: Call, calls: int) -> list[float]:
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        decoded = await call()
        seconds.append(time.perf_counter() - start)
        assert len(decoded.spans) == 400, "the bench body is 100 traces of 4 spans"
    return seconds


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(calls: int, busy_counts: list[int]) -> None:
    sys.setswitchinterval(SWITCH_INTERVAL_S)  # as the server runs
    (body,) = Batches(seed=3, traces_per_request=100).bodies(1)
    decode = functools.partial(
        _decode_packed, body, json_body=False, encoding="", tenant="default", limit=64 << 20
    )
    executors = {
        name: ProcessPoolExecutor(1, mp_context=worker_context()) for name in ("executor", "widened")
    }
    widen_executor_pipes(executors["widened"])
    loop_pool = LoopProcessPool(1, worker_context(), name="bench decoder")
    await loop_pool.start()
    loop = asyncio.get_running_loop()
    contenders: dict[str, Call] = {
        name: functools.partial(loop.run_in_executor, executor, decode)
        for name, executor in executors.items()
    }
    contenders["loop pool"] = functools.partial(loop_pool.call, decode)
    for call in contenders.values():
        await round_trips(call, 5)  # started, imports warm
    print(f"body {len(body):,} bytes, {calls} round trips each from an event loop")
    for busy in busy_counts:
        stop = threading.Event()
        threads = [threading.Thread(target=keep_gil_busy, args=(stop,), daemon=True) for _ in range(busy)]
        for thread in threads:
            thread.start()
        # halves in turn, so drift in the machine's speed falls on all
        seconds: dict[str, list[float]] = {name: [] for name in contenders}
        for turn in range(2):
            for name in contenders if turn == 0 else reversed(list(contenders)):
                seconds[name] += await round_trips(contenders[name], calls // 2)
        stop.set()
        for thread in threads:
            thread.join()
        p50 = {name: percentile(values, 0.5) for name, values in seconds.items()}
        p99 = {name: percentile(values, 0.99) for name, values in seconds.items()}
        base50, base99 = p50["loop pool"], p99["loop pool"]
        print(f"busy threads {busy}:")
        for name in contenders:
            print(
                f"  {name:9} p50 {p50[name] * 1e3:5.1f} p99 {p99[name] * 1e3:5.1f} ms"
                f"   / loop pool: p50 {p50[name] / base50:.2f}x p99 {p99[name] / base99:.2f}x"
            )
    for executor in executors.values():
        executor.shutdown()
    await loop_pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200, help="round trips per contender and setting")
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 1, 2], help="GIL-busy threads")
    args = parser.parse_args()
    asyncio.run(measure(args.calls, args.busy))


if __name__ == "__main__":
    main()
