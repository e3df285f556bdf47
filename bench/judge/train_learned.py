"""Train the learned offline judge (`service/judge/learned.py`) on the dev set's `tune` half, never `test`.

The model: boosted stumps (gradient boosting on the logistic loss, one feature and one threshold
per stump, thresholds at quantiles of the tune rows) over each answer's model features
(`learned.aggregate`). Rows are weighted so that each (source, label) cell of the tune half
weighs the same: no source and no class dominates because it has more rows. Answers without
claims are left out (the judge calls them `no_claims` without the model).

One stump is set, not learned: an answer with a claim of which under half the content words are
anywhere in the context fails (`VETO_SHARE`; a stump on `min_content_share` whose low side is
`VETO`). Without it a made-up sentence among supported ones could pass (the demo's planted "It was
discontinued last year and replaced by the premium option" did, 4 of 53): the summarization
sources' faithful answers have many new words, so the learned stumps weigh a low minimum lightly.
On the tune half it costs 0.001 (out-of-fold balanced accuracy 0.706 with it, 0.707 without).

Settings (number of stumps, learning rate) and the decision threshold are chosen by 5-fold
cross-validation over groups within the tune half: the threshold maximises the pooled balanced
accuracy of the out-of-fold scores. The final model is fitted on all tune rows and written, with
the command, a SHA-256 of the training rows, their counts and the out-of-fold accuracy, to
`service/judge/learned_judge.json` (or `--out`).

    python bench/judge/train_learned.py [--data PATH] [--out PATH] [--version learned/2]

This is how learned/2 was made. The shipped model is now learned/3, from `loso.py --ship` (the same
fitting and veto, on all nine sources of the leave-one-source-out set); run this with `--out` elsewhere
to reproduce learned/2 without replacing it (`tests/service/judge/test_default_judge.py` checks the
shipped file is loso.py's).

`--split` exists only to refuse anything but `tune`: the test half is for reporting.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from service.judge.features import answer_features
from service.judge.learned import MODEL_FEATURES, MODEL_FILE, aggregate

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA = Path.home() / ".cache" / "ragmon" / "judge_devset" / "devset.jsonl"
DEFAULT_OUT = REPO_ROOT / "service" / "judge" / MODEL_FILE
FOLDS = 5
BINS = 32
MIN_LEAF = 20
L2 = 1.0
# (stumps, learning rate) tried by cross-validation
GRID = ((100, 0.2), (200, 0.1), (400, 0.05), (300, 0.1))
TIE = 0.005
VETO_SHARE = 0.5
VETO = -100.0
Rows = list[dict[str, Any]]
Floats = npt.NDArray[np.float64]


class RefusedSplit(ValueError):
    """Training was asked to use rows that are not from the tune half."""


def training_rows(rows: Rows, split: str = "tune") -> Rows:
    """The rows to train on: the `tune` rows; raises RefusedSplit for any other split."""
    if split != "tune":
        raise RefusedSplit(f"the learned judge trains on the tune half only, not {split!r}")
    return [r for r in rows if r.get("split") == "tune"]


def data_hash(rows: Rows) -> str:
    """SHA-256 over the training rows, canonical JSON in id order: the same rows, the same hash."""
    digest = hashlib.sha256()
    for r in sorted(rows, key=lambda r: str(r["id"])):
        digest.update(json.dumps(r, sort_keys=True, ensure_ascii=False).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def cell_weights(source: npt.NDArray[np.str_], label: npt.NDArray[np.bool_]) -> Floats:
    """Weights giving every (source, label) cell the same total, mean weight 1."""
    keys = np.char.add(source.astype(str), np.where(label, "+", "-"))
    _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    w = 1.0 / counts[inverse]
    return np.asarray(w * len(w) / w.sum(), dtype=np.float64)


def balanced(pred: npt.NDArray[np.bool_], label: npt.NDArray[np.bool_]) -> float:
    return float((pred[label].mean() + (~pred[~label]).mean()) / 2)


def best_threshold(score: Floats, label: npt.NDArray[np.bool_]) -> tuple[float, float]:
    """(threshold, balanced accuracy) maximising balanced accuracy of `score >= threshold`;
    the threshold is halfway between two neighbouring scores, so it does not sit on a training row."""
    values = np.unique(score)
    candidates = np.r_[values[0] - 1.0, (values[1:] + values[:-1]) / 2]
    accuracies = [balanced(score >= t, label) for t in candidates]
    best = int(np.argmax(accuracies))
    return float(candidates[best]), float(accuracies[best])


def fit_stumps(
    x: Floats, y: npt.NDArray[np.bool_], w: Floats, n_stumps: int, rate: float
) -> tuple[float, list[dict[str, float]]]:
    """(base score, stumps) of gradient-boosted stumps on the weighted logistic loss (Newton leaf values)."""
    target = y.astype(np.float64)
    prior = float(np.average(target, weights=w))
    base = float(np.log(prior / (1 - prior)))
    edges = [np.unique(np.quantile(x[:, j], np.linspace(0, 1, BINS + 1)[1:-1])) for j in range(x.shape[1])]
    bins = [np.searchsorted(e, x[:, j], side="left") for j, e in enumerate(edges)]  # x <= e[k] <=> bin <= k
    f = np.full(len(target), base)
    stumps: list[dict[str, float]] = []
    for _ in range(n_stumps):
        p = 1 / (1 + np.exp(-f))
        g, h = w * (p - target), w * p * (1 - p)
        total_g, total_h = g.sum(), h.sum()
        best: tuple[float, int, int] = (0.0, -1, -1)
        for j, b in enumerate(bins):
            k = len(edges[j]) + 1
            gl = np.cumsum(np.bincount(b, g, k))[:-1]
            hl = np.cumsum(np.bincount(b, h, k))[:-1]
            nl = np.cumsum(np.bincount(b, minlength=k))[:-1]
            ok = (nl >= MIN_LEAF) & (len(b) - nl >= MIN_LEAF)
            gain = gl**2 / (hl + L2) + (total_g - gl) ** 2 / (total_h - hl + L2) - total_g**2 / (total_h + L2)
            gain = np.where(ok, gain, 0.0)
            if len(gain) and gain.max() > best[0]:
                best = (float(gain.max()), j, int(np.argmax(gain)))
        if best[1] < 0:
            break
        _, j, k = best
        left = bins[j] <= k
        lv = -rate * g[left].sum() / (h[left].sum() + L2)
        rv = -rate * g[~left].sum() / (h[~left].sum() + L2)
        stumps.append({"feature": j, "threshold": float(edges[j][k]), "left": float(lv), "right": float(rv)})
        f += np.where(left, lv, rv)
    return base, stumps


def predict(base: float, stumps: list[dict[str, float]], x: Floats) -> Floats:
    out = np.full(len(x), base)
    for s in stumps:
        out += np.where(x[:, int(s["feature"])] <= s["threshold"], s["left"], s["right"])
    return out


def merge(base: float, stumps: list[dict[str, float]]) -> tuple[float, list[dict[str, float]]]:
    """The same ensemble with stumps on one (feature, threshold) added together, in first-use order."""
    merged: dict[tuple[int, float], dict[str, float]] = {}
    for s in stumps:
        key = (int(s["feature"]), s["threshold"])
        if key in merged:
            merged[key]["left"] += s["left"]
            merged[key]["right"] += s["right"]
        else:
            merged[key] = dict(s)
    return base, list(merged.values())


def veto_stump() -> dict[str, float]:
    """The set stump (see the module docstring): min_content_share < VETO_SHARE scores VETO."""
    return {
        "feature": MODEL_FEATURES.index("min_content_share"),
        "threshold": VETO_SHARE - 1e-6,  # shares are fractions: below 0.5 is at most 0.5 - 1/n
        "left": VETO,
        "right": 0.0,
    }


def fold_of(source: str, group: str) -> int:
    return hashlib.sha256(f"fold/{source}/{group}".encode()).digest()[0] % FOLDS


def cross_validate(
    x: Floats, y: npt.NDArray[np.bool_], source: npt.NDArray[np.str_], folds: npt.NDArray[np.int64]
) -> tuple[float, int, float, float, dict[str, float]]:
    """The stumps and threshold chosen by group cross-validation over GRID: (out-of-fold balanced
    accuracy, stumps, rate, threshold, out-of-fold balanced accuracy per source)."""
    results = []
    for n_stumps, rate in GRID:
        oof = np.zeros(len(y))
        for k in range(FOLDS):
            train = folds != k
            base, stumps = fit_stumps(
                x[train], y[train], cell_weights(source[train], y[train]), n_stumps, rate
            )
            oof[~train] = predict(base, [*stumps, veto_stump()], x[~train])
        threshold, accuracy = best_threshold(oof, y)
        per_source = {
            s: round(balanced(oof[source == s] >= threshold, y[source == s]), 4) for s in sorted(set(source))
        }
        results.append((accuracy, n_stumps, rate, threshold, per_source))
        print(f"  {n_stumps} stumps, rate {rate}: out-of-fold balanced accuracy {accuracy:.3f} {per_source}")
    # the fewest stumps within TIE of the best: a difference that small is noise, a smaller file is not
    top = max(r[0] for r in results)
    return min((r for r in results if r[0] >= top - TIE), key=lambda r: (r[1], -r[0]))


def recipe() -> dict[str, Any]:
    """The fixed training settings, as the model file records them."""
    return {
        "bins": BINS,
        "min_leaf": MIN_LEAF,
        "l2": L2,
        "weights": "equal total per (source, label) cell",
        "veto": f"the last stump is set, not learned: min_content_share < {VETO_SHARE} scores {VETO}",
    }


def model_json(
    version: str, base: float, stumps: list[dict[str, float]], threshold: float, training: dict[str, Any]
) -> str:
    """The model file's text (`learned.LearnedModel`), one stump a line: small and readable in a diff."""
    model = {
        "version": version,
        "features": list(MODEL_FEATURES),
        "base": round(base, 6),
        "stumps": [{k: (round(v, 6) if k != "feature" else int(v)) for k, v in s.items()} for s in stumps],
        "threshold": round(threshold, 6),
        "training": training,
    }
    text = json.dumps(model, indent=1)
    stump_lines = ",\n  ".join(json.dumps(s, separators=(",", ":")) for s in model["stumps"])
    text = text.replace(json.dumps(model["stumps"], indent=1).replace("\n", "\n "), f"[\n  {stump_lines}\n ]")
    return text + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--version", default="learned/2")
    parser.add_argument("--split", default="tune", help="only `tune` is accepted")
    args = parser.parse_args(argv)
    if not args.data.exists():
        print(f"no dev set at {args.data}: run bench/judge/build_devset.py first", file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in args.data.read_text("utf-8").splitlines() if line.strip()]
    try:
        tune = training_rows(rows, args.split)
    except RefusedSplit as refused:
        print(f"refused: {refused}", file=sys.stderr)
        return 2
    started = time.monotonic()
    features, kept = [], []
    for r in tune:
        found = answer_features(r["question"], r["contexts"], r["answer"])
        if found.claims:
            features.append(aggregate(found.matrix))
            kept.append(r)
    x = np.array(features)
    y = np.array([bool(r["label_faithful"]) for r in kept])
    source = np.array([r["source"] for r in kept])
    folds = np.array([fold_of(r["source"], str(r["group"])) for r in kept])

    accuracy, n_stumps, rate, threshold, per_source = cross_validate(x, y, source, folds)
    base, stumps = merge(*fit_stumps(x, y, cell_weights(source, y), n_stumps, rate))
    stumps.append(veto_stump())
    command = "python bench/judge/train_learned.py " + shlex.join(
        a for a in (argv if argv is not None else sys.argv[1:]) if not a.startswith("--out")
    )
    training = {
        "command": command.strip(),
        "data": "dev set of bench/judge/build_devset.py, tune half",
        "data_sha256": data_hash(tune),
        "rows": len(tune),
        "rows_with_claims": len(kept),
        "faithful": int(y.sum()),
        "stumps": n_stumps,
        "learning_rate": rate,
        **recipe(),
        "threshold_from": f"{FOLDS}-fold out-of-fold scores over groups within the tune half",
        "out_of_fold_balanced_accuracy": round(accuracy, 4),
        "out_of_fold_per_source": per_source,
    }
    args.out.write_text(model_json(args.version, base, stumps, threshold, training), "utf-8")
    print(
        f"wrote {args.out} ({args.out.stat().st_size} bytes): {len(stumps)} stumps, rate {rate}, threshold "
        f"{threshold:.3f}, out-of-fold balanced accuracy {accuracy:.3f}; {time.monotonic() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
