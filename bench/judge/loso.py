"""Leave-one-source-out validation of the offline judge candidates, and the choice of the default.

The data is `build_devset.py`'s leave-one-source-out set (`sources.jsonl`: nine public sources of
five kinds, at most 500 rows each). For every source in turn, each trained candidate is trained on
the other eight and judges the one left out; nothing of the held-out source is seen in training,
in the choice of settings or in the choice of a threshold. The candidates:

* `heuristic`: the rules (`service/judge/heuristic.py`), trained on nothing;
* `overlap`: the word-overlap baseline of `devset_accuracy.py` (share of the answer's words found in
  the context), its one threshold chosen on the eight training sources (best pooled balanced accuracy);
* `learned`: `train_learned.py`'s recipe on the eight training sources: boosted stumps on the
  claim features (`features.py`), rows weighted so each (source, label) cell weighs the same,
  stumps and rate from `GRID` and the threshold chosen on 5-fold out-of-fold scores over groups
  (pooled balanced accuracy), plus the set veto stump;
* `learned-noveto`: the same fits without the veto stump;
* `learned-worst`: the same fits and out-of-fold scores, the threshold chosen for the best
  worst-source balanced accuracy among the training sources;
* `learned-sources`: settings and threshold chosen by an inner leave-one-source-out over the eight
  training sources (each training source scored by a model that never saw it), threshold and
  settings for the best worst-source balanced accuracy there: the recipe aimed at unseen sources.

Also shown with `--reference MODEL.json`, not a candidate: a learned model file as it is (the
summary's column is learned/2, the default before this table: `git show
fc09776:service/judge/learned_judge.json`), which for sources it was trained on is not held out.

A row counts as judged faithful when the judge finds no unsupported claim (an answer without claims
too, and their count is shown). Per source: balanced accuracy and false approval (share of the
unfaithful answers judged faithful) with 95 % percentile intervals from a cluster bootstrap that
resamples the source's groups (a question's answers, a document's summaries); per candidate the
worst source's balanced accuracy, with the interval of the minimum over the same resamples. The
default is the candidate (heuristic or a learned one: the baseline is no judge ragmon runs) with the
best worst-source balanced accuracy, where a learned one must beat the heuristic: the paired
bootstrap interval of its worst-source margin over the heuristic's must lie above zero.

`--summary PATH` writes the committed summary (`bench/judge/loso_summary.json`: per candidate and
source the figures above, and the choice), which `tests/service/judge/test_default_judge.py` holds
the configuration's default to. `--ship` trains the best learned recipe (by worst source, ties by mean) on all
nine sources and writes it to `service/judge/learned_judge.json`: the default if it was chosen,
else the `judge.offline: learned` option.

Features are cached (`~/.cache/ragmon/judge_devset/loso-<hash>.npz`, keyed by the data and the judge
code), so a rerun trains only.

    python bench/judge/build_devset.py   # writes ~/.cache/ragmon/judge_devset/sources.jsonl
    nice python bench/judge/loso.py [--data PATH] [--boot 1000] [--summary PATH] [--ship]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.judge.devset_accuracy import overlap_ratio, tune_threshold
from bench.judge.train_learned import (
    FOLDS,
    GRID,
    TIE,
    balanced,
    best_threshold,
    cell_weights,
    data_hash,
    fit_stumps,
    fold_of,
    merge,
    model_json,
    predict,
    recipe,
    veto_stump,
)
from service.judge.features import answer_features
from service.judge.heuristic import HeuristicJudge
from service.judge.learned import MODEL_FEATURES, LearnedJudge, aggregate, load_model

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE = Path.home() / ".cache" / "ragmon" / "judge_devset"
DEFAULT_DATA = CACHE / "sources.jsonl"
DEFAULT_SUMMARY = REPO_ROOT / "bench" / "judge" / "loso_summary.json"
MODEL_OUT = REPO_ROOT / "service" / "judge" / "learned_judge.json"
SHIPPED_VERSION = "learned/3"
JUDGE_CODE = ("claims.py", "features.py", "heuristic.py", "learned.py", "text.py")
LEARNED = ("learned", "learned-noveto", "learned-worst", "learned-sources")
CANDIDATES = ("heuristic", *LEARNED, "overlap")
Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]
Rows = list[dict[str, Any]]


@dataclass
class Table:
    """Every row's features and fixed predictions, in the data's row order."""

    label: Bools
    source: npt.NDArray[np.str_]
    group: npt.NDArray[np.str_]
    has_claims: Bools
    x: Floats  # model features (zeros where there are no claims)
    heuristic: Bools
    overlap: Floats
    reference: Bools


def features(rows: Rows, data: Path, reference: Path | None) -> Table:
    """The table, from the cache when the data and the judge code are unchanged."""
    digest = hashlib.sha256(data.read_bytes())
    for name in JUDGE_CODE:
        digest.update((REPO_ROOT / "service" / "judge" / name).read_bytes())
    digest.update(reference.read_bytes() if reference else b"no reference")
    cached = CACHE / f"loso-{digest.hexdigest()[:16]}.npz"
    if cached.exists():
        with np.load(cached) as z:
            return Table(**{k: z[k] for k in z.files})
    started = time.process_time()
    heuristic = HeuristicJudge()
    other = LearnedJudge(load_model(reference)) if reference else None
    x = np.zeros((len(rows), len(MODEL_FEATURES)))
    has_claims = np.zeros(len(rows), bool)
    judged_h = np.zeros(len(rows), bool)
    judged_s = np.zeros(len(rows), bool)
    for i, r in enumerate(rows):
        found = answer_features(r["question"], r["contexts"], r["answer"])
        if found.claims:
            has_claims[i] = True
            x[i] = aggregate(found.matrix)
        judged_h[i] = not heuristic.verdict(r["question"], r["contexts"], r["answer"]).unsupported
        if other is not None:
            judged_s[i] = not other.verdict(r["question"], r["contexts"], r["answer"]).unsupported
    table = Table(
        label=np.array([bool(r["label_faithful"]) for r in rows]),
        source=np.array([r["source"] for r in rows]),
        group=np.array([f"{r['source']}/{r['group']}" for r in rows]),
        has_claims=has_claims,
        x=x,
        heuristic=judged_h,
        overlap=np.array([overlap_ratio(r["contexts"], r["answer"]) for r in rows]),
        reference=judged_s,
    )
    print(f"features of {len(rows)} rows: {time.process_time() - started:.0f} s CPU -> {cached}")
    CACHE.mkdir(parents=True, exist_ok=True)
    np.savez(cached, **table.__dict__)
    return table


def worst_threshold(score: Floats, label: Bools, source: npt.NDArray[np.str_]) -> tuple[float, float]:
    """(threshold, worst-source balanced accuracy) maximising the lowest per-source balanced accuracy
    of `score >= threshold`; ties go to the best pooled balanced accuracy."""
    values = np.unique(score)
    candidates = np.r_[values[0] - 1.0, (values[1:] + values[:-1]) / 2]
    if len(candidates) > 400:  # quantiles are enough to place a threshold, and 4,000 are slow
        candidates = np.unique(np.quantile(candidates, np.linspace(0, 1, 401)))
    names = sorted(set(source))
    best = (-1.0, -1.0, 0.0)
    for t in candidates:
        pred = score >= t
        worst = min(balanced(pred[source == s], label[source == s]) for s in names)
        key = (worst, balanced(pred, label), float(t))
        if key[:2] > best[:2]:
            best = key
    return best[2], best[0]


@dataclass
class Fitted:
    """A learned model: base, stumps (veto not included), and the thresholds of its variants."""

    base: float
    stumps: list[dict[str, float]]
    thresholds: dict[str, float]
    settings: dict[str, Any]


def _oof(
    x: Floats, y: Bools, source: npt.NDArray[np.str_], folds: npt.NDArray[np.int64], n: int, rate: float
) -> Floats:
    """Out-of-fold scores (without the veto) of one setting over the given folds."""
    oof = np.zeros(len(y))
    for k in np.unique(folds):
        train = folds != k
        base, stumps = fit_stumps(x[train], y[train], cell_weights(source[train], y[train]), n, rate)
        oof[~train] = predict(base, stumps, x[~train])
    return oof


def _veto(x: Floats, score: Floats) -> Floats:
    return score + predict(0.0, [veto_stump()], x)


def train_group_cv(x: Floats, y: Bools, source: npt.NDArray[np.str_], group: npt.NDArray[np.str_]) -> Fitted:
    """`learned`, `learned-noveto`, `learned-worst`: train_learned.py's recipe (group folds)."""
    folds = np.array([fold_of(*g.split("/", 1)) for g in group])
    results = []
    for n, rate in GRID:
        oof = _oof(x, y, source, folds, n, rate)
        threshold, accuracy = best_threshold(_veto(x, oof), y)
        results.append((accuracy, n, rate, threshold, oof))
    top = max(r[0] for r in results)
    _, n, rate, threshold, oof = min((r for r in results if r[0] >= top - TIE), key=lambda r: (r[1], -r[0]))
    base, stumps = fit_stumps(x, y, cell_weights(source, y), n, rate)
    return Fitted(
        base,
        stumps,
        {
            "learned": threshold,
            "learned-noveto": best_threshold(oof, y)[0],
            "learned-worst": worst_threshold(_veto(x, oof), y, source)[0],
        },
        {"stumps": n, "learning_rate": rate, "folds": f"{FOLDS} over groups"},
    )


