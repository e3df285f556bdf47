"""Micro-benchmark of `Store.insert_traces` on SQLite: CPU microseconds per new trace, before and after.

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

    python bench/ingest/store_insert.py [--traces 4000] [--batch 500] [--repeat 5] [--baseline REV]
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.baseline import load_module_at  # noqa: E402
from bench.ingest.payload import Batches  # noqa: E402
from service.conventions.pricing import PriceTable  # noqa: E402
from service.conventions.semconv import build_trace  # noqa: E402
from service.ingest import otlp  # noqa: E402
from service.model import RagTrace  # noqa: E402
from service.store.trace_store import Store  # noqa: E402

BASELINE_REV = "e221fe3"  # SQLAlchemy executemany for trace rows, per-batch IN-list statements


def bench_traces(n: int, seed: int) -> list[RagTrace]:
    prices = PriceTable.default()
    built: list[RagTrace] = []
    for body in Batches(seed=seed, traces_per_request=100).bodies(-(-n // 100)):
        groups: dict[str, list[Any]] = defaultdict(list)
        for span in otlp.decode_protobuf(body, "default").spans:
            groups[span.trace_id].append(span)
        built += [build_trace(spans, partial=False, prices=prices) for spans in groups.values()]
    return built[:n]


def load_baseline(rev: str) -> type[Store]:
    """`Store` from `service/store/trace_store.py` (before: `service/store.py`) at git revision `rev`."""
    module = load_module_at(rev, "store_baseline", "service/store/trace_store.py", "service/store.py")
    store_class: type[Store] = module.Store
    return store_class


def one_pass(store_class: type[Store], path: Path, traces: Sequence[RagTrace], batch: int) -> float:
    """CPU seconds to insert `traces` in batches into a fresh database at `path`."""
    store = store_class(f"sqlite:///{path}")
    store.create_schema()
    started = time.process_time()
    for start in range(0, len(traces), batch):
        store.insert_traces(traces[start : start + batch])
    spent = time.process_time() - started
    store.close()
    return spent


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
    parser.add_argument("--baseline", default=BASELINE_REV, help="git revision to compare with")
    args = parser.parse_args(argv)
    traces = bench_traces(args.traces, args.seed)
    candidates = [
        (f"before ({args.baseline})", load_baseline(args.baseline)),
        ("after (working tree)", Store),
    ]
    best = [float("inf")] * len(candidates)
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.repeat):
            for i, (_, store_class) in enumerate(candidates):
                best[i] = min(best[i], one_pass(store_class, Path(tmp) / f"{i}-{run}.db", traces, args.batch))
        for table in ("traces", "trace_contexts"):
            if table_rows(Path(tmp) / "0-0.db", table) != table_rows(Path(tmp) / "1-0.db", table):
                raise RuntimeError(f"baseline and working tree stored different {table} rows")
    print(f"{len(traces)} new traces in batches of {args.batch}, CPU time, best of {args.repeat} passes")
    for (label, _), seconds in zip(candidates, best, strict=True):
        print(f"{label:<24} {seconds / len(traces) * 1e6:8.1f} us/trace")
    print(f"ratio before/after {best[0] / best[1]:.2f}x")


if __name__ == "__main__":
    main()
