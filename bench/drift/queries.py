"""Real query sets for the drift benchmark, read in place (nothing is copied into the repository).

* clinc150 (CC BY 3.0, Larson et al. 2019): ../shared/data/queries/clinc150
  (or $RAGMON_SHARED_DATA/queries/clinc150), all splits: 150 intents in 10
  domains, plus out-of-scope queries.
* banking77 (CC BY 4.0, Casanueva et al. 2020): built by
  `bench/drift/banking77.py` into $RAGMON_BENCH_CACHE/banking77 (default
  /tmp/ragmon-bench-cache/banking77): 77 intents of one bank's customers.

Each loader returns None when its data is absent.
"""

from __future__ import annotations

import csv
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from detectors.embedder import HashingEmbedder

__all__ = ["QuerySet", "bench_cache", "embed_hashing", "load_banking77", "load_clinc150"]


def bench_cache() -> Path:
    return Path(os.environ.get("RAGMON_BENCH_CACHE", "/tmp/ragmon-bench-cache"))


@dataclass(frozen=True)
class QuerySet:
    """Queries with their intent and a group above it (clinc150's domain; banking77's intent)."""

    name: str
    texts: npt.NDArray[np.str_]
    intents: npt.NDArray[np.str_]
    domains: npt.NDArray[np.str_]
    source: str


def load_clinc150() -> QuerySet | None:
    root = os.environ.get("RAGMON_SHARED_DATA")
    base = Path(root) if root else Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
    folder = base / "queries" / "clinc150"
    if not ((folder / "data_full.json").is_file() and (folder / "domains.json").is_file()):
        return None
    raw = json.loads((folder / "data_full.json").read_text())
    domains = json.loads((folder / "domains.json").read_text())
    domain_of = {intent: domain for domain, intents in domains.items() for intent in intents}
    domain_of["oos"] = "oos"
    texts, intents, labels = [], [], []
    for split in sorted(raw):
        for text, intent in raw[split]:
            texts.append(text)
            intents.append(intent)
            labels.append(domain_of[intent])
    return QuerySet(
        "clinc150", np.array(texts), np.array(intents), np.array(labels), "shared/data/queries/clinc150"
    )


def load_banking77() -> QuerySet | None:
    folder = bench_cache() / "banking77"
    if not ((folder / "train.csv").is_file() and (folder / "test.csv").is_file()):
        return None
    texts, intents = [], []
    for split in ("train", "test"):
        with (folder / f"{split}.csv").open(newline="") as handle:
            for row in csv.DictReader(handle):
                texts.append(row["text"])
                intents.append(row["category"])
    source = (folder / "SOURCE").read_text().strip() if (folder / "SOURCE").is_file() else str(folder)
    return QuerySet("banking77", np.array(texts), np.array(intents), np.array(intents), source)


def embed_hashing(texts: npt.NDArray[np.str_]) -> tuple[npt.NDArray[np.float32], float]:
    """The built-in hashing embedder's vectors and its throughput in queries per second."""
    embedder = HashingEmbedder()
    started = time.perf_counter()
    vectors = embedder.embed([str(t) for t in texts])
    return vectors, len(texts) / (time.perf_counter() - started)
