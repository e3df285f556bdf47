"""CPU of the offline heuristic judge's verdict, with contexts that share chunks and without.

Most of a heuristic verdict is reading the context (`service.judge.text.ContextIndex`). A RAG
app's retriever returns a knowledge base's popular chunks again and again, and each chunk is
read once now (`_read_chunk`). Two workloads from the HaluEval QA dev rows in
`../shared/data/faithfulness` (2,000 questions, answers and contexts):

* `distinct`: each row as it is, no chunk repeated: the worst case for the cache;
* `zipf`: each row's question and answer with a context of five chunks drawn from every row's
  chunks by a Zipf(s) popularity (rank r weighs 1/r^s), the shape retrieval logs usually take.

Prints the verdict's CPU per judgment for this tree and, with `--baseline-src`, for another
tree in the same run (rounds alternate which goes first), and the ratio.

    python bench/judge/context_index.py [--baseline-src /tmp/old] [--rounds 3] [--zipf 1.1]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data" / "faithfulness" / "halueval_qa_dev.jsonl"


Judgments = list[tuple[str, list[str], str]]  # (question, context chunks, answer)


def _workloads(rows: list[dict[str, Any]], s: float, seed: int) -> dict[str, Judgments]:
    chunks = sorted({c for r in rows for c in r["contexts"]})
    rng = random.Random(seed)
    rng.shuffle(chunks)  # which chunk is popular: not alphabetical
    weights = [1.0 / (rank + 1) ** s for rank in range(len(chunks))]
    zipf = [(str(r["question"]), rng.choices(chunks, weights=weights, k=5), str(r["answer"])) for r in rows]
    distinct = [(str(r["question"]), list(r["contexts"]), str(r["answer"])) for r in rows]
    return {"distinct": distinct, "zipf": zipf}


def _measure(src: Path, work_file: Path) -> float:
    """ms of CPU per verdict over the judgments in `work_file`, in a fresh process running `src`'s judge."""
    code = f"""
import json, sys, time
sys.path.insert(0, {str(src)!r})
from service.judge.heuristic import HeuristicJudge
work = json.load(open({str(work_file)!r}))
judge = HeuristicJudge()
started = time.process_time()
for question, context, answer in work:
    judge.verdict(question, context, answer, [])
print((time.process_time() - started) / len(work) * 1e3)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--baseline-src", type=Path, help="another ragmon tree to measure in the same run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--zipf", type=float, default=1.1, help="the popularity exponent s")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data", type=Path, default=DATA, help="HaluEval QA dev rows (JSON lines)")
    args = parser.parse_args(argv)
    if not args.data.exists():
        print(f"skipped: {args.data} is absent (../shared/data holds the HaluEval QA dev rows)")
        return 0
    rows = [json.loads(line) for line in args.data.open()]
    workloads = _workloads(rows, args.zipf, args.seed)
    zipf = workloads["zipf"]
    shown = sum(len(context) for _, context, _ in zipf)
    print(
        f"{len(rows)} judgments a workload; zipf s={args.zipf}: {len({c for _, x, _ in zipf for c in x})} "
        f"distinct chunks of {shown} shown"
    )
    trees = {"this tree": ROOT, **({"baseline": args.baseline_src} if args.baseline_src else {})}
    results: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="ragmon-verdicts-") as tmp:
        files = {name: Path(tmp) / f"{name}.json" for name in workloads}
        for name, work in workloads.items():
            files[name].write_text(json.dumps(work))
        for round_ in range(args.rounds):
            order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
            for workload in ("distinct", "zipf"):
                for name in order:
                    results.setdefault((name, workload), []).append(_measure(trees[name], files[workload]))
    print(
        "| workload | "
        + " | ".join(f"{name}: ms of CPU a verdict (median)" for name in trees)
        + " |"
        + (" this / baseline |" if args.baseline_src else "")
    )
    print("|---|" + "---:|" * (len(trees) + (1 if args.baseline_src else 0)))
    for workload in ("distinct", "zipf"):
        medians = [statistics.median(results[(name, workload)]) for name in trees]
        ratio = f" {medians[0] / medians[1]:.2f} |" if args.baseline_src else ""
        print(f"| {workload} | " + " | ".join(f"{m:.3f}" for m in medians) + " |" + ratio)
    return 0


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"({time.monotonic() - started:.0f} s)")
    raise SystemExit(code)