def train_source_cv(x: Floats, y: Bools, source: npt.NDArray[np.str_]) -> Fitted:
    """`learned-sources`: settings and threshold from an inner leave-one-source-out (worst source)."""
    names = sorted(set(source))
    folds = np.array([names.index(s) for s in source])
    results = []
    for n, rate in GRID:
        oof = _veto(x, _oof(x, y, source, folds, n, rate))
        threshold, worst = worst_threshold(oof, y, source)
        results.append((worst, n, rate, threshold))
    top = max(r[0] for r in results)
    _, n, rate, threshold = min((r for r in results if r[0] >= top - TIE), key=lambda r: (r[1], -r[0]))
    base, stumps = fit_stumps(x, y, cell_weights(source, y), n, rate)
    return Fitted(
        base,
        stumps,
        {"learned-sources": threshold},
        {"stumps": n, "learning_rate": rate, "folds": f"leave-one-source-out over {len(names)} sources"},
    )


def held_out_predictions(t: Table) -> dict[str, Bools]:
    """Each candidate's verdict on every row, from the models that did not see the row's source."""
    preds = {name: np.zeros(len(t.label), bool) for name in CANDIDATES}
    preds["heuristic"] = t.heuristic.copy()
    for held in sorted(set(t.source)):
        started = time.process_time()
        out, train = t.source == held, (t.source != held) & t.has_claims
        x, y, s, g = t.x[train], t.label[train], t.source[train], t.group[train]
        threshold = tune_threshold(t.overlap[t.source != held], t.label[t.source != held])
        preds["overlap"][out] = t.overlap[out] >= threshold
        group_cv, source_cv = train_group_cv(x, y, s, g), train_source_cv(x, y, s)
        for fitted in (group_cv, source_cv):
            raw = predict(fitted.base, fitted.stumps, t.x[out])
            for name, cut in fitted.thresholds.items():
                score = raw if name == "learned-noveto" else _veto(t.x[out], raw)
                # an answer without claims is no_claims, judged faithful in this count
                preds[name][out] = (score >= cut) | ~t.has_claims[out]
        print(
            f"  held out {held}: group-CV {group_cv.settings['stumps']} stumps, source-CV "
            f"{source_cv.settings['stumps']} stumps; {time.process_time() - started:.0f} s CPU",
            flush=True,
        )
    return preds


