"""The faithfulness estimate over a 24 h window: summed in the database vs every record read, by window size.

`FaithfulnessEstimator` recomputes its gauges every 30 s over the judge-queue
records of the last 24 h. The queue holds a record for every trace the
sampler selected, budget-skipped ones included, so the window grows with
traffic times sampling rate (at 100 traces/s and 2 % selected, ~170k records
a day). Before 2026-11-30 `compute` read every record into Python (plus one
row-value IN lookup of judgments per 500 of them); now
`JudgmentStore.window_cells` lets the database sum them into cells of (app,
release, intent, stratum, inclusion probability, outcome) and the estimate is
computed from the cells.

For each window size the script fills a SQLite file (3 apps, 2 releases,
2 intents, 4 strata; 20 % skipped, 5 % failed, the rest judged, of those 10 %
without claims), then times both ways (best of `--repeat`, wall and this
process's CPU), reports Python's peak traced memory, and checks both give the
same estimates.

    python bench/judge/estimate_window.py [--records 10000 50000 200000] [--repeat 3]

`--gauges` times what the gauges read instead, both readings (claim- and answer-level): before
session 40 a pass over the window a reading, and with a tenant label (`--tenants` > 1) one to list
the tenants and then a pass a reading and tenant; now one pass for all of it
(`JudgmentStore.window_cells_of`, `window_cells_per_tenant`).

    python bench/judge/estimate_window.py --gauges [--records 200000 1000000] [--tenants 4]
"""

from __future__ import annotations

import argparse
import functools
import random
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from sampler import (  # noqa: E402
    GROUPINGS,
    SqlJudgeQueue,
    create_tables,
    estimate_cells_by,
)
from sampler.queue_table import judge_queue  # noqa: E402
from service.judge.store import JudgmentStore, judgments  # noqa: E402
from service.store.trace_store import Store  # noqa: E402
from tests.service.judge.record_by_record import record_by_record  # noqa: E402

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
WINDOW = timedelta(hours=24)
VERSION = "llm/bench/p1"
STRATA = [("base", 0.02), ("thumbs_down", 1.0), ("low_retrieval", 0.25), ("regenerated", 0.5)]


def fill(url: str, n: int, seed: int, tenants: int = 1) -> None:
    """`n` queue records in their final states, and judgments for the done ones, written directly."""
    rng = random.Random(seed)
    store = Store(url)
    store.create_schema()
    JudgmentStore(store.engine).create_schema()
    create_tables(store.engine)
    queue_rows, judgment_rows = [], []
    for i in range(n):
        stratum, pi = rng.choice(STRATA)
        roll = rng.random()
        state = "skipped" if roll < 0.2 else "failed" if roll < 0.25 else "done"
        trace_time = NOW - timedelta(seconds=rng.uniform(1, WINDOW.total_seconds() - 1))
        tenant = "default" if tenants == 1 else f"tenant-{i % tenants}"
        key = {"tenant": tenant, "trace_id": f"{i:032x}", "judge_version": VERSION}
        app = rng.choice(["support-bot", "docs", "hr"])
        queue_rows.append(
            {
                **key,
                "app": app,
                "release": rng.choice(["v1", "v2"]),
                "intent": rng.choice(["billing", "shipping"]),
                "stratum": stratum,
                "inclusion_probability": pi,
                "trace_time": trace_time,
                "enqueued_at": trace_time,
                "available_at": trace_time,
                "state": state,
                "attempts": 0 if state == "skipped" else 1,
            }
        )
        if state == "done":
            claims = rng.random() >= 0.1
            judgment_rows.append(
                {
                    **key,
                    "app": app,
                    "judge": "llm",
                    "outcome": "scored" if claims else "no_claims",
                    "faithfulness": (1.0 if rng.random() < 0.85 else round(rng.random(), 2))
                    if claims
                    else None,
                    "judged_at": trace_time,
                    "record": "{}",
                }
            )
    with store.engine.begin() as conn:
        for start in range(0, n, 5000):
            conn.execute(sa.insert(judge_queue), queue_rows[start : start + 5000])
        for start in range(0, len(judgment_rows), 5000):
            conn.execute(sa.insert(judgments), judgment_rows[start : start + 5000])
    store.close()


def summed_cells(store: JudgmentStore) -> dict[str, Any]:
    cells = store.window_cells(NOW - WINDOW, NOW)
    return {g: estimate_cells_by(cells, g) for g in GROUPINGS}


