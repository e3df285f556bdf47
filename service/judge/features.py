"""Claim features for the learned offline judge: how much of a claim, and of which kind, its context holds.

Each claim of an answer (as `claims.answer_claims` reads it) gets one vector of `FEATURE_NAMES`, measured
against the context's words: shares of its words, bigrams and trigrams found, the same share
weighted by how rare each word is in the context (IDF over the context's own sentences: a claim
whose only new word is a rare name is worse off than one whose new word is "said"), the longest
common subsequence with the context sentences that match it best, new numbers, new capitalised
words and quantifiers, a negation on one side only, the heuristic judge's verdict on the
claim, and how the claim's words are arranged there: trigrams whose middle word is swapped in a
frame the context has (an edited copy: "the council approved the plan" / "the council rejected
the plan"), neighbouring claim words that lie near each other in the context or far apart (a
recombination of the context's own words), and the share of them one sentence holds.
Answer-level values (the whole answer's overlap, the heuristic's share of supported claims) are
repeated on each claim's vector, so one model scores every claim in its answer's setting.

No feature says how long the answer is, how many claims it has or how much of the question the
context covers: on the dev set those tell the sources' styles apart (HaluEval's faithful answers
are short entities), and a model trained with them flagged a fully supported two-sentence answer
for having two sentences. What is left measures support only.

Deterministic and pure: the same (question, context, answer) always gives the same matrix.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from service.judge.claims import answer_claims
from service.judge.heuristic import HeuristicJudge
from service.judge.text import (
    STOPWORDS,
    content,
    context_index,
    fold,
    numbers,
    sentences,
    words,
)

__all__ = ["FEATURE_NAMES", "AnswerFeatures", "answer_features"]

FEATURE_NAMES: tuple[str, ...] = (
    "content_share",  # content words found (a form of them) anywhere in the context
    "window_share",  # ... in the best run of 2 sentences
    "unigram_share",  # all words, stopwords too, found as they are
    "bigram_share",
    "trigram_share",
    "idf_share",  # content words found, weighted by their IDF over the context's sentences
    "lcs_share",  # longest common subsequence with one of the 3 best-matching sentences / claim words
    "new_content_log",  # log(1 + content words not found)
    "new_numbers",  # numbers not in the context (count, capped at 3)
    "has_numbers",
    "new_capitalised_share",  # capitalised words after the first not found / capitalised words
    "new_quantifier",  # all, never, only ... not in the context
    "negation_only_claim",  # the claim negates, its best window does not
    "negation_only_context",  # the best window negates, the claim does not
    "heuristic_supported",  # the heuristic's verdict on this claim
    # A claim recombined from the context's words, or copied with one word swapped, has all or most of
    # its words there but not their arrangement:
    "swap_share",  # claim word trigrams (a, b, c) whose (a, _, c) is in the context but (a, b, c) is not
    "swap_any",
    "swap_content",  # ... how many of those have a content word in the middle (capped at 3)
    "swap_new",  # ... and that word is not in the context at all: a copied frame, one word replaced
    "near_3",  # neighbouring content words of the claim found within 3 words of each other in one chunk
    "near_10",
    "near_25",
    "near_skip_10",  # content words two apart in the claim, within 10 words of each other in the context
    "sentence_share",  # content words in the one context sentence holding most of them
    "answer_content_share",
    "answer_bigram_share",
    "heuristic_supported_share",
)
_QUANTIFIERS = frozenset({"all", "always", "every", "everyone", "never", "none", "nobody", "only", "entire"})
_NEGATIONS = frozenset({"not", "no", "never", "nor", "neither", "none", "cannot", "without"})
_LCS_SENTENCES = 3
_NEAR = (3, 10, 25)  # word distances for the near_* features
_FAR = 1 << 30  # distance of two words not both in one chunk
# word forms for the arrangement features: the first 5 letters ("produced" / "production")
_FORM = 5
_HEURISTIC = HeuristicJudge()


@dataclass(frozen=True, slots=True)
class AnswerFeatures:
    """An answer's claims and their feature rows (`matrix[i]` belongs to `claims[i]`), plus the
    heuristic's verdict indexes, which the learned judge reuses for failure modes."""

    claims: list[str]
    matrix: npt.NDArray[np.float64]
    heuristic_unsupported: list[int]
    heuristic_failure_mode: str
    context_sufficient: bool


