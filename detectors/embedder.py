"""The built-in query embedder: signed feature hashing of words, word pairs and character n-grams.

Why this one: drift detection needs a representation in which queries about
the same topic lie close together and new topics land somewhere new; it does
not need semantic paraphrase quality. Feature hashing gives that with nothing
to download, no model weights and no state to fit, in pure NumPy at tens of
thousands of queries per second on one core (a MiniLM-sized transformer
manages about a hundred). Character n-grams make it robust to typos and
inflections; word bigrams keep a little word order.

Guarantees: the same text always maps to the same vector, on any machine and
Python process (the hash is CRC-32 of UTF-8, not Python's salted `hash`).
Vectors are float32, L2-normalised, of width `dim`; the empty text maps to the
zero vector. `model_name` changes whenever a parameter changes, so vectors of
two configurations are never compared (EmbeddingModelChange treats them as
different models). Use the app's own query vectors when traces carry them:
they are what retrieval actually uses. Run `embed` off the ingest path.
"""

from __future__ import annotations

import itertools
import math
import re
import zlib
from collections import Counter, defaultdict
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import numpy.typing as npt

__all__ = ["HashingEmbedder"]

_WORD = re.compile(r"[^\W_]+", re.UNICODE)

STOP_WORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "can",
        "could",
        "do",
        "does",
        "for",
        "from",
        "have",
        "how",
        "i",
        "if",
        "in",
        "is",
        "it",
        "me",
        "my",
        "of",
        "on",
        "or",
        "please",
        "should",
        "so",
        "that",
        "the",
        "there",
        "this",
        "to",
        "was",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
    ]
)
"""Function words that say nothing about a query's topic; they are down-weighted, not dropped."""


class HashingEmbedder:
    """Offline query embedder by signed feature hashing; see the module docstring for why."""

    def __init__(
        self,
        dim: int = 384,
        char_ngrams: tuple[int, int] = (3, 5),
        char_weight: float = 0.5,
        bigram_weight: float = 0.7,
        stop_weight: float = 0.2,
        stop_words: frozenset[str] = STOP_WORDS,
        cache_size: int = 200_000,
    ) -> None:
        if dim < 2:
            raise ValueError(f"dim must be at least 2, got {dim}")
        low, high = char_ngrams
        if not 1 <= low <= high:
            raise ValueError(f"char_ngrams must satisfy 1 <= low <= high, got {char_ngrams}")
        if char_weight < 0 or bigram_weight < 0 or stop_weight < 0:
            raise ValueError("weights must be non-negative")
        if cache_size < 0:
            raise ValueError("cache_size must be non-negative")
        self.dim = dim
        self.char_ngrams = char_ngrams
        self.char_weight = char_weight
        self.bigram_weight = bigram_weight
        self.stop_weight = stop_weight
        self.stop_words = stop_words
        self.cache_size = cache_size
        # Queries reuse a small vocabulary of words, so hashing each once pays off; the cache is bounded.
        self._words = lru_cache(maxsize=cache_size)(self._word_entries)

    @property
    def model_name(self) -> str:
        low, high = self.char_ngrams
        stop = (
            ""
            if self.stop_words == STOP_WORDS
            else f"-x{zlib.crc32(' '.join(sorted(self.stop_words)).encode()):08x}"
        )
        return (
            f"ragmon-hashing-v1-d{self.dim}-c{low}{high}-w{self.char_weight:g}-b{self.bigram_weight:g}"
            f"-s{self.stop_weight:g}{stop}"
        )

    def _hash_slot(self, feature: str) -> tuple[int, float]:
        digest = zlib.crc32(feature.encode("utf-8"))
        # Bit 31 chooses the sign, the other bits the slot, so sign and slot are not tied to each other.
        return (digest & 0x7FFFFFFF) % self.dim, 1.0 if digest >> 31 else -1.0

    def _word_entries(self, word: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """Slots and signed weights of a word and its character n-grams."""
        slot = self._hash_slot
        # Function words would otherwise dominate short queries and hide their topic.
        scale = self.stop_weight if word in self.stop_words else 1.0
        index, sign = slot("w:" + word)
        slots, weights = [index], [sign * scale]
        padded = f"<{word}>"
        low, high = self.char_ngrams
        for size in range(low, high + 1):
            for start in range(len(padded) - size + 1):
                index, sign = slot("c:" + padded[start : start + size])
                slots.append(index)
                weights.append(sign * self.char_weight * scale)
        return tuple(slots), tuple(weights)

    def features(self, text: str) -> dict[str, float]:
        """The features of one text before hashing and stop-word weighting (words, pairs, n-grams)."""
        words = _WORD.findall(text.lower())
        counts: defaultdict[str, float] = defaultdict(float)
        low, high = self.char_ngrams
        for word in words:
            counts["w:" + word] += 1.0
            padded = f"<{word}>"
            for size in range(low, high + 1):
                for start in range(len(padded) - size + 1):
                    counts["c:" + padded[start : start + size]] += self.char_weight
        for first, second in itertools.pairwise(words):
            counts[f"b:{first} {second}"] += self.bigram_weight
        return dict(counts)

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """One L2-normalised row of width `dim` per text; raises TypeError for a non-string item.

        Equals hashing `features(text)` with each word counted once however
        often it repeats (a repeated word adds 1 + log(count), not count).
        """
        rows: list[int] = []
        slots: list[int] = []
        weights: list[float] = []
        word_entries = self._words
        for row, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"texts[{row}] is {type(text).__name__}, not str")
            words = _WORD.findall(text.lower())
            counts = Counter(words)
            for word, count in counts.items():
                # Sublinear weighting keeps a repeated word from dominating a short query.
                word_slots, word_weights = word_entries(word)
                rows.extend([row] * len(word_slots))
                slots.extend(word_slots)
                if count == 1:
                    weights.extend(word_weights)
                else:
                    scale = 1.0 + math.log(count)
                    weights.extend([weight * scale for weight in word_weights])
            for first, second in itertools.pairwise(words):
                index, sign = self._hash_slot(f"b:{first} {second}")
                rows.append(row)
                slots.append(index)
                both_stop = first in self.stop_words and second in self.stop_words
                weights.append(sign * self.bigram_weight * (self.stop_weight if both_stop else 1.0))
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        np.add.at(vectors, (np.asarray(rows, dtype=np.intp), np.asarray(slots, dtype=np.intp)), weights)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        np.divide(vectors, norms, out=vectors, where=norms > 0)
        return vectors