def measure(fn: Callable[[], dict[str, Any]], repeat: int) -> tuple[float, float, float, dict[str, Any]]:
    """Best wall and CPU seconds over `repeat` calls, peak traced MiB of one more, and its result."""
    wall = cpu = float("inf")
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = min(wall, time.perf_counter() - w), min(cpu, time.process_time() - c)
    tracemalloc.start()
    result = fn()
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return wall, cpu, peak, result


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    for grouping in GROUPINGS:
        if set(a[grouping]) != set(b[grouping]):
            return False
        for key, x in a[grouping].items():
            y = b[grouping][key]
            if (x.n_judged, x.n_skipped, x.method) != (y.n_judged, y.n_skipped, y.method):
                return False
            if abs(x.estimate - y.estimate) > 1e-9 or abs(x.lower - y.lower) > 1e-9:
                return False
    return True


def _window_tenants(judged: JudgmentStore) -> list[str]:
    """The tenants with queue records in the window, as the gauges listed them before session 40."""
    q = judge_queue.c
    query = sa.select(q.tenant).where(q.trace_time > NOW - WINDOW, q.trace_time <= NOW).distinct()
    with judged.engine.connect() as conn:
        return sorted(conn.execute(query).scalars())


def _before(judged: JudgmentStore, tenants: int) -> dict[str, Any]:
    """What the gauges read before session 40: a pass a reading, and with a tenant label a pass a
    reading and tenant after one to list the tenants."""
    readings = ("claims", "answers")
    if tenants == 1:
        return {r: judged.window_cells(NOW - WINDOW, NOW, reading=r) for r in readings}
    return {
        (t, r): judged.window_cells(NOW - WINDOW, NOW, reading=r, tenant=t)
        for t in _window_tenants(judged)
        for r in readings
    }


def _now(judged: JudgmentStore, tenants: int) -> dict[str, Any]:
    readings = ("claims", "answers")
    if tenants == 1:
        return dict(judged.window_cells_of(NOW - WINDOW, NOW, readings))
    return {
        (t, r): cells
        for t, of_tenant in judged.window_cells_per_tenant(NOW - WINDOW, NOW, readings).items()
        for r, cells in of_tenant.items()
    }


def gauges(records: list[int], repeat: int, tenants: int) -> None:
    """What the gauges read: both readings, for every tenant or each (a tenant label), before and now."""
    print(f"{tenants} tenant(s)")
    print("| records in the window | before: wall | now (one pass): wall | ratio |")
    print("|---:|---:|---:|---:|")
    for n in records:
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{tmp}/bench.db"
            fill(url, n, seed=n, tenants=tenants)
            store = Store(url)
            judged = JudgmentStore(store.engine)
            old = measure(functools.partial(_before, judged, tenants), repeat)
            new = measure(functools.partial(_now, judged, tenants), repeat)
            store.close()
        if {k: len(c) for k, c in old[3].items()} != {k: len(c) for k, c in new[3].items()}:
            raise RuntimeError(f"the two ways disagree at {n} records")
        print(f"| {n:,} | {old[0]:.2f} s | {new[0]:.2f} s | {new[0] / old[0]:.2f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, nargs="+", default=[10_000, 50_000, 200_000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--gauges", action="store_true", help="what the gauges read, before and now")
    parser.add_argument("--tenants", type=int, default=1, help="with --gauges: tenants (>1: a tenant label)")
    args = parser.parse_args()
    if args.gauges:
        gauges(args.records, args.repeat, args.tenants)
        return
    print(
        "| records in the window | every record read: wall / CPU / peak | summed in the database | speed-up |"
    )
    print("|---:|---|---|---:|")
    for n in args.records:
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{tmp}/bench.db"
            fill(url, n, seed=n)
            store = Store(url)
            queue, judged = SqlJudgeQueue(store.engine), JudgmentStore(store.engine)
            old = measure(
                functools.partial(record_by_record, queue, judged, now=NOW, window=WINDOW), args.repeat
            )
            new = measure(functools.partial(summed_cells, judged), args.repeat)
            store.close()
        if not same(old[3], new[3]):
            raise RuntimeError(f"the two ways disagree at {n} records")
        print(
            f"| {n:,} | {old[0]:.2f} s / {old[1]:.2f} s / {old[2]:.0f} MiB "
            f"| {new[0]:.3f} s / {new[1]:.3f} s / {new[2]:.1f} MiB | {old[0] / new[0]:.0f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
