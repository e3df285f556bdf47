"""A process that spends the judge budget, for the tests with several real processes on one database.

    python -m tests.service.judge.spend_budget URL BUDGET_JSON drain   # admit until refused, print the count
    python -m tests.service.judge.spend_budget URL BUDGET_JSON hold N  # admit N, say so, then wait

`drain` waits for a line on stdin before it starts, so the processes of a test start together; it
returns its lease when done, as a process that shuts down does. `hold` never returns its lease:
the test SIGKILLs it.
"""

from __future__ import annotations

import json
import sys
import time

from sampler.budget import BudgetConfig
from service.judge.shared_budget import judge_budget
from service.store.trace_store import Store


def main(argv: list[str]) -> int:
    url, settings, mode = argv[0], json.loads(argv[1]), argv[2]
    store = Store(url)
    budget = judge_budget(BudgetConfig(**settings), store.engine)
    if mode == "drain":
        sys.stdin.readline()
        admitted = 0
        while budget.try_admit(0.001) is None:
            admitted += 1
        release = getattr(budget, "release", None)
        if release is not None:
            release()
        print(admitted, flush=True)
        store.close()
        return 0
    for _ in range(int(argv[3])):
        if budget.try_admit(0.001) is not None:
            print("refused", flush=True)
            return 1
    print(f"held {argv[3]}", flush=True)
    time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
