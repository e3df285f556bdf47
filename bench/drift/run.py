"""Drift benchmark on real queries (clinc150, banking77), ragmon embedding the queries itself, against alibi.

    python bench/drift/banking77.py GIT_DIR   # once: builds banking77 outside the repo
    python bench/drift/run.py --smoke         # seconds: checks the script runs
    python bench/drift/run.py --quick         # ~10 minutes
    python bench/drift/run.py --full --write  # the recorded run; rewrites its section of RESULTS.md
    python bench/drift/run.py --power        # shifted windows and power curve of the text test alone
    python bench/drift/null_splits.py --splits 1000   # only no-shift windows of the text test

Run it with an interpreter that has ragmon installed; alibi-detect (PyTorch
backend, CPU) is the peer and is measured in the same run on the same windows
when importable (see bench/RESULTS.md for the venv). A query set whose data is
absent is skipped with a note; without any, the script says so and exits 0.

Tests, all on the queries alone (what ragmon has when the app sends no vectors):
  ragmon text        `TextKnnDrift` (the service's query test now): TF-IDF fitted on a
                     fifth of the reference (1,000 of 5,000), k-NN mixing and novelty statistics
                     against the other 4,000, combined by min-p in one permutation test
  ragmon text k-NN   the k-NN statistic's own permutation p-value from the same call (the
                     service's test before the novelty statistic; identical to it)
  ragmon MMD (hash)  `MmdDrift` on the 384-d hashing embedder (the query test before),
                     on the same reference (subsampled to 2,500 by its own bound)
  alibi MMDDrift     alibi-detect's MMD on the same 384-d hashing vectors (few windows: it is slow)

Held-out sets (each in turn absent from the reference; the window takes p of its queries from it):
  clinc150   each of its 10 domains (15 intents each): "new domain"; out-of-scope queries: "oos"
  banking77  10 seeded pairs of intents: "2 new intents"; 5 seeded groups of 10 intents, 1 % of
             the window each at p = 10 %: "10 new intents" (diffuse)
No-shift windows come from the same pool as their reference (the held-out sets in rotation).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from measure import Tally, measure, rate
from queries import QuerySet, embed_hashing, load_banking77, load_clinc150

from detectors.base import Reference, Window
from detectors.mmd import MmdDrift
from detectors.text_knn import TextKnnDrift

ALPHA = 0.05
T0 = datetime(2024, 1, 1, tzinfo=UTC)
RESULTS = Path(__file__).resolve().parents[1] / "RESULTS.md"
START, END = "<!-- drift-text:start -->", "<!-- drift-text:end -->"
N_REFERENCE = 5000
TARGET_N = 2000
TARGET_SHARE = 0.10


@dataclass(frozen=True)
class Plan:
    null_reps: int
    shift_reps: int
    curve_sizes: tuple[int, ...]
    curve_reps: int
    peer_reps: int
    mmd_null_reps: int
    text_only: bool = False
    """Only the service's query test (no hashing MMD, no peer)."""


SMOKE = Plan(null_reps=2, shift_reps=1, curve_sizes=(250,), curve_reps=1, peer_reps=1, mmd_null_reps=2)
QUICK = Plan(null_reps=30, shift_reps=4, curve_sizes=(250, 1000), curve_reps=2, peer_reps=1, mmd_null_reps=30)
FULL = Plan(
    null_reps=150,
    shift_reps=10,
    curve_sizes=(250, 500, 1000),
    curve_reps=5,
    peer_reps=2,
    mmd_null_reps=150,
)
"""300 no-shift windows in all (150 per query set); sized for about half an hour on 2 shared cores."""
POWER = replace(FULL, null_reps=0, peer_reps=0, mmd_null_reps=0, text_only=True)
"""The shifted windows and the power curve of FULL for the service's query test alone (no-shift windows
come from --null-splits)."""


@dataclass(frozen=True)
class HeldOut:
    name: str
    kind: str
    mask: npt.NDArray[np.bool_]


