"""Words, sentences and lookups shared by the offline heuristic judge and the diagnosis evidence.

Both must read a text the same way: the evidence names the chunks where the heuristic found a
claim's words, and an LLM judgment's evidence is found with the same lookups.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

__all__ = [
    "INSTRUCTION_WORDS",
    "STOPWORDS",
    "TITLE_KEYS",
    "ContextIndex",
    "content",
    "context_index",
    "fold",
    "numbers",
    "sentences",
    "words",
]

_STOPWORD_TEXT = """
a about above after again against all am an and any are as at be because been before being below
between both but by can could did do does doing down during each few for from further had has have
having he her here hers herself him himself his how i if in into is it its itself just me more most
my myself no nor not now of off on once only or other our ours out over own same she should so some
such than that the their theirs them themselves then there these they this those through to too
under until up very was we were what when where which while who whom why will with would you your
yours yes also known called named one
"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())
# Words of an instruction rather than of a topic: a request to summarize or continue names no topic
# the context must cover.
INSTRUCTION_WORDS = frozenset(
    {
        "summarize",
        "summarise",
        "summary",
        "summarization",
        "rewrite",
        "paraphrase",
        "translate",
        "explain",
        "describe",
        "continue",
        "respond",
        "reply",
        "answer",
        "write",
        "list",
        "tldr",
        "following",
        "text",
        "passage",
        "document",
        "article",
        "conversation",
        "dialogue",
        "above",
        "below",
        "given",
        "please",
        "briefly",
        "short",
        "sentence",
        "sentences",
        "paragraph",
        "user",
        "assistant",
        "say",
        "next",
        "think",
        "tell",
        "know",
        "mean",
        "really",
        "sure",
        "okay",
        "ok",
        "yeah",
        "thanks",
        "thank",
        "hi",
        "hello",
        "well",
        "like",
    }
)
# chunk metadata keys that name the chunk: answers cite a chunk by its title
TITLE_KEYS = ("title", "source", "name", "file_name", "filename", "doc_title", "heading", "document_title")
_WORD = re.compile(r"\w+(?:['’]\w+)*")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
# A sentence ends at . ! ? before a capital, digit or quote, unless the dot closes an initial
# ("J. R. R.") or a common abbreviation; or at a dot, ! or ? that stands apart from the word before it
# (tokenized text: "a singer . she sang"), whatever follows.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"”')\]]*\s+(?=[\"“'(\[]?[A-Z0-9])|(?<=\s[.!?])\s+(?=\S)")
_ABBREVIATION = re.compile(r"(?:\b[A-Z]|\b(?:Mr|Mrs|Ms|Dr|St|Jr|Sr|No|vs|Inc|Ltd|Co|Mt|Ft|U\.S))\.$")
# word forms that count as one: at least this many leading letters in common, and at most
# _SUFFIX letters past them on either side ("american" / "america", "produced" / "production")
_PREFIX = 5
_SUFFIX = 3


def fold(text: str) -> str:
    """Case and accents folded: answers and sources differ in both ("Beyonce" / "Beyoncé")."""
    folded = text.casefold()
    if folded.isascii():  # most text: nothing to decompose, and the per-character walk was half a judgment
        return folded
    decomposed = unicodedata.normalize("NFKD", folded)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def _stem(word: str) -> str:
    if word in STOPWORDS:
        return word  # "does" is not the plural of "doe"
    if word.endswith("'s") or word.endswith("’s"):
        word = word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    return word


class _Stems(dict[str, str]):
    """word -> `_stem(word)`, filled as words are met: a judgment stems the same words many times
    (every index, feature and claim), and a dictionary hit costs a fraction of the call."""

    LIMIT = 1 << 17  # words are untrusted text: the memo is emptied rather than let grow

    def __missing__(self, word: str) -> str:
        if len(self) >= self.LIMIT:
            self.clear()
        stem = self[word] = _stem(word)
        return stem


_STEMS = _Stems()


