"""Balanced accuracy of the offline heuristic judge on HaluEval QA (shared data), with 95 % intervals.

A row counts as judged faithful when the heuristic finds every claim supported
(faithfulness 1, or no claims). Balanced accuracy = mean of the true-positive
rate on faithful rows and the true-negative rate on unfaithful rows; its
interval is a percentile bootstrap that resamples question pairs (each question
has one faithful and one hallucinated answer). Also reported per class with
Wilson intervals, on the two halves split by question id parity (the
thresholds were chosen by reasoning before the first run and not tuned), and
the answer-length baseline that shows the dataset's style confound.

`--judge learned` measures the learned offline judge instead. learned/2 was trained on the dev set's
`tune` half, which holds 150 of this file's questions: the rows of those questions are reported
apart as well ("outside the tune half"), read from the dev set when it is there. learned/3 was
trained on all nine sources of `loso.py`'s set, 250 of this file's questions among them: for it,
only `loso.py`'s held-out figures count.

    python bench/judge/heuristic_accuracy.py [--data PATH] [--boot 2000] [--judge heuristic|learned]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import norm

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from service.judge.heuristic import HeuristicJudge
from service.judge.learned import LearnedJudge

DEFAULT_DATA = (
    Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "faithfulness" / "halueval_qa_dev.jsonl"
)


def wilson(k: int, n: int, z: float = float(norm.ppf(0.975))) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def balanced(pred: np.ndarray, label: np.ndarray) -> float:
    return float((pred[label].mean() + (~pred[~label]).mean()) / 2)


def bootstrap(
    pred: np.ndarray, label: np.ndarray, group: np.ndarray, n_boot: int, seed: int
) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    groups = np.unique(group)
    index = {g: np.flatnonzero(group == g) for g in groups}
    stats = []
    for _ in range(n_boot):
        rows = np.concatenate([index[g] for g in rng.choice(groups, size=len(groups))])
        stats.append(balanced(pred[rows], label[rows]))
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return float(lo), float(hi)


def report(name: str, pred: np.ndarray, label: np.ndarray, group: np.ndarray, n_boot: int) -> None:
    tp, pos = int(pred[label].sum()), int(label.sum())
    tn, neg = int((~pred[~label]).sum()), int((~label).sum())
    lo, hi = bootstrap(pred, label, group, n_boot, seed=7)
    tpr_lo, tpr_hi = wilson(tp, pos)
    tnr_lo, tnr_hi = wilson(tn, neg)
    print(
        f"{name:<34} n={len(label):>4}  balanced accuracy {balanced(pred, label):.3f} [{lo:.3f}, {hi:.3f}]  "
        f"TPR {tp / pos:.3f} [{tpr_lo:.3f}, {tpr_hi:.3f}]  TNR {tn / neg:.3f} [{tnr_lo:.3f}, {tnr_hi:.3f}]"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    env = os.environ.get("RAGMON_SHARED_DATA")
    default = Path(env) / "faithfulness" / "halueval_qa_dev.jsonl" if env else DEFAULT_DATA
    parser.add_argument("--data", type=Path, default=default)
    parser.add_argument("--boot", type=int, default=2000)
    parser.add_argument("--judge", choices=("heuristic", "learned"), default="heuristic")
    parser.add_argument(
        "--devset", type=Path, default=Path.home() / ".cache" / "ragmon" / "judge_devset" / "devset.jsonl"
    )
    args = parser.parse_args()
    if not args.data.exists():
        print(f"no data at {args.data} (set RAGMON_SHARED_DATA)", file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in args.data.read_text("utf-8").splitlines() if line.strip()]
    judge = LearnedJudge() if args.judge == "learned" else HeuristicJudge()
    started = time.process_time()
    verdicts = [judge.verdict(r["question"], r["contexts"], r["answer"]) for r in rows]
    cpu = time.process_time() - started
    label = np.array([bool(r["label_faithful"]) for r in rows])
    pred = np.array([not v.unsupported for v in verdicts])
    group = np.array([int(re.search(r"-(\d+)-", r["id"]).group(1)) for r in rows])  # type: ignore[union-attr]
    words = np.array([len(r["answer"].split()) for r in rows])

    print(f"HaluEval QA dev: {len(rows)} rows, {int(label.sum())} faithful; judge {judge.version}")
    print(f"CPU {cpu / len(rows) * 1e3:.2f} ms per row")
    report(f"{args.judge} (all rows)", pred, label, group, args.boot)
    for parity, name in ((0, "even question ids"), (1, "odd question ids")):
        mask = group % 2 == parity
        report(f"{args.judge} ({name})", pred[mask], label[mask], group[mask], args.boot)
    if args.devset.exists():
        tune = {
            int(r["group"])
            for line in args.devset.read_text("utf-8").splitlines()
            if line.strip() and (r := json.loads(line))["source"] == "halueval_qa" and r["split"] == "tune"
        }
        outside = ~np.isin(group, sorted(tune))
        report(
            f"{args.judge} (outside the tune half, {len(tune)} questions)",
            pred[outside],
            label[outside],
            group[outside],
            args.boot,
        )
    report("baseline: answer <= 3 words", words <= 3, label, group, args.boot)
    long = words >= 4  # where answer style no longer gives the label away
    report(f"{args.judge} (answers >= 4 words)", pred[long], label[long], group[long], args.boot)
    modes: dict[str, int] = {}
    for v in verdicts:
        modes[v.failure_mode] = modes.get(v.failure_mode, 0) + 1
    print("failure modes:", dict(sorted(modes.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
