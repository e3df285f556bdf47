"""Micro-benchmark: a decode round trip through a process pool, default pipes vs widened ones.

A request's body goes to a decoder process and its spans come back through the pool's two
pipes (service/ingest_pool.py). This sends one real bench body (`payload.Batches`: 100 traces,
~750 KB) to a decoder (`_decode_packed`, what the server calls) and waits for the answer, 200
times, while 0, 1 or 2 threads of this process keep the GIL busy, as the server's sink threads
and event loop do. Two pools from the same forkserver context take turns: one with the pipes as
`ProcessPoolExecutor` makes them (64 KiB), one widened by `_widen_pipes`. Prints p50 and p99
round-trip milliseconds for each and the ratio default / widened.

    python bench/ingest/pipe_size.py [--calls 200] [--busy 0 1 2]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.ingest.payload import Batches  # noqa: E402
from service.ingest_pool import _context, _decode_packed, _widen_pipes  # noqa: E402
from service.runtime import SWITCH_INTERVAL_S  # noqa: E402


def keep_gil_busy(stop: threading.Event) -> None:
    total = 0
    while not stop.is_set():
        for i in range(1000):
            total += i


def round_trips(executor: ProcessPoolExecutor, body: bytes, calls: int) -> list[float]:
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        decoded = executor.submit(
            _decode_packed, body, json_body=False, encoding="", tenant="default", limit=64 << 20
        ).result()
        seconds.append(time.perf_counter() - start)
        assert len(decoded.spans) == 400, "the bench body is 100 traces of 4 spans"
    return seconds


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200, help="round trips per pool and setting")
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 1, 2], help="GIL-busy threads")
    args = parser.parse_args()
    sys.setswitchinterval(SWITCH_INTERVAL_S)  # as the server runs
    (body,) = Batches(seed=3, traces_per_request=100).bodies(1)
    pools = {name: ProcessPoolExecutor(1, mp_context=_context()) for name in ("default", "widened")}
    _widen_pipes(pools["widened"])
    for executor in pools.values():
        round_trips(executor, body, 5)  # started, imports warm
    print(f"body {len(body):,} bytes, {args.calls} round trips each, pool pipes default vs widened")
    for busy in args.busy:
        stop = threading.Event()
        threads = [threading.Thread(target=keep_gil_busy, args=(stop,), daemon=True) for _ in range(busy)]
        for thread in threads:
            thread.start()
        # halves in turn, so drift in the machine's speed falls on both
        seconds: dict[str, list[float]] = {name: [] for name in pools}
        for turn in range(2):
            for name in pools if turn == 0 else reversed(list(pools)):
                seconds[name] += round_trips(pools[name], body, args.calls // 2)
        stop.set()
        for thread in threads:
            thread.join()
        (d50, d99), (w50, w99) = ((percentile(seconds[n], 0.5), percentile(seconds[n], 0.99)) for n in pools)
        print(
            f"busy threads {busy}: default p50 {d50 * 1e3:5.1f} p99 {d99 * 1e3:5.1f} ms"
            f" | widened p50 {w50 * 1e3:5.1f} p99 {w99 * 1e3:5.1f} ms"
            f" | default / widened p50 {d50 / w50:.2f}x p99 {d99 / w99:.2f}x"
        )
    for executor in pools.values():
        executor.shutdown()


if __name__ == "__main__":
    main()