def words(text: str) -> list[str]:
    """The text's words, folded, possessives and plural s removed."""
    stems = _STEMS
    return [stems[w] for w in _WORD.findall(fold(text))]


def content(found: Sequence[str]) -> list[str]:
    """The words that carry content: no stopwords, no single letters (single digits stay)."""
    return [w for w in found if w not in STOPWORDS and (len(w) > 1 or w.isdigit())]


def numbers(text: str) -> set[str]:
    return {n.replace(",", "").rstrip(".") for n in _NUMBER.findall(text)}


def sentences(text: str) -> list[str]:
    """The text cut into sentences (see `_SENTENCE_END`); the pieces keep their punctuation."""
    found: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(text):
        head = text[start : match.start()].rstrip("\"”')]")
        if _ABBREVIATION.search(head):
            continue
        found.append(text[start : match.start()])
        start = match.end()
    found.append(text[start:])
    return [s for s in found if s.strip()]


@lru_cache(maxsize=1 << 16)
def _prefixes(word: str) -> tuple[str, ...]:
    # cached: a context repeats its words, and building the prefix sets was a third of an index
    return tuple(word[:n] for n in range(_PREFIX, len(word) + 1))


@dataclass(frozen=True, slots=True)
class _Span:
    """One sentence of one chunk, as words."""

    chunk: int
    words: frozenset[str]
    prefixes: frozenset[str]
    negated: bool


_NEGATIONS = frozenset({"not", "no", "never", "nor", "neither", "none", "cannot", "without"})


def _negated(found: Iterable[str]) -> bool:
    return any(w in _NEGATIONS or w.endswith("n't") or w.endswith("n’t") for w in found)


def context_index(chunks: Sequence[str], window: int = 2) -> ContextIndex:
    """The `ContextIndex` of `chunks`, shared: one judgment asks for the same context's index more
    than once (the verdict, the learned judge's features), and building one is most of a judgment.
    Indexes are read-only after they are built."""
    return _cached_index(tuple(chunks), window)


class ContextIndex:
    """The chunks' words, whole and per sentence, for the lookups a claim needs.

    `has` finds a word or another form of it (see `_PREFIX`); `best_window` finds the run of
    consecutive sentences (within one chunk) that holds most of a claim's words, which tells a
    claim taken from one place from one recombined out of words spread over the whole context.
    Each chunk is read once however many contexts it is retrieved into (`_read_chunk`).
    """

    def __init__(self, chunks: Sequence[str], window: int = 2) -> None:
        self.chunks = list(chunks)
        self.window = window
        read = [_read_chunk(chunk, window) for chunk in self.chunks]
        self.spans = [
            _Span(i, found, prefixes, negated)
            for i, chunk in enumerate(read)
            for found, prefixes, negated in chunk.sentences
        ]
        # runs of `window` consecutive sentences of one chunk: (words, prefixes, chunk, negated)
        self._windows: list[tuple[frozenset[str], frozenset[str], int, bool]] = [
            (found, prefixes, i, negated)
            for i, chunk in enumerate(read)
            for found, prefixes, negated in chunk.windows
        ]
        self._chunk_sets = [(chunk.words, chunk.prefixes) for chunk in read]
        self.text = f" {' '.join([word for chunk in read for word in chunk.all_words])} "  # phrase lookups
        self.words = _union([chunk.words for chunk in read])
        self.prefixes = _union([chunk.prefixes for chunk in read])
        self.numbers = _union([chunk.numbers for chunk in read])

    def has_phrase(self, phrase: Sequence[str]) -> bool:
        return f" {' '.join(phrase)} " in self.text

    def has(
        self, word: str, words_: frozenset[str] | None = None, prefixes: frozenset[str] | None = None
    ) -> bool:
        """Whether `word`, or a form of it, is in the context (or in the given word and prefix sets)."""
        words_ = self.words if words_ is None else words_
        prefixes = self.prefixes if prefixes is None else prefixes
        return word in words_ or not prefixes.isdisjoint(_forms(word))

    def _hits(
        self, claim_words: Sequence[str], found_words: frozenset[str], found_prefixes: frozenset[str]
    ) -> int:
        return sum(1 for w in claim_words if w in found_words or not found_prefixes.isdisjoint(_forms(w)))

    def best_window(self, claim_words: Sequence[str]) -> tuple[float, list[int], bool]:
        """(share of `claim_words` found in the best window, the chunks of that window, whether
        the window has a negation); (0, [], False) for an empty context."""
        if not claim_words:
            return 1.0, [], False
        best: tuple[float, list[int], bool] = (0.0, [], False)
        for found_words, found_prefixes, chunk, negated in self._windows:
            share = self._hits(claim_words, found_words, found_prefixes) / len(claim_words)
            if share > best[0]:
                best = (share, [chunk], negated)
                if share == 1.0:
                    break
        return best

    def chunks_with(self, claim_words: Sequence[str], min_share: float) -> list[int]:
        """Indexes of the chunks that hold at least `min_share` of `claim_words`."""
        if not claim_words:
            return []
        return [
            i
            for i, (found_words, found_prefixes) in enumerate(self._chunk_sets)
            if self._hits(claim_words, found_words, found_prefixes) >= min_share * len(claim_words)
        ]


