"""Drift power on real queries (clinc150, read in place) with the built-in embedder."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from detectors.base import Reference, Window
from detectors.embedder import HashingEmbedder
from detectors.mmd import MmdDrift

T = datetime(2024, 1, 1, tzinfo=UTC)


def _data() -> Path:
    root = os.environ.get("RAGMON_SHARED_DATA")
    base = Path(root) if root else Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
    folder = base / "queries" / "clinc150"
    if not (folder / "data_full.json").is_file():
        pytest.skip(f"clinc150 not found at {folder} (set RAGMON_SHARED_DATA)")
    return folder


@pytest.fixture(scope="module")
def queries() -> tuple[list[str], np.ndarray]:
    folder = _data()
    raw = json.loads((folder / "data_full.json").read_text())
    domains = json.loads((folder / "domains.json").read_text())
    domain_of = {intent: domain for domain, intents in domains.items() for intent in intents}
    rows = [(text, domain_of[intent]) for text, intent in raw["train"] + raw["val"] + raw["test"]]
    return [text for text, _ in rows], np.array([domain for _, domain in rows])


@pytest.mark.slow
def test_new_topic_is_caught_and_same_topics_are_not(queries: tuple[list[str], np.ndarray]) -> None:
    texts, domains = queries
    vectors = HashingEmbedder().embed(texts)
    base = np.flatnonzero(domains != "travel")
    travel = np.flatnonzero(domains == "travel")
    caught = alarms = 0
    for seed in range(10):
        rng = np.random.default_rng(seed)
        picked = rng.choice(base, 3000, replace=False)
        reference, same = picked[:1000], picked[1000:2000]
        # 20 % of the window from a domain the reference never saw; the hashing embedder needs about
        # this much at n = 1,000 (MiniLM vectors need far less: see bench/RESULTS.md).
        shifted = np.concatenate([picked[2000:2800], rng.choice(travel, 200, replace=False)])
        detector = MmdDrift(seed=seed).fit(Reference("r", vectors[reference], T, T))
        alarms += detector.score(Window(vectors[same], T, T)).drifted
        caught += detector.score(Window(vectors[shifted], T, T)).drifted
    assert caught >= 9
    assert alarms <= 3
