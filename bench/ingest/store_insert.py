"""Micro-benchmark of `Store.insert_traces`: new traces per second and CPU per trace, before and after.

The traces are the ingest benchmark's own (bench/ingest/payload.py: 4 spans,
5 retrieved documents of ~500 characters, a 384-float query vector), decoded
and built by ragmon's ingest code, so the store sees what the server hands it.

`--baseline REV` loads `service/store/trace_store.py` as it was at that git revision into
a private module (the rest of `service` is the working tree's) and times it
on the same batches, alternating passes with the working tree's `Store`; each
pass writes a fresh database file. CPU time of this process includes SQLite's
own work (parsing, b-tree inserts, the WAL commit), which both sides do alike,
so the difference is the Python each spends around it. The script then checks
that both wrote the same rows.

With `--postgres URL` the same batches also go to that PostgreSQL database
(its `traces` and `trace_contexts` are emptied before each pass), so both
databases are measured side by side in one run; wall time counts there, since
the server's work is in another process.

    python bench/ingest/store_insert.py [--traces 4000] [--batch 500] [--repeat 5] [--baseline REV]
        [--postgres postgresql+psycopg://user@127.0.0.1:5432/db]
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.baseline import load_module_at  # noqa: E402
from bench.ingest.payload import Batches  # noqa: E402
from service.conventions.pricing import PriceTable  # noqa: E402
from service.conventions.semconv import build_trace  # noqa: E402
from service.ingest import otlp_protobuf  # noqa: E402
from service.model import RagTrace  # noqa: E402
from service.store.trace_store import Store  # noqa: E402

BASELINE_REV = "e221fe3"  # SQLAlchemy executemany for trace rows, per-batch IN-list statements
POSTGRES_BASELINE_REV = "9cdfbf5"  # PostgreSQL: one multi-row INSERT ... ON CONFLICT ... RETURNING a batch


def bench_traces(n: int, seed: int) -> list[RagTrace]:
    prices = PriceTable.default()
    built: list[RagTrace] = []
    for body in Batches(seed=seed, traces_per_request=100).bodies(-(-n // 100)):
        groups: dict[str, list[Any]] = defaultdict(list)
        for span in otlp_protobuf.decode_protobuf(body, "default").spans:
            groups[span.trace_id].append(span)
        built += [build_trace(spans, partial=False, prices=prices) for spans in groups.values()]
    return built[:n]


def load_baseline(rev: str) -> type[Store]:
    """`Store` from `service/store/trace_store.py` (before: `service/store.py`) at git revision `rev`."""
    module = load_module_at(rev, "store_baseline", "service/store/trace_store.py", "service/store.py")
    store_class: type[Store] = module.Store
    return store_class


def one_pass(
    store_class: type[Store], url: str, traces: Sequence[RagTrace], batch: int
) -> tuple[float, float]:
    """(CPU seconds, wall seconds) to insert `traces` in batches into an empty database at `url`."""
    store = store_class(url)
    store.create_schema()
    if store.dialect == "postgresql":
        with store.engine.begin() as conn:
            conn.exec_driver_sql("TRUNCATE traces, trace_contexts")
    started, wall = time.process_time(), time.perf_counter()
    for start in range(0, len(traces), batch):
        store.insert_traces(traces[start : start + batch])
    spent, took = time.process_time() - started, time.perf_counter() - wall
    store.close()
    return spent, took


def table_rows(path: Path, table: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute(f"SELECT * FROM {table} ORDER BY tenant, trace_id").fetchall()
    # `created_at` (the last traces column) is the time of the insert
    return [row[:-1] for row in rows] if table == "traces" else rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=500, help="traces per insert (the bus's batch_size)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--baseline", default=BASELINE_REV, help="git revision to compare with (SQLite)")
    parser.add_argument("--postgres", help="a PostgreSQL URL to measure beside SQLite (tables are emptied)")
    parser.add_argument(
        "--postgres-baseline", default=POSTGRES_BASELINE_REV, help="git revision to compare with (PostgreSQL)"
    )
    args = parser.parse_args(argv)
    traces = bench_traces(args.traces, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        candidates: list[tuple[str, type[Store], Callable[[int], str]]] = [
            (
                f"SQLite before ({args.baseline})",
                load_baseline(args.baseline),
                lambda run: f"sqlite:///{tmp}/0-{run}.db",
            ),
            ("SQLite after (working tree)", Store, lambda run: f"sqlite:///{tmp}/1-{run}.db"),
        ]
        if args.postgres:
            url: str = args.postgres
            candidates += [
                (
                    f"PostgreSQL before ({args.postgres_baseline})",
                    load_baseline(args.postgres_baseline),
                    lambda run: url,
                ),
                ("PostgreSQL after (working tree)", Store, lambda run: url),
            ]
        best = [(float("inf"), float("inf"))] * len(candidates)
        for run in range(args.repeat):
            for i, (_, store_class, url_of) in enumerate(candidates):
                cpu, wall = one_pass(store_class, url_of(run), traces, args.batch)
                best[i] = (min(best[i][0], cpu), min(best[i][1], wall))
        for table in ("traces", "trace_contexts"):
            if table_rows(Path(tmp) / "0-0.db", table) != table_rows(Path(tmp) / "1-0.db", table):
                raise RuntimeError(f"baseline and working tree stored different {table} rows")
    print(f"{len(traces)} new traces in batches of {args.batch}, best of {args.repeat} passes")
    print(f"{'':<36} {'traces/s':>9} {'client CPU us/trace':>20}")
    for (label, _, _), (cpu, wall) in zip(candidates, best, strict=True):
        print(f"{label:<36} {len(traces) / wall:9.0f} {cpu / len(traces) * 1e6:20.1f}")
    for start in range(0, len(candidates), 2):
        before = candidates[start][0]
        cpu_ratio = best[start][0] / best[start + 1][0]
        wall_ratio = best[start][1] / best[start + 1][1]
        print(f"{before.split()[0]}: before/after CPU {cpu_ratio:.2f}x, wall {wall_ratio:.2f}x")
    if args.postgres:
        ratio = best[1][1] / best[3][1]
        print(f"PostgreSQL after / SQLite after, traces per second: {ratio:.2f}x")


if __name__ == "__main__":
    main()