@lru_cache(maxsize=1 << 16)
def _forms(word: str) -> tuple[str, ...]:
    """The prefixes of `word` that make another form of it (see `_PREFIX`, `_SUFFIX`): a context
    word with one of them as its prefix matches. Cached: a claim's words are looked up in every
    window of the context."""
    if len(word) < _PREFIX:
        return ()
    return tuple(word[:n] for n in range(max(_PREFIX, len(word) - _SUFFIX), len(word) + 1))


@lru_cache(maxsize=8)
def _cached_index(chunks: tuple[str, ...], window: int) -> ContextIndex:
    return ContextIndex(chunks, window)


@dataclass(frozen=True, slots=True)
class _ReadChunk:
    """One chunk as a `ContextIndex` reads it: what the index of any context holding it is made of."""

    all_words: tuple[str, ...]  # every word, in order
    sentences: tuple[tuple[frozenset[str], frozenset[str], bool], ...]  # (words, prefixes, negated)
    windows: tuple[tuple[frozenset[str], frozenset[str], bool], ...]  # from each sentence, `window` of them
    words: frozenset[str]
    prefixes: frozenset[str]
    numbers: frozenset[str]


# A knowledge base's popular chunks come back in context after context: each is read once while
# it stays among the `_READ_CHUNKS` used last. An entry holds a chunk's text and its word and
# prefix sets, ~30 KiB for a 500-character chunk: ~16 MiB in all.
_READ_CHUNKS = 512


@lru_cache(maxsize=_READ_CHUNKS)
def _read_chunk(chunk: str, window: int) -> _ReadChunk:
    all_words: list[str] = []
    sentences_: list[tuple[frozenset[str], frozenset[str], bool]] = []
    for sentence in sentences(chunk):
        found = words(sentence)
        all_words.extend(found)
        sentences_.append(
            (
                frozenset(found),
                frozenset().union(*map(_prefixes, found)),
                _negated(_WORD.findall(fold(sentence))),
            )
        )
    windows = []
    for start in range(len(sentences_)):
        run = sentences_[start : start + window]
        found_sets, prefix_sets, negations = zip(*run, strict=True)
        windows.append((_union(found_sets), _union(prefix_sets), any(negations)))
    found_sets, prefix_sets, _ = zip(*sentences_, strict=True) if sentences_ else ((), (), ())
    return _ReadChunk(
        tuple(all_words),
        tuple(sentences_),
        tuple(windows),
        _union(found_sets),
        _union(prefix_sets),
        frozenset(numbers(chunk)),
    )


def _union(sets: Sequence[frozenset[str]]) -> frozenset[str]:
    """The union of `sets`; the one set itself when there is one (frozensets are never changed)."""
    return sets[0] if len(sets) == 1 else frozenset().union(*sets)