def false_approval(pred: Bools, label: Bools) -> float:
    return float(pred[~label].mean())


def resamples(t: Table, n_boot: int, seed: int = 7) -> dict[str, list[npt.NDArray[np.int64]]]:
    """Per source, `n_boot` row-index resamples drawing the source's groups with replacement (each
    holding both labels: a resample with one class has no balanced accuracy)."""
    rng = np.random.default_rng(seed)
    out: dict[str, list[npt.NDArray[np.int64]]] = {}
    for s in sorted(set(t.source)):
        rows = np.flatnonzero(t.source == s)
        _, inverse = np.unique(t.group[rows], return_inverse=True)
        members = [rows[inverse == k] for k in range(inverse.max() + 1)]
        drawn: list[npt.NDArray[np.int64]] = []
        while len(drawn) < n_boot:
            pick = np.concatenate([members[k] for k in rng.integers(0, len(members), len(members))])
            if t.label[pick].all() or not t.label[pick].any():
                continue
            drawn.append(pick)
        out[s] = drawn
    return out


def _ci(values: Sequence[float]) -> list[float]:
    return [round(float(np.percentile(values, 2.5)), 3), round(float(np.percentile(values, 97.5)), 3)]


def summarise(
    t: Table, preds: dict[str, Bools], boot: dict[str, list[npt.NDArray[np.int64]]]
) -> dict[str, Any]:
    """Per candidate: per-source figures with intervals, and the worst source with its interval."""
    names = sorted(boot)
    n_boot = len(next(iter(boot.values())))
    out: dict[str, Any] = {}
    for cand, pred in preds.items():
        per_source: dict[str, Any] = {}
        ba_draws = np.zeros((len(names), n_boot))
        for i, s in enumerate(names):
            m = t.source == s
            ba_draws[i] = [balanced(pred[r], t.label[r]) for r in boot[s]]
            fa = [false_approval(pred[r], t.label[r]) for r in boot[s]]
            per_source[s] = {
                "balanced_accuracy": round(balanced(pred[m], t.label[m]), 3),
                "balanced_accuracy_ci": _ci(ba_draws[i]),
                "false_approval": round(false_approval(pred[m], t.label[m]), 3),
                "false_approval_ci": _ci(fa),
            }
        worst = min(names, key=lambda s: per_source[s]["balanced_accuracy"])
        out[cand] = {
            "sources": per_source,
            "worst_source": worst,
            "worst_balanced_accuracy": per_source[worst]["balanced_accuracy"],
            "worst_balanced_accuracy_ci": _ci(ba_draws.min(axis=0)),
            "mean_balanced_accuracy": round(
                float(np.mean([per_source[s]["balanced_accuracy"] for s in names])), 3
            ),
            "_draws": ba_draws,
        }
    return out


