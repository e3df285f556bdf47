"""The offline heuristic judge against a word-overlap baseline on the labelled dev set, per source.

The dev set comes from `build_devset.py` (five public sources: QA, two summarization sets,
dialogue, long-form; split by source group into `tune` and `test` halves). A row counts as
judged faithful when the judge finds no unsupported claim (faithfulness 1, or no claims).

The baseline is a plain word-overlap ratio: the share of the answer's words (lower-cased,
stopwords left out) that occur anywhere in the context, faithful at or above one threshold,
chosen to maximise balanced accuracy on the `tune` rows of all sources together. The judge's
thresholds were chosen on the same `tune` rows; the numbers that count are the `test` rows.

Reported per source and overall: balanced accuracy (mean of the rate of faithful answers kept
and of unfaithful answers caught) and the false-approval rate (unfaithful answers judged
faithful), each with a 95 % percentile bootstrap interval that resamples groups (a question's
two answers, a document's summaries) within each source.

    python bench/judge/devset_accuracy.py [--data PATH] [--split test|tune|all] [--boot 2000]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from service.judge.heuristic import HeuristicJudge
from service.judge.learned import LearnedJudge

DEFAULT_DATA = Path.home() / ".cache" / "ragmon" / "judge_devset" / "devset.jsonl"
_BASELINE_STOPWORDS = frozenset(
    {
        "a",
        "an",
        "the",
        "and",
        "or",
        "but",
        "of",
        "to",
        "in",
        "on",
        "at",
        "for",
        "with",
        "by",
        "from",
        "as",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "it",
        "its",
        "this",
        "that",
        "these",
        "those",
        "he",
        "she",
        "they",
        "we",
        "you",
        "i",
        "his",
        "her",
        "their",
        "our",
        "your",
        "my",
        "me",
        "him",
        "them",
        "us",
        "not",
        "no",
        "do",
        "does",
        "did",
        "has",
        "have",
        "had",
        "will",
        "would",
        "can",
        "could",
        "should",
        "may",
        "might",
        "must",
        "so",
        "if",
        "then",
        "than",
        "there",
        "here",
        "what",
        "which",
        "who",
        "whom",
        "when",
        "where",
        "why",
        "how",
        "all",
        "any",
        "some",
    }
)
_WORD = re.compile(r"\w+")


def overlap_ratio(contexts: list[str], answer: str) -> float:
    """Share of the answer's non-stopword words that occur in the context (1.0 for an answer without any)."""
    context = set(_WORD.findall(" ".join(contexts).lower()))
    words = [w for w in _WORD.findall(answer.lower()) if w not in _BASELINE_STOPWORDS]
    return sum(w in context for w in words) / len(words) if words else 1.0


def balanced(pred: np.ndarray, label: np.ndarray) -> float:
    return float((pred[label].mean() + (~pred[~label]).mean()) / 2)


def false_approval(pred: np.ndarray, label: np.ndarray) -> float:
    return float(pred[~label].mean())


def tune_threshold(score: np.ndarray, label: np.ndarray) -> float:
    """The threshold t (faithful when score >= t) with the best balanced accuracy on these rows."""
    candidates = np.unique(score)
    accuracies = [balanced(score >= t, label) for t in candidates]
    return float(candidates[int(np.argmax(accuracies))])


def _group_resamples(
    label: np.ndarray, strata: list[np.ndarray], n_boot: int, seed: int
) -> Iterator[np.ndarray]:
    """The row indexes of `n_boot` bootstrap resamples (groups drawn with replacement within each
    source), skipping those that hold one class only."""
    rng = np.random.default_rng(seed)
    for _ in range(n_boot):
        rows = np.concatenate(
            [
                np.concatenate([groups[i] for i in rng.integers(0, len(groups), len(groups))])
                for groups in strata
            ]
        )
        if label[rows].all() or not label[rows].any():
            continue
        yield rows


def bootstrap(
    pred: np.ndarray, label: np.ndarray, strata: list[np.ndarray], n_boot: int, seed: int = 7
) -> tuple[tuple[float, float], tuple[float, float]]:
    """95 % intervals of (balanced accuracy, false approval); `strata` lists each source's row
    indexes per group, resampled groups within source."""
    ba, fa = [], []
    for rows in _group_resamples(label, strata, n_boot, seed):
        ba.append(balanced(pred[rows], label[rows]))
        fa.append(false_approval(pred[rows], label[rows]))
    return (
        (float(np.percentile(ba, 2.5)), float(np.percentile(ba, 97.5))),
        (float(np.percentile(fa, 2.5)), float(np.percentile(fa, 97.5))),
    )


def paired_difference(
    first: np.ndarray,
    second: np.ndarray,
    label: np.ndarray,
    strata: list[np.ndarray],
    n_boot: int,
    seed: int = 7,
) -> tuple[float, float]:
    """95 % interval of balanced accuracy (first) - (second) over the same group resamples."""
    diffs = []
    for rows in _group_resamples(label, strata, n_boot, seed):
        diffs.append(balanced(first[rows], label[rows]) - balanced(second[rows], label[rows]))
    return float(np.percentile(diffs, 2.5)), float(np.percentile(diffs, 97.5))