def held_out_sets(queries: QuerySet) -> list[HeldOut]:
    """The query groups that are, in turn, absent from the reference (see the module docstring)."""
    if queries.name == "clinc150":
        sets = [
            HeldOut(d, "new domain", queries.domains == d) for d in sorted(set(queries.domains) - {"oos"})
        ]
        return [*sets, HeldOut("oos", "oos", queries.domains == "oos")]
    intents = np.array(sorted(set(queries.intents)))
    sets = []
    for g in range(10):
        pair = np.random.default_rng([77, g]).choice(intents, 2, replace=False)
        sets.append(HeldOut("+".join(sorted(pair)), "2 new intents", np.isin(queries.intents, pair)))
    for g in range(5):
        group = np.random.default_rng([770, g]).choice(intents, 10, replace=False)
        sets.append(HeldOut(f"group {g + 1}", "10 new intents", np.isin(queries.intents, group)))
    return sets


def base_pool(queries: QuerySet, held: HeldOut) -> npt.NDArray[np.intp]:
    return np.flatnonzero(~held.mask & (queries.domains != "oos"))


def draw(
    rng: np.random.Generator, base: npt.NDArray[np.intp], pool: npt.NDArray[np.intp], n: int, share: float
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Indices of one reference (N_REFERENCE) and one window of n queries, without replacement."""
    shifted = round(share * n)
    picked = rng.choice(base, N_REFERENCE + n - shifted, replace=False)
    window = picked[N_REFERENCE:]
    if shifted:
        window = np.concatenate([window, rng.choice(pool, shifted, replace=shifted > pool.size)])
    return picked[:N_REFERENCE], window


TEXT, TEXT_KNN = "ragmon text", "ragmon text k-NN"
"""The service's query test (k-NN + novelty, min-p) and its k-NN statistic alone, from one call."""


def null_draw(
    queries: QuerySet, sets: list[HeldOut], rep: int
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """No-shift split number `rep`: reference and window from the pool without one held-out set (in turn)."""
    held = sets[rep % len(sets)]
    if held.kind == "oos":
        held = sets[(rep + 1) % len(sets)]
    rng = np.random.default_rng([1, rep])
    return draw(rng, base_pool(queries, held), np.flatnonzero(held.mask), TARGET_N, 0.0)


Test = Callable[[npt.NDArray[np.intp], npt.NDArray[np.intp], int], dict[str, bool]]
"""One call of a test on (reference, window, seed): whether each test it reports alarmed."""


def text_p_values(texts: npt.NDArray[np.str_], ref: Any, win: Any, seed: int) -> dict[str, float]:
    """The p-values of the service's query test and of its k-NN and novelty statistics alone."""
    detector = TextKnnDrift(alpha=ALPHA, seed=seed).fit(Reference("b", texts[ref], T0, T0))
    result = detector.score(Window(texts[win], T0, T0))
    details = result.details
    return {
        TEXT: float(result.p_value or 1.0),
        TEXT_KNN: float(details["knn_p_value"]),  # type: ignore[arg-type]
        "novelty": float(details["novelty_p_value"]),  # type: ignore[arg-type]
    }


def tests(queries: QuerySet, vectors: npt.NDArray[np.float32]) -> dict[str, Test]:
    def text(ref: npt.NDArray[np.intp], win: npt.NDArray[np.intp], seed: int) -> dict[str, bool]:
        found = text_p_values(queries.texts, ref, win, seed)
        return {TEXT: found[TEXT] <= ALPHA, TEXT_KNN: found[TEXT_KNN] <= ALPHA}

    def hash_mmd(ref: npt.NDArray[np.intp], win: npt.NDArray[np.intp], seed: int) -> dict[str, bool]:
        detector = MmdDrift(alpha=ALPHA, seed=seed).fit(Reference("b", vectors[ref], T0, T0))
        return {"ragmon MMD (hash)": detector.score(Window(vectors[win], T0, T0)).drifted}

    found: dict[str, Test] = {TEXT: text, "ragmon MMD (hash)": hash_mmd}
    try:
        import torch
        from alibi_detect.cd import MMDDrift
    except ImportError:
        return found
    torch.set_num_threads(1)

    def alibi_mmd(ref: npt.NDArray[np.intp], win: npt.NDArray[np.intp], seed: int) -> dict[str, bool]:
        torch.manual_seed(seed)
        # alibi keeps its whole reference in the kernel; give it the 2,500 rows ragmon's MMD uses.
        detector = MMDDrift(vectors[ref[:2500]], backend="pytorch", p_val=ALPHA, device="cpu")
        return {"alibi MMDDrift (hash)": bool(detector.predict(vectors[win])["data"]["is_drift"])}

    found["alibi MMDDrift (hash)"] = alibi_mmd
    return found


Key = tuple[str, str, str, int, float]
"""(test, held-out set or "none", kind, n, share)."""


def run_set(name: str, plan: Plan) -> tuple[dict[Key, Tally], list[str], float]:
    """Every window of one query set, in one process (one core: BLAS and PyTorch on one thread)."""
    queries = load_clinc150() if name == "clinc150" else load_banking77()
    if queries is None:
        return {}, [], 0.0
    vectors, throughput = embed_hashing(queries.texts)
    available = tests(queries, vectors)
    if plan.text_only:
        available = {TEXT: available[TEXT]}
    tallies: dict[Key, Tally] = defaultdict(Tally)
    sets = held_out_sets(queries)
    log: list[str] = []

    def trial(test: str, held: str, kind: str, n: int, share: float, ref: Any, win: Any, seed: int) -> None:
        alarms, measured = measure(lambda: available[test](ref, win, seed))
        for name, drifted in alarms.items():
            tallies[(name, held, kind, n, share)].add(drifted, measured)

    started = time.perf_counter()
    for rep in range(plan.null_reps):
        ref, win = null_draw(queries, sets, rep)
        trial(TEXT, "none", "none", TARGET_N, 0.0, ref, win, rep)
        if rep < plan.mmd_null_reps and "ragmon MMD (hash)" in available:
            trial("ragmon MMD (hash)", "none", "none", TARGET_N, 0.0, ref, win, rep)
        if rep < plan.peer_reps and "alibi MMDDrift (hash)" in available:
            trial("alibi MMDDrift (hash)", "none", "none", TARGET_N, 0.0, ref, win, rep)
    log.append(f"{name}: {plan.null_reps} no-shift windows in {time.perf_counter() - started:.0f} s")
    for index, held in enumerate(sets):
        started = time.perf_counter()
        pool, base = np.flatnonzero(held.mask), base_pool(queries, held)
        for rep in range(plan.shift_reps):
            rng = np.random.default_rng([2, index, rep])
            ref, win = draw(rng, base, pool, TARGET_N, TARGET_SHARE)
            for test in (t for t in (TEXT, "ragmon MMD (hash)") if t in available):
                trial(test, held.name, held.kind, TARGET_N, TARGET_SHARE, ref, win, rep)
            if rep < plan.peer_reps and index == 0 and "alibi MMDDrift (hash)" in available:
                trial("alibi MMDDrift (hash)", held.name, held.kind, TARGET_N, TARGET_SHARE, ref, win, rep)
        if held.kind in ("new domain", "2 new intents"):
            for n in plan.curve_sizes:
                for rep in range(plan.curve_reps):
                    rng = np.random.default_rng([3, index, n, rep])
                    ref, win = draw(rng, base, pool, n, TARGET_SHARE)
                    trial(TEXT, held.name, held.kind, n, TARGET_SHARE, ref, win, rep)
        log.append(f"{name}: held-out {held.name} in {time.perf_counter() - started:.0f} s")
        print(log[-1], file=sys.stderr, flush=True)
    return dict(tallies), log, throughput


def _single_thread() -> None:
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = "1"


def _median(values: list[float]) -> float:
    return float(np.median(values)) if values else float("nan")


def report(name: str, source: str, tallies: dict[Key, Tally], throughput: float, out: list[str]) -> None:
    out.append(f"\n#### {name} ({source})\n")
    out.append(f"Built-in hashing embedder: {throughput:,.0f} queries/s.\n")
    out.append(f"False alarms under no shift at n = {TARGET_N:,} (alpha = {ALPHA}), 95 % Clopper–Pearson:\n")
    out.append("| test | false-alarm rate |")
    out.append("|---|---|")
    for test in sorted({k[0] for k in tallies}):
        tally = tallies.get((test, "none", "none", TARGET_N, 0.0))
        if tally and tally.trials:
            out.append(f"| {test} | {rate(tally.alarms, tally.trials)} |")
    out.append(f"\nPower at n = {TARGET_N:,}, {TARGET_SHARE:.0%} of the window from the held-out set:\n")
    columns = (TEXT, TEXT_KNN, "ragmon MMD (hash)", "alibi MMDDrift (hash)")
    out.append("| held-out set | kind | " + " | ".join(columns) + " |")
    out.append("|---|---|" + "---|" * len(columns))
    held_names = sorted({(k[2], k[1]) for k in tallies if k[1] != "none"}, key=lambda x: (x[0], x[1]))
    for kind, held in held_names:
        cells = []
        for test in columns:
            tally = tallies.get((test, held, kind, TARGET_N, TARGET_SHARE))
            cells.append(f"{tally.alarms}/{tally.trials}" if tally and tally.trials else "–")
        out.append(f"| {held} | {kind} | " + " | ".join(cells) + " |")
    for kind in sorted({k for k, _ in held_names}):
        cells = []
        for test in columns[:3]:
            merged = Tally()
            for key, tally in tallies.items():
                if key[0] == test and key[2] == kind and key[3] == TARGET_N:
                    merged.merge(tally)
            cells.append(str(rate(merged.alarms, merged.trials)) if merged.trials else "–")
        out.append(f"| **all {kind}** | {kind} | " + " | ".join(cells) + " | |")


def curve(all_tallies: dict[str, dict[Key, Tally]], sizes: tuple[int, ...], out: list[str]) -> None:
    """The power curve of the text test over the new-intent sets of every query set (POWER_CURVES)."""
    points = []
    out.append(
        f"\nPower curve of ragmon text, {TARGET_SHARE:.0%} new intents (clinc150 new domains and "
        f"banking77 intent pairs together; reference {N_REFERENCE:,}: 1,000 fit the embedder, 4,000 are "
        "compared):\n"
    )
    out.append("| n | power, 95 % interval (windows) |")
    out.append("|---|---|")
    for n in (*sizes, TARGET_N):
        merged = Tally()
        for tallies in all_tallies.values():
            for key, tally in tallies.items():
                if key[0] == TEXT and key[3] == n and key[2] in ("new domain", "2 new intents"):
                    merged.merge(tally)
        if merged.trials:
            out.append(f"| {n:,} | {rate(merged.alarms, merged.trials)} |")
            points.append((n, round(merged.alarms / merged.trials, 2), merged.trials))
    out.append(f"\n`detectors/power.py` POWER_CURVES points: `{tuple(points)}`")


def timing(all_tallies: dict[str, dict[Key, Tally]], out: list[str]) -> None:
    out.append(
        "\nTime and peak memory per window (fit + score, one core; RSS growth), all windows of that size:\n"
    )
    out.append("| test | n | median s | max s | median peak MB | max peak MB | windows |")
    out.append("|---|---|---|---|---|---|---|")
    per: dict[tuple[str, int], Tally] = defaultdict(Tally)
    for tallies in all_tallies.values():
        for (test, _, _, n, _), tally in tallies.items():
            per[(test, n)].merge(tally)
    for (test, n), tally in sorted(per.items()):
        if test == TEXT_KNN:
            continue  # the same calls as TEXT
        peaks = [p / 1e6 for p in tally.peaks]
        out.append(
            f"| {test} | {n:,} | {_median(tally.times):.2f} | {max(tally.times):.2f} | "
            f"{_median(peaks):.0f} | {max(peaks):.0f} | {len(tally.times)} |"
        )
    ours = per.get((TEXT, TARGET_N))
    old = per.get(("ragmon MMD (hash)", TARGET_N))
    peer = per.get(("alibi MMDDrift (hash)", TARGET_N))
    out.append("\nRatios at n = 2,000 (medians):\n")
    if ours and peer:
        out.append(
            "* alibi MMDDrift / ragmon text: wall time "
            f"{_median(peer.times) / _median(ours.times):.1f}×, peak memory "
            f"{_median(peer.peaks) / max(1.0, _median(ours.peaks)):.1f}×"
        )
    if ours and old:
        out.append(
            f"* ragmon text / ragmon MMD (hash): wall time {_median(ours.times) / _median(old.times):.1f}×"
        )


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") != "131072":
        # A fixed mmap threshold makes glibc hand large arrays back to the OS when they are freed, so
        # the RSS growth of one call is its own peak and not hidden by memory kept from earlier calls.
        os.environ["MALLOC_MMAP_THRESHOLD_"] = "131072"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="few windows (default)")
    mode.add_argument("--full", action="store_true", help="the recorded run: 300 no-shift windows in all")
    mode.add_argument("--smoke", action="store_true", help="a handful of windows: checks the script runs")
    mode.add_argument("--power", action="store_true", help="--full's shifted windows, the text test alone")
    parser.add_argument("--jobs", type=int, default=2, help="query sets run in parallel, one core each")
    parser.add_argument("--write", action="store_true", help="rewrite the drift section of bench/RESULTS.md")
    args = parser.parse_args(argv)
    plan = FULL if args.full else SMOKE if args.smoke else POWER if args.power else QUICK
    names = [n for n, q in (("clinc150", load_clinc150()), ("banking77", load_banking77())) if q is not None]
    if not names:
        print("skipped: neither clinc150 (../shared/data) nor banking77 (bench/drift/banking77.py) found")
        return 0
    command = "python bench/drift/run.py " + " ".join(argv if argv is not None else sys.argv[1:])
    started = time.perf_counter()
    _single_thread()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = dict(zip(names, pool.map(run_set, names, [plan] * len(names)), strict=True))
    elapsed = time.perf_counter() - started
    out = [
        f"Command: `{command}` ({time.strftime('%Y-%m-%d')}; {len(names)} query sets, {max(1, args.jobs)} at "
        f"a time, one core each, on a 2-core machine shared with other work; took {elapsed / 60:.0f} min; "
        f"alpha = {ALPHA})."
    ]
    missing = {"clinc150", "banking77"} - set(names)
    if missing:
        out.append(f"\nNot run (data absent): {', '.join(sorted(missing))}.")
    sources = {"clinc150": load_clinc150(), "banking77": load_banking77()}
    for name, (tallies, _, throughput) in results.items():
        source = sources[name]
        report(name, source.source if source else name, tallies, throughput, out)
    curve({name: r[0] for name, r in results.items()}, plan.curve_sizes, out)
    timing({name: r[0] for name, r in results.items()}, out)
    text = "\n".join(out)
    print(text)
    if args.write:
        write_results(text)
    return 0


SETUP = """Peers run in a separate venv, never in the project's:

```
python3 -m venv /tmp/bench-drift
/tmp/bench-drift/bin/pip install torch 'alibi-detect[torch]' numpy scipy
/tmp/bench-drift/bin/pip install --no-deps -e .
python bench/drift/banking77.py /path/to/task-specific-datasets/.git   # banking77, outside the repo
/tmp/bench-drift/bin/python bench/drift/run.py --full --write
```

Data: clinc150 (CC BY 3.0, Larson et al. 2019, all splits, read from ../shared/data) and banking77 (CC BY 4.0,
Casanueva et al. 2020, train + test, 13,083 queries, built by `bench/drift/banking77.py` from a snapshot of
github.com/PolyAI-LDN/task-specific-datasets). Every window compares a reference of 5,000 queries with a
window of n; a held-out set is absent from the reference and makes up p = 10 % of a shifted window. The query
test the service runs when it embeds queries itself is `TextKnnDrift` (ragmon text k-NN): it fits its TF-IDF
embedder on a seeded fifth of the reference (1,000 rows), compares the window with the other 4,000, and links
each query to its 10 nearest neighbours (200 permutations). The test it replaces, `MmdDrift` on the 384-d
hashing embedder (ragmon MMD (hash)), and alibi-detect's MMDDrift (PyTorch, CPU, its defaults: 100
permutations) on the same hashing vectors run on the same windows; alibi only on the first windows (it is
slow)."""


def write_results(text: str) -> None:
    section = f"{START}\n## Drift detection on query texts (bench/drift/run.py)\n\n{SETUP}\n\n{text}\n{END}"
    current = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    if START in current and END in current:
        before, rest = current.split(START, 1)
        _, after = rest.split(END, 1)
        current = before + section + after
    else:
        current = current.rstrip() + "\n\n" + section + "\n"
    RESULTS.write_text(current)


if __name__ == "__main__":
    sys.exit(main())
