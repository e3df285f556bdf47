"""How well the drift explanation finds the new queries: hashing-embedder groups against TF-IDF-space groups.

    python bench/drift/explain_purity.py --reps 2   # ~10 minutes on one core

On run.py's shifted windows (a reference of 5,000 and a window of 2,000, 10 %
of it from a held-out set: each clinc150 domain, clinc150's out-of-scope
queries and the ten banking77 intent pairs), the explanation the service
attaches to a drifted query test is computed twice on the same window:

  hashing   `explain_query_drift` on the 384-d hashing-embedder vectors (before)
  TF-IDF    `explain_query_text_drift` in the query-text test's fitted TF-IDF
            space (its embedder fitted on the reference, as at pin time)

and scored against the held-out labels: the top group's purity (the share of
its window queries that are held-out ones), the share of the held-out
queries it holds (recall), and whether it is significant.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

import numpy as np
import numpy.typing as npt
from queries import QuerySet, embed_hashing, load_banking77, load_clinc150
from run import ALPHA, T0, TARGET_N, TARGET_SHARE, base_pool, draw, held_out_sets

from detectors.base import Reference
from detectors.explain import QueryGroup, explain_query_drift, explain_query_text_drift
from detectors.text_knn import TextKnnDrift


def score(group: QueryGroup | None, held: npt.NDArray[np.bool_]) -> tuple[float, float, bool]:
    """(purity, recall, significant) of a top group, against which window rows are held-out ones."""
    if group is None or not group.members:
        return 0.0, 0.0, False
    inside = held[list(group.members)]
    return float(inside.mean()), float(inside.sum() / max(1, held.sum())), group.significant


def run(queries: QuerySet, reps: int) -> dict[tuple[str, str], list[tuple[float, float, bool, float]]]:
    vectors, _ = embed_hashing(queries.texts)
    found: dict[tuple[str, str], list[tuple[float, float, bool, float]]] = defaultdict(list)
    for index, held_out in enumerate(held_out_sets(queries)):
        if held_out.kind == "10 new intents":
            continue
        pool, base = np.flatnonzero(held_out.mask), base_pool(queries, held_out)
        for rep in range(reps):
            ref, win = draw(np.random.default_rng([4, index, rep]), base, pool, TARGET_N, TARGET_SHARE)
            held = held_out.mask[win]
            texts = [str(t) for t in queries.texts[win]]
            name = f"{queries.name} {held_out.kind}"
            started = time.perf_counter()
            groups = explain_query_drift(vectors[ref], vectors[win], texts, alpha=ALPHA, seed=rep)
            found[(name, "hashing")].append(
                (*score(groups[0] if groups else None, held), time.perf_counter() - started)
            )
            embedder = TextKnnDrift(seed=rep).fit(Reference("b", queries.texts[ref], T0, T0)).embedder
            assert embedder is not None
            started = time.perf_counter()
            groups = explain_query_text_drift(
                embedder, [str(t) for t in queries.texts[ref]], texts, alpha=ALPHA, seed=rep
            )
            found[(name, "TF-IDF")].append(
                (*score(groups[0] if groups else None, held), time.perf_counter() - started)
            )
        print(f"{queries.name}: {held_out.name} done", file=sys.stderr, flush=True)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=2, help="windows per held-out set")
    args = parser.parse_args(argv)
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, "1")
    started = time.perf_counter()
    found: dict[tuple[str, str], list[tuple[float, float, bool, float]]] = {}
    for queries in (load_clinc150(), load_banking77()):
        if queries is not None:
            found.update(run(queries, args.reps))
    if not found:
        print("skipped: neither clinc150 (../shared/data) nor banking77 (bench/drift/banking77.py) found")
        return 0
    command = "python bench/drift/explain_purity.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(
        f"Command: `{command}` ({time.strftime('%Y-%m-%d')}; "
        f"took {(time.perf_counter() - started) / 60:.0f} min)\n"
    )
    print(
        "| windows | space | n | top-group purity, mean | top-group recall, mean | top group significant "
        "| median s |"
    )
    print("|---|---|---|---|---|---|---|")
    for (name, space), rows in sorted(found.items()):
        purity, recall, significant, seconds = (np.array(c, dtype=float) for c in zip(*rows, strict=True))
        print(
            f"| {name} | {space} | {len(rows)} | {purity.mean():.3f} | {recall.mean():.3f} | "
            f"{int(significant.sum())}/{len(rows)} | {np.median(seconds):.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