def _paired(summary: dict[str, Any], first: str, second: str) -> list[float]:
    """95 % interval of first's worst-source balanced accuracy minus second's, over the same resamples."""
    margin = summary[first]["_draws"].min(axis=0) - summary[second]["_draws"].min(axis=0)
    return [round(float(np.percentile(margin, 2.5)), 3), round(float(np.percentile(margin, 97.5)), 3)]


def choose(summary: dict[str, Any]) -> tuple[str, str, dict[str, list[float]]]:
    """(the default, the best learned candidate, each learned candidate's paired worst-source margin
    over the heuristic). The best learned candidate has the best worst-source balanced accuracy, or,
    among those within `TIE` of it, the best mean over the sources. The default is the candidate
    with the best worst-source balanced accuracy,
    but a learned one only where it beats the heuristic: its paired interval lies above zero. A
    margin inside the noise does not buy a trained model's extra CPU and its higher false approval."""
    margins = {c: _paired(summary, c, "heuristic") for c in LEARNED}
    # the best worst source; within TIE of it (noise), the best mean over the sources
    top = max(summary[c]["worst_balanced_accuracy"] for c in LEARNED)
    near = [c for c in LEARNED if summary[c]["worst_balanced_accuracy"] >= top - TIE]
    best_learned = max(near, key=lambda c: (summary[c]["mean_balanced_accuracy"], -LEARNED.index(c)))
    better = (
        summary[best_learned]["worst_balanced_accuracy"] > summary["heuristic"]["worst_balanced_accuracy"]
    )
    chosen = best_learned if better and margins[best_learned][0] > 0 else "heuristic"
    return chosen, best_learned, margins