def group_index(rows: list[dict[str, object]], mask: np.ndarray) -> list[np.ndarray]:
    groups: dict[str, list[int]] = {}
    for i in np.flatnonzero(mask):
        groups.setdefault(str(rows[i]["group"]), []).append(int(i))
    return [np.array(v) for v in groups.values()]


def source_table(
    rows: list[dict[str, object]],
    source: np.ndarray,
    label: np.ndarray,
    chosen: np.ndarray,
    predictions: tuple[np.ndarray, ...],
    boot: int,
) -> list[str]:
    """Print a table row per source and overall (rows, then each prediction's balanced accuracy and
    false approval with group-bootstrap intervals, over the `chosen` rows); returns the paired
    difference of the first prediction's balanced accuracy against the second's, per row."""
    first, second = predictions[0], predictions[1]
    differences: list[str] = []
    for name in [*sorted(set(source)), "overall"]:
        mask = chosen & (source == name) if name != "overall" else chosen
        strata = [group_index(rows, mask & (source == s)) for s in sorted(set(source[mask]))]
        cells = []
        for pred in predictions:
            (ba_lo, ba_hi), (fa_lo, fa_hi) = bootstrap(pred, label, strata, boot)
            ba, fa = balanced(pred[mask], label[mask]), false_approval(pred[mask], label[mask])
            cells += [f"{ba:.3f} [{ba_lo:.3f}, {ba_hi:.3f}]", f"{fa:.3f} [{fa_lo:.3f}, {fa_hi:.3f}]"]
        print(f"| {name} | {int(mask.sum())} ({int(label[mask].sum())}) | " + " | ".join(cells) + " |")
        lo, hi = paired_difference(first, second, label, strata, boot)
        diff = balanced(first[mask], label[mask]) - balanced(second[mask], label[mask])
        differences.append(f"{name}: {diff:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    return differences


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--split", choices=("test", "tune", "all"), default="test")
    parser.add_argument("--boot", type=int, default=2000)
    parser.add_argument("--errors", type=int, default=0, help="print this many misjudged rows per source")
    args = parser.parse_args()
    if not args.data.exists():
        print(f"no dev set at {args.data}: run bench/judge/build_devset.py first", file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in args.data.read_text("utf-8").splitlines() if line.strip()]
    label = np.array([bool(r["label_faithful"]) for r in rows])
    split = np.array([r["split"] for r in rows])
    source = np.array([r["source"] for r in rows])

    judge = HeuristicJudge()
    started = time.process_time()
    verdicts = [judge.verdict(r["question"], r["contexts"], r["answer"]) for r in rows]
    cpu_ms = (time.process_time() - started) / len(rows) * 1e3
    heuristic = np.array([not v.unsupported for v in verdicts])
    learned_judge = LearnedJudge()
    started = time.process_time()
    learned = np.array(
        [not learned_judge.verdict(r["question"], r["contexts"], r["answer"]).unsupported for r in rows]
    )
    learned_ms = (time.process_time() - started) / len(rows) * 1e3
    ratio = np.array([overlap_ratio(r["contexts"], r["answer"]) for r in rows])
    threshold = tune_threshold(ratio[split == "tune"], label[split == "tune"])
    baseline = ratio >= threshold

    chosen = np.ones(len(rows), bool) if args.split == "all" else split == args.split
    print(
        f"dev set {args.data}: {len(rows)} rows; "
        f"reporting the {args.split} split ({int(chosen.sum())} rows). "
        f"{judge.version}, {cpu_ms:.2f} ms CPU a row; {learned_judge.version} (trained on: "
        f"{learned_judge.model.training['data']}, {learned_judge.model.training['data_sha256'][:12]}; "
        "a model trained on test rows is not tested by them), "
        f"{learned_ms:.2f} ms CPU a row; "
        f"baseline: word-overlap ratio >= {threshold:.3f} (tuned on the tune split)"
    )
    print(
        f"| source | rows (faithful) | {learned_judge.version} balanced acc. "
        f"| {learned_judge.version} false approval "
        f"| {judge.version} balanced acc. | {judge.version} false approval "
        "| baseline balanced acc. | baseline false approval |"
    )
    print("|---|---|---|---|---|---|---|---|")
    differences = source_table(rows, source, label, chosen, (learned, heuristic, baseline), args.boot)
    print(
        f"{learned_judge.version} - {judge.version}, balanced accuracy (paired bootstrap): "
        + "; ".join(differences)
    )
    if args.errors:
        for name in sorted(set(source)):
            wrong = np.flatnonzero(chosen & (source == name) & (heuristic != label))
            for i in wrong[: args.errors]:
                r, v = rows[i], verdicts[i]
                print(
                    f"\n[{name}] label={r['label_faithful']} judged={heuristic[i]} q={r['question'][:100]!r}"
                )
                print(f"  answer: {r['answer'][:300]!r}")
                print(f"  unsupported: {[v.claims[k] for k in v.unsupported]} ({v.failure_mode})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
