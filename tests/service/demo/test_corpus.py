"""The demo's generated corpus and its local embedder."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from service.demo.corpus import SHIFT_TOPICS, TOPICS, build_corpus, embed_text


def test_embeddings_are_unit_vectors_and_the_same_in_another_process() -> None:
    text = "How do I return hiking boots that arrived damaged?"
    here = embed_text(text, 64)
    assert here.shape == (64,)
    assert np.isclose(np.linalg.norm(here), 1.0)
    code = (
        "import json; from service.demo.corpus import embed_text; "
        f"print(json.dumps(list(embed_text({text!r}, 64))))"
    )
    # a new interpreter has a different str-hash salt; the vector must not depend on it
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert np.allclose(np.array(json.loads(out)), here)


def test_empty_text_is_the_zero_vector_and_bad_dims_are_refused() -> None:
    assert not embed_text("", 32).any()
    for dim in (0, 7, 4097):
        with pytest.raises(ValueError):
            embed_text("x", dim)
    with pytest.raises(ValueError):
        build_corpus(docs_per_topic=4)


def test_corpus_documents_have_unique_ids_and_300_to_500_characters() -> None:
    corpus = build_corpus(docs_per_topic=8, dim=64)
    ids = [d.id for d in corpus.documents]
    assert len(ids) == len(set(ids)) == 8 * len(TOPICS)
    assert all(300 <= len(d.content) <= 500 for d in corpus.documents)
    assert corpus.vectors.shape == (len(ids), 64)
    assert build_corpus(docs_per_topic=8, dim=64).documents == corpus.documents


def _top1(topics: tuple, seeds: range, dim: int = 256) -> tuple[float, float]:
    corpus = build_corpus(dim=dim)
    right, top = [], []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        topic = topics[int(rng.integers(len(topics)))]
        docs, matrix = corpus.for_app(topic.app)
        query = topic.questions[int(rng.integers(len(topic.questions)))].format(**topic.bind(rng))
        sims = matrix @ embed_text(query, dim)
        best = int(np.argmax(sims))
        right.append(docs[best].intent == topic.intent)
        top.append(float(sims[best]))
    return float(np.mean(right)), float(np.mean(top))


def test_retrieval_finds_the_asked_topic_and_shift_queries_score_lower() -> None:
    hit_rate, top_in = _top1(TOPICS, range(300))
    _, top_shift = _top1(SHIFT_TOPICS, range(300))
    # 300 draws: a true hit rate of 0.8 would fall under 0.72 with probability < 0.1 %
    assert hit_rate > 0.72
    assert top_shift < top_in - 0.1
