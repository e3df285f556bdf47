from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from detectors.embedder import HashingEmbedder


def test_vectors_are_unit_length_float32_rows() -> None:
    vectors = HashingEmbedder().embed(["how do I reset my pin", "book a flight to paris", ""])
    assert vectors.shape == (3, 384)
    assert vectors.dtype == np.float32
    norms = np.linalg.norm(vectors, axis=1)
    assert norms[:2] == pytest.approx([1.0, 1.0], abs=1e-6)
    assert norms[2] == 0.0


def test_same_topic_is_closer_than_other_topic() -> None:
    embedder = HashingEmbedder()
    a, b, c = embedder.embed(
        ["what is my account balance", "show the balance of my account", "play some jazz music"]
    )
    assert a @ b > a @ c + 0.2


def test_typos_stay_close_thanks_to_character_ngrams() -> None:
    embedder = HashingEmbedder()
    a, b, c = embedder.embed(
        ["transfer money to savings", "transfr mony to savngs", "weather tomorrow in oslo"]
    )
    assert a @ b > 0.25
    assert a @ b > 4 * abs(a @ c)


def test_vectors_are_identical_in_another_process() -> None:
    text = "cancel my reservation for tonight"
    here = HashingEmbedder().embed([text])[0]
    code = (
        "from detectors.embedder import HashingEmbedder;import sys;"
        f"sys.stdout.buffer.write(HashingEmbedder().embed([{text!r}])[0].tobytes())"
    )
    # A different hash seed would change Python's str hash: the embedder must not depend on it.
    there = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, check=True, env={"PYTHONHASHSEED": "123"}
    ).stdout
    assert np.frombuffer(there, dtype=np.float32).tolist() == here.tolist()


def test_model_name_changes_with_parameters() -> None:
    assert HashingEmbedder().model_name == HashingEmbedder().model_name
    assert HashingEmbedder(dim=256).model_name != HashingEmbedder().model_name
    assert HashingEmbedder(char_weight=0.3).model_name != HashingEmbedder().model_name


def test_repeated_word_counts_sublinearly() -> None:
    embedder = HashingEmbedder(char_weight=0.0, bigram_weight=0.0, dim=4096)
    once, thrice = embedder.embed(["refund", "refund refund refund"])
    assert once @ thrice == pytest.approx(1.0, abs=1e-6)


def test_rejects_bad_input() -> None:
    with pytest.raises(TypeError):
        HashingEmbedder().embed(["ok", 3])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        HashingEmbedder(dim=1)
    with pytest.raises(ValueError):
        HashingEmbedder(char_ngrams=(4, 2))
