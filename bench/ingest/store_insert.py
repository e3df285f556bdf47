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
databases are measured side by side in one run; there the server's CPU is
measured too (its backend's, from /proc: the server must run on this machine).

Without `--baseline` only the working tree is measured. A baseline is one file
loaded at an old revision into today's package, so it works only while the
names it imports still exist (e221fe3 and 9cdfbf5, the revisions of the first
results, no longer load).

    python bench/ingest/store_insert.py [--traces 4000] [--batch 500] [--repeat 5] [--baseline REV]
        [--postgres postgresql+psycopg://user@127.0.0.1:5432/db [--postgres-baseline REV]]
"""

from __future__ import annotations

import argparse
import os
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

_TICK = os.sysconf("SC_CLK_TCK")


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


def _process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def one_pass(
    store_class: type[Store], url: str, traces: Sequence[RagTrace], batch: int
) -> tuple[float, float, float]:
    """(client CPU seconds, wall seconds, PostgreSQL backend CPU seconds or 0 on SQLite) to insert
    `traces` in batches into an empty database at `url`."""
    # one connection, so that one backend does all the work measured
    store = store_class(url, pool_size=1, max_overflow=0)
    store.create_schema()
    backend = None
    if store.dialect == "postgresql":
        with store.engine.begin() as conn:
            conn.exec_driver_sql("TRUNCATE traces, trace_contexts")
            backend = int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
    server_before = _process_cpu_s(backend) if backend else 0.0
    started, wall = time.process_time(), time.perf_counter()
    for start in range(0, len(traces), batch):
        store.insert_traces(traces[start : start + batch])
    spent, took = time.process_time() - started, time.perf_counter() - wall
    server = _process_cpu_s(backend) - server_before if backend else 0.0
    store.close()
    return spent, took, server


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
    parser.add_argument("--baseline", help="git revision to compare with (SQLite)")
    parser.add_argument("--postgres", help="a PostgreSQL URL to measure beside SQLite (tables are emptied)")
    parser.add_argument("--postgres-baseline", help="git revision to compare with (PostgreSQL)")
    args = parser.parse_args(argv)
    traces = bench_traces(args.traces, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        # (label, Store class, URL of a pass, the working tree's counterpart's index or None)
        candidates: list[tuple[str, type[Store], Callable[[int], str], int | None]] = [
            ("SQLite (working tree)", Store, lambda run: f"sqlite:///{tmp}/tree-{run}.db", None)
        ]
        if args.baseline:
            candidates.append(
                (
                    f"SQLite ({args.baseline})",
                    load_baseline(args.baseline),
                    lambda run: f"sqlite:///{tmp}/base-{run}.db",
                    0,
                )
            )
        if args.postgres:
            url: str = args.postgres
            candidates.append(("PostgreSQL (working tree)", Store, lambda run: url, None))
            if args.postgres_baseline:
                tree = len(candidates) - 1
                baseline = load_baseline(args.postgres_baseline)
                candidates.append((f"PostgreSQL ({args.postgres_baseline})", baseline, lambda run: url, tree))
        best = [(float("inf"), float("inf"), float("inf"))] * len(candidates)
        for run in range(args.repeat):
            for i, (_, store_class, url_of, _) in enumerate(candidates):
                measured = one_pass(store_class, url_of(run), traces, args.batch)
                best[i] = (
                    min(best[i][0], measured[0]),
                    min(best[i][1], measured[1]),
                    min(best[i][2], measured[2]),
                )
        if args.baseline:
            for table in ("traces", "trace_contexts"):
                if table_rows(Path(tmp) / "base-0.db", table) != table_rows(Path(tmp) / "tree-0.db", table):
                    raise RuntimeError(f"baseline and working tree stored different {table} rows")
    n = len(traces)
    print(f"{n} new traces in batches of {args.batch}, best of {args.repeat} passes")
    print(f"{'':<36} {'traces/s':>9} {'client CPU us/trace':>20} {'server CPU us/trace':>20}")
    for (label, _, _, _), (cpu, wall, server) in zip(candidates, best, strict=True):
        server_text = f"{server / n * 1e6:20.1f}" if label.startswith("PostgreSQL") else f"{'':>20}"
        print(f"{label:<36} {n / wall:9.0f} {cpu / n * 1e6:20.1f} {server_text}")
    for i, (label, _, _, tree) in enumerate(candidates):
        if tree is not None:
            cpu_ratio, wall_ratio = best[i][0] / best[tree][0], best[i][1] / best[tree][1]
            print(f"{label}: baseline/working tree CPU {cpu_ratio:.2f}x, wall {wall_ratio:.2f}x")


if __name__ == "__main__":
    main()
