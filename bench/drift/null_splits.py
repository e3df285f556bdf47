"""False alarms of the service's query test, decisively: many no-shift splits of the text test alone.

    python bench/drift/null_splits.py --splits 1000            # ~45 min on one core
    python bench/drift/null_splits.py --splits 4 --dump /tmp/x.csv   # seconds: checks the script runs

Splits already in the --dump file are read back, not rerun (an interrupted run resumes).

The splits are run.py's no-shift windows (`null_draw`: a reference of 5,000
and a window of 2,000 from one query set, without replacement, from the pool
without one held-out set in rotation), half from clinc150 and half from
banking77, so the first 150 of each set are the very windows of `run.py
--full`. Each split is one call of `TextKnnDrift` (seed = split number); its
combined p-value and the k-NN and novelty statistics' own p-values are all
recorded, so one run measures the test with and without the novelty part.

What a permutation p-value (1 + #{permuted >= observed}) / (1 + B) promises
under no shift: P(p <= a) <= floor(a (1 + B)) / (1 + B), with equality when
the statistic has no ties; B = 200 gives 10/201 = 0.0498 at a = 0.05. The
report gives the observed rate at three levels beside that exact size, with
Clopper–Pearson and Wilson 95 % intervals, per query set and overall.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from queries import QuerySet, bench_cache, load_banking77, load_clinc150
from run import ALPHA, TEXT, TEXT_KNN, held_out_sets, null_draw, text_p_values
from scipy import stats

from detectors.text_knn import TextKnnDrift

LEVELS = (0.01, ALPHA, 0.10)
PARTS = (TEXT, TEXT_KNN, "novelty")


@dataclass(frozen=True)
class Split:
    query_set: str
    rep: int
    p_values: dict[str, float]
    seconds: float


def run(found: list[QuerySet], splits: int, dump: Path) -> list[Split]:
    """`splits` no-shift splits per query set, alternating between the sets, one core.

    Each split is appended to `dump` as soon as it is done, and splits already
    there are read back instead of rerun, so an interrupted run resumes.
    """
    done: dict[tuple[str, int], Split] = {}
    if dump.exists():
        with dump.open(newline="") as handle:
            for row in csv.DictReader(handle):
                p_values = {part: float(row[part]) for part in PARTS}
                done[(row["query_set"], int(row["rep"]))] = Split(
                    row["query_set"], int(row["rep"]), p_values, float(row["seconds"])
                )
    else:
        dump.parent.mkdir(parents=True, exist_ok=True)
        dump.write_text(",".join(["query_set", "rep", *PARTS, "seconds"]) + "\n")
    sets = {queries.name: held_out_sets(queries) for queries in found}
    out = []
    for rep in range(splits):
        for queries in found:
            if (queries.name, rep) in done:
                out.append(done[(queries.name, rep)])
                continue
            ref, win = null_draw(queries, sets[queries.name], rep)
            started = time.perf_counter()
            p_values = text_p_values(queries.texts, ref, win, rep)
            split = Split(queries.name, rep, p_values, time.perf_counter() - started)
            with dump.open("a", newline="") as handle:
                csv.writer(handle).writerow(
                    [split.query_set, rep, *(p_values[p] for p in PARTS), f"{split.seconds:.3f}"]
                )
            out.append(split)
        if (rep + 1) % 25 == 0:
            print(f"{rep + 1}/{splits} splits per set", file=sys.stderr, flush=True)
    return out


def exact_size(level: float, permutations: int) -> float:
    """The largest P(p <= level) a permutation p-value with `permutations` draws allows under no shift."""
    return math.floor(level * (1 + permutations) + 1e-9) / (1 + permutations)


def interval(hits: int, trials: int, method: str) -> str:
    ci = stats.binomtest(hits, trials).proportion_ci(confidence_level=0.95, method=method)
    return f"[{ci.low:.3f}, {ci.high:.3f}]"


def report(results: list[Split], permutations: int) -> list[str]:
    names = sorted({s.query_set for s in results})
    out = [
        "| test | level a | exact size bound | query set | false alarms | rate | Clopper–Pearson 95 % "
        "| Wilson 95 % |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for part in PARTS:
        for level in LEVELS:
            bound = exact_size(level, permutations)
            for name in [*names, "all"]:
                chosen = [s for s in results if name in ("all", s.query_set)]
                hits = sum(s.p_values[part] <= level for s in chosen)
                out.append(
                    f"| {part} | {level:g} | {bound:.4f} | {name} | {hits}/{len(chosen)} | "
                    f"{hits / len(chosen):.4f} | {interval(hits, len(chosen), 'exact')} | "
                    f"{interval(hits, len(chosen), 'wilson')} |"
                )
    for part in PARTS:
        values = np.array([s.p_values[part] for s in results])
        # Under no shift a permutation p-value is (nearly) uniform on {1, ..., 1 + B} / (1 + B): mean 0.5.
        uniform = (permutations + 2) / (2 * (permutations + 1))
        out.append(f"\n{part}: mean p-value {values.mean():.3f} (uniform: {uniform:.3f})")
    times = [s.seconds for s in results]
    out.append(f"\nTime per split (fit + score): median {np.median(times):.2f} s, max {max(times):.2f} s.")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--splits", type=int, default=1000, help="no-shift splits, halved over the sets")
    parser.add_argument(
        "--dump", type=Path, default=bench_cache() / "null_splits.csv", help="per-split CSV (resumed)"
    )
    args = parser.parse_args(argv)
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, "1")
    found = [q for q in (load_clinc150(), load_banking77()) if q is not None]
    if not found:
        print("skipped: neither clinc150 (../shared/data) nor banking77 (bench/drift/banking77.py) found")
        return 0
    started = time.perf_counter()
    results = run(found, math.ceil(args.splits / len(found)), args.dump)
    elapsed = time.perf_counter() - started
    command = "python bench/drift/null_splits.py " + " ".join(argv if argv is not None else sys.argv[1:])
    permutations = TextKnnDrift().permutations
    print(
        f"Command: `{command}` ({time.strftime('%Y-%m-%d')}; {len(results)} no-shift splits, one core; "
        f"took {elapsed / 60:.0f} min in this call; {permutations} permutations per test; per-split "
        f"p-values in {args.dump}).\n"
    )
    print("\n".join(report(results, permutations)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
