"""The evidence behind a judgment's diagnosis: which chunks hold which claim, and what was missing.

A verdict says which claims are supported and whether the context sufficed; a reader of a
`retrieval_failure` needs to see why. `diagnosis_evidence` attaches, for every claim, the ids of
the chunks that hold most of its words (and the words no chunk has), and the question's terms
that no chunk contains. It is found by word lookups (`service.judge.text`, the heuristic
judge's own reading of a text), for every judge alike: an LLM judge's verdict names no chunks,
so its evidence says where the claim's words are, not why the model decided as it did
(`method` says so).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from service.judge.text import INSTRUCTION_WORDS, TITLE_KEYS, content, context_index, words
from service.model import Chunk

__all__ = ["ClaimEvidence", "DiagnosisEvidence", "diagnosis_evidence"]

# a chunk holds a claim when it has this share of the claim's content words (the heuristic
# judge's own support threshold)
HOLDS_SHARE = 0.7


class ClaimEvidence(BaseModel):
    """Where one claim's words are in the context."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    claim: int  # index into the judgment's claims
    supported: bool  # the judge's call, repeated so that each entry reads on its own
    chunks: tuple[str, ...]  # ids of the chunks holding >= 70 % of its content words, in context order
    missing_words: tuple[str, ...]  # its content words that no chunk has


class DiagnosisEvidence(BaseModel):
    """What a diagnosis rests on: the claims' chunks and the question terms the context lacks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["lexical"] = "lexical"
    claims: tuple[ClaimEvidence, ...] = ()
    question_terms: tuple[str, ...] = ()  # the question's content words, instructions left out
    missing_question_terms: tuple[str, ...] = ()  # of those, the ones in no chunk
    summary: str = ""


def chunk_texts(chunks: Sequence[Chunk]) -> tuple[list[str], list[str]]:
    """(ids, texts) of the chunks with text; a chunk's text includes its title, which answers cite."""
    ids, texts = [], []
    for c in chunks:
        if not c.content:
            continue
        titles = [v for k in TITLE_KEYS if isinstance(v := (c.metadata or {}).get(k), str) and v]
        ids.append(c.id)
        texts.append("\n".join([c.content, *titles]))
    return ids, texts


def _unique(found: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(found))


def diagnosis_evidence(
    question: str,
    chunks: Sequence[Chunk],
    claims: Sequence[str],
    supported: Sequence[int],
    diagnosis: str,
) -> DiagnosisEvidence:
    """The evidence for a verdict on (question, chunks): see the module docstring."""
    ids, texts = chunk_texts(chunks)
    ctx = context_index(texts)
    held = set(supported)
    per_claim = []
    for i, claim in enumerate(claims):
        claim_words = _unique(content(words(claim)))
        per_claim.append(
            ClaimEvidence(
                claim=i,
                supported=i in held,
                chunks=tuple(ids[k] for k in ctx.chunks_with(claim_words, HOLDS_SHARE)),
                missing_words=tuple(w for w in claim_words if not ctx.has(w)),
            )
        )
    terms = _unique([w for w in content(words(question)) if w not in INSTRUCTION_WORDS])
    missing = tuple(w for w in terms if w not in ctx.words)
    return DiagnosisEvidence(
        claims=tuple(per_claim),
        question_terms=terms,
        missing_question_terms=missing,
        summary=_summary(diagnosis, per_claim, terms, missing, len(ids)),
    )


def _summary(
    diagnosis: str,
    claims: Sequence[ClaimEvidence],
    terms: Sequence[str],
    missing: Sequence[str],
    n_chunks: int,
) -> str:
    unsupported = [c for c in claims if not c.supported]
    if diagnosis == "retrieval_failure":
        lacking = ", ".join(missing) if missing else "none"
        return (
            f"retrieval: {len(missing)} of {len(terms)} question terms are in none of the {n_chunks} chunks "
            f"({lacking}); {len(unsupported)} of {len(claims)} claims unsupported"
        )
    if diagnosis == "generation_failure":
        made_up = sorted({w for c in unsupported for w in c.missing_words})
        return (
            "generation: the context covers the question "
            f"({len(terms) - len(missing)} of {len(terms)} terms), "
            f"yet {len(unsupported)} of {len(claims)} claims are unsupported"
            + (f"; words in no chunk: {', '.join(made_up[:12])}" if made_up else "")
        )
    if diagnosis in ("correct_abstention", "unnecessary_abstention"):
        return f"abstention: {len(terms) - len(missing)} of {len(terms)} question terms are in the context"
    return f"every claim supported, by {len({k for c in claims for k in c.chunks})} of {n_chunks} chunks"
