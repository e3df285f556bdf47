"""service/judge/text.py: folding and the context index agree with their slow definitions.

`fold` skips Unicode decomposition for ASCII text and `ContextIndex` caches word prefixes
(both for speed, bench/RESULTS.md); these tests pin that the shortcuts change no result."""

from __future__ import annotations

import unicodedata

import pytest

from service.judge.text import ContextIndex, _read_chunk, fold, words


def _fold_by_definition(text: str) -> str:
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


@pytest.mark.parametrize(
    "text",
    [
        "Plain ASCII, MIXED case: 42 items.",
        "Beyoncé sang in São Paulo",
        "Straße and STRASSE",
        "ﬁnancial ﬂows",  # ligatures decompose under NFKD
        "Ǆemal ⅻ ①",
        "",
    ],
)
def test_fold_matches_its_definition(text: str) -> None:
    assert fold(text) == _fold_by_definition(text)


def test_accents_and_case_are_folded() -> None:
    assert fold("Beyoncé") == "beyonce"
    assert fold("STRASSE") == fold("Straße") == "strasse"


def test_context_index_prefixes_are_every_form_of_its_words() -> None:
    chunks = ["The production of cars rose. Producers were happy!", "América imported them."]
    ctx = ContextIndex(chunks)
    expected = {w[:n] for w in ctx.words for n in range(5, len(w) + 1)}
    assert ctx.prefixes == expected
    assert ctx.has("produced") and ctx.has("american")
    assert not ctx.has("bicycles")
    for span in ctx.spans:
        assert span.prefixes == {w[:n] for w in span.words for n in range(5, len(w) + 1)}
    # the same chunks twice give the same index (the prefix cache is shared across indexes)
    again = ContextIndex(chunks)
    assert again.prefixes == ctx.prefixes and again.words == ctx.words == frozenset(words(" ".join(chunks)))


def _index_parts(ctx: ContextIndex) -> tuple[object, ...]:
    spans = [(s.chunk, s.words, s.prefixes, s.negated) for s in ctx.spans]
    return (ctx.text, ctx.words, ctx.prefixes, ctx.numbers, ctx._windows, ctx._chunk_sets, spans)


def test_a_chunk_is_read_once_and_every_context_holding_it_indexes_as_if_read_afresh() -> None:
    a = "The warehouse ships within 2 days. Returns take 14 days."
    b = "Refunds are not issued for opened items. Store credit is offered instead!"
    c = "Gift cards never expire. They cannot be exchanged for cash."
    _read_chunk.cache_clear()
    ContextIndex([a, b])
    warm = ContextIndex([b, c, b])  # b read already, and twice in this context
    assert _read_chunk.cache_info().misses == 3, "each distinct chunk is read once"
    _read_chunk.cache_clear()
    assert _index_parts(warm) == _index_parts(ContextIndex([b, c, b]))
    # the parts a context is made of, chunk by chunk: windows stay within their chunk
    assert [chunk for _, _, chunk, _ in warm._windows] == [0, 0, 1, 1, 2, 2]
    assert warm.numbers == frozenset() and ContextIndex([a]).numbers == {"2", "14"}
    assert warm.best_window(words("gift cards expire")) == (1.0, [1], True)
    assert warm.chunks_with(words("store credit"), 1.0) == [0, 2]