def _ngrams(seq: Sequence[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)}


def _share(found: int, total: int) -> float:
    return found / total if total else 1.0


def _lcs(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence of two word lists (one row of the table at a time)."""
    if not a or not b:
        return 0
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def _form(word: str) -> str:
    return word[:_FORM]


def _negated(found: Sequence[str]) -> bool:
    return any(w in _NEGATIONS or w.endswith("n't") or w.endswith("n’t") for w in found)


class _ContextGrams:
    """The context's word n-grams, per-sentence word lists and IDF, built once per answer."""

    def __init__(self, chunks: Sequence[str]) -> None:
        per_chunk = [[words(s) for s in sentences(chunk)] for chunk in chunks]
        self.sentences: list[list[str]] = [s for chunk in per_chunk for s in chunk]
        # a chunk's words across its sentence ends, as text runs on: the same as words(chunk), since
        # sentences end only at whitespace after punctuation, which no word spans
        chunk_words = [[w for s in chunk for w in s] for chunk in per_chunk]
        self.unigrams: set[str] = set()
        self.bigrams: set[tuple[str, ...]] = set()
        self.trigrams: set[tuple[str, ...]] = set()
        for found in chunk_words:
            self.unigrams.update(found)
            self.bigrams |= _ngrams(found, 2)
            self.trigrams |= _ngrams(found, 3)
        df: dict[str, int] = {}
        for sentence in self.sentences:
            for w in set(sentence):
                df[w] = df.get(w, 0) + 1
        n = len(self.sentences)
        self.idf = {w: math.log((n + 1) / (d + 1)) + 1 for w, d in df.items()}
        self.unseen_idf = math.log(n + 1) + 1
        # (a, c) of every trigram (a, b, c): the frame a swapped middle word sits in
        self.skip_bigrams: set[tuple[str, str]] = set()
        # word form -> its positions, chunk by chunk (chunk * _FAR + position), sorted
        self.positions: dict[str, list[int]] = {}
        for c, found in enumerate(chunk_words):
            self.skip_bigrams.update(zip(found, found[2:], strict=False))
            for i, w in enumerate(found):
                self.positions.setdefault(_form(w), []).append(c * _FAR + i)
        self.sentence_forms = [{_form(w) for w in sentence} for sentence in self.sentences]

    def distance(self, a: str, b: str) -> int:
        """The fewest words between a form of `a` and a form of `b` in one chunk (`_FAR` if none)."""
        first, second = self.positions.get(_form(a)), self.positions.get(_form(b))
        if not first or not second:
            return _FAR
        best = _FAR
        for p in first:
            j = bisect.bisect_left(second, p)
            if j < len(second):
                best = min(best, second[j] - p)
            if j:
                best = min(best, p - second[j - 1])
        return best

    def arrangement(self, claim: Sequence[str]) -> list[float]:
        """The swap_*, near_* and sentence_share features of a claim's words (see `FEATURE_NAMES`)."""
        trigrams = [tuple(claim[i : i + 3]) for i in range(len(claim) - 2)]
        swapped = [t for t in trigrams if (t[0], t[2]) in self.skip_bigrams and t not in self.trigrams]
        swapped_content = [t for t in swapped if t[1] not in STOPWORDS]
        swapped_new = [t for t in swapped_content if _form(t[1]) not in self.positions]
        claim_content = content(claim)
        near = [self.distance(a, b) for a, b in itertools.pairwise(claim_content)]
        skip = [self.distance(a, b) for a, b in zip(claim_content, claim_content[2:], strict=False)]
        forms = [_form(w) for w in claim_content]
        in_sentence = max((sum(f in s for f in forms) for s in self.sentence_forms), default=0)
        return [
            _share(len(swapped), len(trigrams)) if trigrams else 0.0,
            float(bool(swapped)),
            float(min(len(swapped_content), 3)),
            float(min(len(swapped_new), 3)),
            *(_share(sum(d <= n for d in near), len(near)) for n in _NEAR),
            _share(sum(d <= 10 for d in skip), len(skip)),
            _share(in_sentence, len(forms)),
        ]

    def lcs_share(self, claim: Sequence[str]) -> float:
        if not claim:
            return 1.0
        claim_set = set(claim)
        ranked = sorted(
            range(len(self.sentences)), key=lambda i: (-len(claim_set.intersection(self.sentences[i])), i)
        )
        best = max((_lcs(claim, self.sentences[i]) for i in ranked[:_LCS_SENTENCES]), default=0)
        return best / len(claim)


def answer_features(
    question: str, context: Sequence[str], answer: str, titles: Sequence[str] = ()
) -> AnswerFeatures:
    """Feature rows of the answer's claims against the context (no rows for an answer without claims);
    `titles` are the chunks' titles, which an answer may cite by (`claims.split_claims`)."""
    verdict = _HEURISTIC.verdict(question, context, answer, titles)
    claims = answer_claims(question, answer, titles).claims
    if claims != verdict.claims:  # the heuristic splits with the same function; guard the alignment
        raise AssertionError("claims differ from the heuristic's")
    ctx = context_index(context)
    grams = _ContextGrams(context)
    answer_words = words(answer)
    answer_content = content(answer_words)
    shared = [
        _share(sum(ctx.has(w) for w in answer_content), len(answer_content)),
        _share(
            len([g for g in _ngrams(answer_words, 2) if g in grams.bigrams]), max(len(answer_words) - 1, 0)
        ),
        _share(len(verdict.supported), len(claims)),
    ]
    unsupported = set(verdict.unsupported)
    rows: list[list[float]] = []
    for i, claim in enumerate(claims):
        claim_words = words(claim)
        claim_content = content(claim_words)
        found = [ctx.has(w) for w in claim_content]
        idf = [grams.idf.get(w, grams.unseen_idf) for w in claim_content]
        window_share, _, window_negated = ctx.best_window(claim_content)
        bigrams, trigrams = _ngrams(claim_words, 2), _ngrams(claim_words, 3)
        raw = claim.split()
        capitalised = [w for w in words(" ".join(t for t in raw[1:] if t[:1].isupper())) if w]
        claim_negated = _negated([fold(t) for t in raw])
        rows.append(
            [
                _share(sum(found), len(found)),
                window_share,
                _share(sum(w in grams.unigrams for w in claim_words), len(claim_words)),
                _share(len(bigrams & grams.bigrams), len(bigrams)),
                _share(len(trigrams & grams.trigrams), len(trigrams)),
                sum(x for x, f in zip(idf, found, strict=True) if f) / sum(idf) if idf else 1.0,
                grams.lcs_share(claim_words),
                math.log1p(len(found) - sum(found)),
                float(min(len(numbers(claim) - ctx.numbers), 3)),
                float(bool(numbers(claim))),
                1.0 - _share(sum(w in ctx.words for w in capitalised), len(capitalised)),
                float(any(w in _QUANTIFIERS and w not in ctx.words for w in claim_words)),
                float(claim_negated and not window_negated),
                float(window_negated and not claim_negated),
                float(i not in unsupported),
                *grams.arrangement(claim_words),
                *shared,
            ]
        )
    matrix = np.array(rows, dtype=np.float64).reshape(len(rows), len(FEATURE_NAMES))
    return AnswerFeatures(
        claims=claims,
        matrix=matrix,
        heuristic_unsupported=list(verdict.unsupported),
        heuristic_failure_mode=verdict.failure_mode,
        context_sufficient=verdict.context_sufficient,
    )
