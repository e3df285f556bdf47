"""Power of the query-text test at smaller shifts: the window's share of held-out queries below 10 %.

run.py measures every held-out set at p = 10 % of a window of n = 2,000 (issue #24's target). This
script asks what is left at p = 5 % and 2.5 % for the hardest set, clinc150's out-of-scope queries
(diverse by nature: no topic of their own), beside one of its new domains, with the same draws,
reference size (5,000) and test (`TextKnnDrift`, alpha = 0.05) as run.py. Each cell: alarms / windows
with the exact (Clopper-Pearson) 95 % interval.

    python bench/drift/shares.py [--reps 20] [--shares 0.10,0.05,0.025]

Reads clinc150 from ../shared/data (or RAGMON_SHARED_DATA); says so and exits 0 without it.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from measure import rate
from queries import load_clinc150
from run import ALPHA, TARGET_N, base_pool, draw, held_out_sets, text_p_values

SETS = ("oos", "travel")  # the out-of-scope queries; a new domain for comparison


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=20, help="shifted windows per cell")
    parser.add_argument("--shares", default="0.10,0.05,0.025", help="held-out shares, comma-separated")
    args = parser.parse_args(argv)
    shares = [float(s) for s in args.shares.split(",")]
    queries = load_clinc150()
    if queries is None:
        print("clinc150 is not in ../shared/data: nothing to measure", file=sys.stderr)
        return 0
    sets = {held.name: held for held in held_out_sets(queries)}
    print(f"clinc150, n = {TARGET_N} a window, reference 5,000, alpha = {ALPHA}, {args.reps} windows a cell")
    print()
    print("| held-out set | share | alarms / windows | power [95 % CI] | k-NN part alone | median s |")
    print("|---|---:|---:|---:|---:|---:|")
    for index, name in enumerate(SETS):
        held = sets[name]
        pool, base = np.flatnonzero(held.mask), base_pool(queries, held)
        for share in shares:
            hits = knn_hits = 0
            seconds = []
            for rep in range(args.reps):
                rng = np.random.default_rng([4, index, round(share * 1000), rep])
                ref, win = draw(rng, base, pool, TARGET_N, share)
                started = time.process_time()
                found = text_p_values(queries.texts, ref, win, rep)
                seconds.append(time.process_time() - started)
                hits += found["ragmon text"] <= ALPHA
                knn_hits += found["ragmon text k-NN"] <= ALPHA
            power, knn = rate(hits, args.reps), rate(knn_hits, args.reps)
            print(
                f"| {name} ({held.kind}) | {share:.1%} | {hits}/{args.reps} | {power.value:.2f} "
                f"[{power.low:.2f}, {power.high:.2f}] | {knn_hits}/{args.reps} ({knn.value:.2f}) "
                f"| {float(np.median(seconds)):.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