def print_tables(t: Table, summary: dict[str, Any], kinds: dict[str, str]) -> None:
    names = sorted(set(t.source))
    columns = [c for c in summary]
    print("\n| source (kind) | rows (faithful) | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for s in names:
        m = t.source == s
        cells = []
        for c in columns:
            f = summary[c]["sources"][s]
            lo, hi = f["balanced_accuracy_ci"]
            cells.append(f"{f['balanced_accuracy']:.3f} [{lo:.3f}, {hi:.3f}] / {f['false_approval']:.2f}")
        print(f"| {s} ({kinds[s]}) | {int(m.sum())} ({int(t.label[m].sum())}) | " + " | ".join(cells) + " |")
    worst = [
        f"{summary[c]['worst_balanced_accuracy']:.3f} [{summary[c]['worst_balanced_accuracy_ci'][0]:.3f}, "
        f"{summary[c]['worst_balanced_accuracy_ci'][1]:.3f}] ({summary[c]['worst_source']})"
        for c in columns
    ]
    print("| **worst source** | | " + " | ".join(worst) + " |")
    print(
        "| mean of sources | | "
        + " | ".join(f"{summary[c]['mean_balanced_accuracy']:.3f}" for c in columns)
        + " |"
    )
    print("\nfalse approval with intervals:")
    for c in columns:
        print(
            f"  {c}: "
            + "; ".join(
                f"{s} {summary[c]['sources'][s]['false_approval']:.3f} "
                f"[{summary[c]['sources'][s]['false_approval_ci'][0]:.3f}, "
                f"{summary[c]['sources'][s]['false_approval_ci'][1]:.3f}]"
                for s in names
            )
        )


def ship(t: Table, rows: Rows, chosen: str, command: str) -> None:
    """Train the chosen learned recipe on all sources and write it as the shipped model."""
    keep = t.has_claims
    x, y, s, g = t.x[keep], t.label[keep], t.source[keep], t.group[keep]
    fitted = train_source_cv(x, y, s) if chosen == "learned-sources" else train_group_cv(x, y, s, g)
    base, stumps = merge(fitted.base, fitted.stumps)
    if chosen != "learned-noveto":
        stumps.append(veto_stump())
    training = {
        "command": command,
        "data": "bench/judge/build_devset.py's leave-one-source-out set (sources.jsonl), all nine sources",
        "data_sha256": data_hash(rows),
        "rows": len(rows),
        "rows_with_claims": int(keep.sum()),
        "faithful": int(y.sum()),
        "sources": sorted(set(t.source)),
        "recipe": chosen,
        **fitted.settings,
        **recipe(),
        "threshold_from": f"{chosen}'s rule on out-of-fold scores",
        "held_out_figures": "bench/judge/loso_summary.json",
    }
    MODEL_OUT.write_text(
        model_json(SHIPPED_VERSION, base, stumps, fitted.thresholds[chosen], training), "utf-8"
    )
    print(f"wrote {MODEL_OUT}: {len(stumps)} stumps, threshold {fitted.thresholds[chosen]:.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--boot", type=int, default=1000)
    parser.add_argument("--summary", type=Path, help="write the summary JSON here")
    parser.add_argument("--reference", type=Path, help="a learned model file to show beside the candidates")
    parser.add_argument(
        "--ship", action="store_true", help="write the chosen learned model, if one is chosen"
    )
    args = parser.parse_args(argv)
    if not args.data.exists():
        print(f"no data at {args.data}: run bench/judge/build_devset.py first", file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in args.data.read_text("utf-8").splitlines() if line.strip()]
    started = time.monotonic()
    t = features(rows, args.data, args.reference)
    kinds = {r["source"]: r["kind"] for r in rows}
    preds = held_out_predictions(t)
    if args.reference:
        preds[f"{load_model(args.reference).version} (not held out)"] = t.reference
    summary = summarise(t, preds, resamples(t, args.boot))
    chosen, best_learned, margins = choose(summary)
    print_tables(t, summary, kinds)
    no_claims = {str(s): int((~t.has_claims[t.source == s]).sum()) for s in sorted(set(t.source))}
    print(f"\nanswers without claims per source (judged faithful above): {no_claims}")
    for c, (lo, hi) in margins.items():
        diff = summary[c]["worst_balanced_accuracy"] - summary["heuristic"]["worst_balanced_accuracy"]
        print(f"{c} - heuristic, worst-source balanced accuracy: {diff:+.3f} [{lo:+.3f}, {hi:+.3f}] (paired)")
    print(
        f"chosen default: {chosen}; best learned candidate: {best_learned}; "
        f"{time.monotonic() - started:.0f} s"
    )
    command = "python bench/judge/loso.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    if args.summary:
        payload = {
            "command": command.strip(),
            "data": "bench/judge/build_devset.py sources.jsonl",
            "data_sha256": data_hash(rows),
            "rows": len(rows),
            "bootstrap": f"{args.boot} cluster resamples of groups within each source, 95 % percentile "
            "intervals",
            "judged_faithful": "no unsupported claim (answers without claims included)",
            "sources": {
                s: {
                    "kind": kinds[s],
                    "rows": int((t.source == s).sum()),
                    "faithful": int(t.label[t.source == s].sum()),
                    "no_claims": no_claims[s],
                }
                for s in sorted(set(t.source))
            },
            "candidates": {
                c: {k: v for k, v in f.items() if not k.startswith("_")} for c, f in summary.items()
            },
            "rule": "best worst-source balanced accuracy; a learned candidate only where its paired "
            f"interval over the heuristic's lies above zero; the learned option: best worst source, within "
            f"{TIE} of it the best mean",
            "worst_source_margin_over_heuristic_ci": margins,
            "chosen": chosen,
            "offline_default": "heuristic" if chosen == "heuristic" else "learned",
            "learned_option": best_learned,
        }
        args.summary.write_text(json.dumps(payload, indent=1) + "\n", "utf-8")
        print(f"wrote {args.summary}")
    if args.ship:
        ship(t, rows, best_learned, command.strip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
