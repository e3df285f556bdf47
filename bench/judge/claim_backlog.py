"""CPU of one judge-queue claim under a spent budget, against the backlog of deferred items.

When sampling selects more traces than the judge budget admits, the rest wait in the queue,
deferred, for up to `budget.max_deferral_s` (6 h): at 600 traces/s and the default 2 % base rate
that is ~11 items a second, ~240,000 after six hours. The judge worker claims about once a
second meanwhile (`budget.lease_retry_s`), and each claim admits what the budget refilled. This
script fills a SQLite queue (the store's engine and settings) with BACKLOG items over three
tenants, then times claims that admit one item each, as the worker's do: the CPU of this process
(SQLite works in it) and the wall time (PostgreSQL's work is in its own processes).

    python bench/judge/claim_backlog.py [--backlog 300 3000 30000] [--claims 20] [--src TREE] \\
        [--database-url postgresql+psycopg://...]

`--src` runs another source tree's queue (e.g. `git archive <commit> | tar -x -C /tmp/old`), so
two versions can be compared on the same machine in the same hour.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--backlog", type=int, nargs="+", default=[300, 3_000, 30_000])
    parser.add_argument("--claims", type=int, default=20, help="claims timed at each backlog")
    parser.add_argument("--src", type=Path, help="the ragmon source tree to measure (default: this one)")
    parser.add_argument(
        "--database-url", help="a PostgreSQL database to run the queue in (its judge_queue is dropped)"
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.src or Path(__file__).resolve().parents[2]))

    from sampler.budget import RefusalReason
    from sampler.fair import FairAdmission, FairShares
    from sampler.queue import JudgeItem
    from sampler.queue_table import create_tables, metadata
    from sampler.sql_queue import SqlJudgeQueue
    from service.store.trace_store import Store

    class SpentBudget:
        """A budget with `room` judgments left, refusing after them, as a spent one does."""

        def __init__(self) -> None:
            self.room = 0

        def try_admit(self, cost_usd: float) -> RefusalReason | None:
            if self.room <= 0:
                return "budget_calls"
            self.room -= 1
            return None

    print(f"source: {args.src or 'this tree'}; database: {'PostgreSQL' if args.database_url else 'SQLite'}")
    print("| items waiting | ms of CPU a claim, this process (admitting 1 of 32) | ms of wall time a claim |")
    print("|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="ragmon-claims-") as tmp:
        for backlog in args.backlog:
            store = Store(args.database_url or f"sqlite:///{Path(tmp) / f'{backlog}.db'}")
            metadata.drop_all(store.engine)
            create_tables(store.engine)
            queue = SqlJudgeQueue(store.engine)
            now = datetime.now(UTC)
            items = [
                JudgeItem(
                    trace_id=f"{n:032x}",
                    tenant=("acme", "beta", "gamma")[n % 3],
                    app="shop",
                    stratum="base",
                    inclusion_probability=0.02,
                    judge_version="v1",
                    enqueued_at=now,
                    trace_time=now,
                )
                for n in range(backlog)
            ]
            for start in range(0, backlog, 1_000):
                queue.enqueue(items[start : start + 1_000])
            budget = SpentBudget()
            admission = FairAdmission(FairShares(), budget)  # as the judge worker asks
            queue.claim_within(32, 120.0, "w", admission)  # the first turns deferred, as under a spent budget
            started, wall_started = time.process_time(), time.perf_counter()
            for _ in range(args.claims):
                budget.room = 1
                for record in queue.claim_within(32, 120.0, "w", admission).records:
                    queue.complete(record.key)
            cpu_ms = (time.process_time() - started) / args.claims * 1e3
            wall_ms = (time.perf_counter() - wall_started) / args.claims * 1e3
            print(f"| {backlog:,} | {cpu_ms:.2f} | {wall_ms:.2f} |", flush=True)
            store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
