"""`HeuristicJudge`: the offline faithfulness judge used when no model endpoint is configured.

It is a heuristic, labelled `judge="heuristic"` everywhere, and only as good as
`bench/judge/heuristic_accuracy.py` measures it to be. It is deterministic (same
trace, same verdict) and makes no network call. How it decides:

* claims: the answer split into sentences, and sentences into clauses at
  semicolons and contrastive conjunctions; a sentence that only hedges or
  refuses ("Note: the passage does not mention ...", "I don't know") is no
  claim, the other sentences still are; citation markers (`[1]`, `[doc-3]`)
  and an opening "According to <source>:" are not part of a claim;
* a claim is supported when every number in it occurs in the context, every
  multi-word proper name occurs there as a phrase and every single proper
  name as a word, an absolute quantifier (all, never, ...) is not new, and at
  least `min_overlap` of its content words occur in the context;
* failure mode of the first unsupported claim: wrong_entity for a missing
  name, contradiction for a number the context does not have (fabrication when
  the context has no numbers at all), overgeneralization for a new quantifier,
  fabrication otherwise;
* context: the chunks' text and their titles (metadata `title`, `source`,
  `name`, ...), which answers cite;
* context_sufficient: at least `min_question_coverage` of the question's
  content words occur in the context, instruction and conversational words
  left out ("what do you think?" has none to cover), or the question asks to
  transform its context (summarize, rewrite, translate: the context is all it
  needs), or some are covered and at least half the claims are supported: the context
  was about the question, so what is unsupported was made up by the
  generation, not missed by retrieval.
"""

from __future__ import annotations

import asyncio
import re
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field

from service.judge.judgment import FailureMode, FailureReason, JudgeName, Judgment, Verdict
from service.model import RagTrace

__all__ = ["HEURISTIC_VERSION", "HeuristicConfig", "HeuristicJudge", "split_claims"]

HEURISTIC_VERSION = "2"

_STOPWORD_TEXT = """
a about above after again against all am an and any are as at be because been before being below
between both but by can could did do does doing down during each few for from further had has have
having he her here hers herself him himself his how i if in into is it its itself just me more most
my myself no nor not now of off on once only or other our ours out over own same she should so some
such than that the their theirs them themselves then there these they this those through to too
under until up very was we were what when where which while who whom why will with would you your
yours yes also known called named one
"""
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())
_QUANTIFIERS = frozenset({"all", "always", "every", "everyone", "never", "none", "nobody", "only", "entire"})
_REFUSAL = re.compile(
    r"\b(?:i\s+(?:do\s+not|don't|cannot|can't)\s+(?:know|answer|say|find)"
    r"|(?:cannot|can't|unable\s+to)\s+(?:answer|determine|find|tell)"
    r"|not\s+(?:enough|sufficient)\s+(?:information|context)"
    r"|no\s+(?:relevant\s+)?information"
    r"|(?:context|passages?|documents?)\s+(?:does|do)\s+not\s+(?:say|mention|contain|provide))",
    re.IGNORECASE,
)
# Words of an instruction rather than of a topic: a request to summarize or continue names no topic
# the context must cover.
_INSTRUCTION_WORDS = frozenset(
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
# A question with one of these asks to transform the context it comes with (a summary, a rewrite):
# that context is all it needs.
_TASK_VERBS = frozenset(
    {
        "summarize",
        "summarise",
        "summary",
        "tldr",
        "rewrite",
        "paraphrase",
        "rephrase",
        "translate",
        "condense",
    }
)
_CITATION = re.compile(r"\s*\[(?:\d+(?:\s*[,-]\s*\d+)*|[A-Za-z][\w.-]{0,40})\]")
_ACCORDING_TO = re.compile(
    r"^\s*(?:according\s+to|as\s+(?:stated|described)\s+in|per)\s+[^:,]{1,120}[:,]\s*", re.IGNORECASE
)
_TITLE_KEYS = ("title", "source", "name", "file_name", "filename", "doc_title", "heading", "document_title")
# A sentence ends at . ! ? before a capital, digit or quote, unless the dot closes an initial
# ("J. R. R.") or a common abbreviation.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"”')\]]*\s+(?=[\"“'(\[]?[A-Z0-9])")
_ABBREVIATION = re.compile(r"(?:\b[A-Z]|\b(?:Mr|Mrs|Ms|Dr|St|Jr|Sr|No|vs|Inc|Ltd|Co|Mt|Ft|U\.S))\.$")
_CLAUSE_SPLIT = re.compile(r";\s+|,\s+(?:but|while|whereas|although)\s+", re.IGNORECASE)
_WORD = re.compile(r"\w+(?:['’]\w+)*")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_NAME = re.compile(r"[A-Z][\w'’.-]*(?:\s+(?:[A-Z][\w'’.-]*|of|de|la|van|von|der|du|da)(?=\s+[A-Z]|$|\W))*")


class HeuristicConfig(BaseModel):
    """Thresholds of the heuristic judge (fixed per `HEURISTIC_VERSION`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_overlap: float = Field(default=0.75, ge=0, le=1)
    min_question_coverage: float = Field(default=0.5, ge=0, le=1)


def _fold(text: str) -> str:
    # Case and accents differ between answers and sources ("Beyonce" / "Beyoncé").
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def _stem(word: str) -> str:
    if word.endswith("'s") or word.endswith("’s"):
        word = word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    return word


def _words(text: str) -> list[str]:
    return [_stem(w) for w in _WORD.findall(_fold(text))]


def _content(words: Sequence[str]) -> list[str]:
    return [w for w in words if w not in _STOPWORDS and (len(w) > 1 or w.isdigit())]


def _numbers(text: str) -> set[str]:
    return {n.replace(",", "").rstrip(".") for n in _NUMBER.findall(text)}


def split_claims(answer: str) -> list[str]:
    """The answer's claims: sentences, split further into clauses, without the sentences that only
    hedge or refuse, citation markers or an opening "According to <source>:"; empty for a refusal."""
    answer = _CITATION.sub("", answer)
    sentences: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(answer):
        head = answer[start : match.start()].rstrip("\"”')]")
        if _ABBREVIATION.search(head):
            continue
        sentences.append(answer[start : match.start()])
        start = match.end()
    sentences.append(answer[start:])
    kept = [_ACCORDING_TO.sub("", s) for s in sentences if not _REFUSAL.search(s)]
    claims = [part.strip(" ,.:") for s in kept for part in _CLAUSE_SPLIT.split(s)]
    return [c for c in claims if _WORD.search(c)]


@dataclass(frozen=True, slots=True)
class _Context:
    text: str  # folded, words joined by single spaces, for phrase lookups
    words: frozenset[str]
    numbers: frozenset[str]

    @classmethod
    def of(cls, chunks: Sequence[str]) -> _Context:
        joined = "\n".join(chunks)
        words = _words(joined)
        return cls(f" {' '.join(words)} ", frozenset(words), frozenset(_numbers(joined)))

    def has_phrase(self, words: Sequence[str]) -> bool:
        return f" {' '.join(words)} " in self.text


class HeuristicJudge:
    """The offline judge (see the module docstring); pure CPU, deterministic, never raises for a trace."""

    def __init__(self, config: HeuristicConfig | None = None) -> None:
        self.config = config or HeuristicConfig()

    @property
    def name(self) -> JudgeName:
        return "heuristic"

    @property
    def version(self) -> str:
        return f"heuristic/{HEURISTIC_VERSION}"

    async def aclose(self) -> None:
        return None

    def verdict(self, question: str, context: Sequence[str], answer: str) -> Verdict:
        """The verdict for one (question, context, answer); the same inputs always give the same verdict."""
        ctx = _Context.of(context)
        all_question_words = set(_content(_words(question)))
        question_words = all_question_words - _INSTRUCTION_WORDS
        covered = sum(1 for w in question_words if w in ctx.words)
        claims = split_claims(answer)
        supported: list[int] = []
        unsupported: list[int] = []
        failure_mode: FailureMode = "none"
        for i, claim in enumerate(claims):
            problem = self._problem(claim, ctx)
            if problem is None:
                supported.append(i)
                continue
            unsupported.append(i)
            if failure_mode == "none":
                failure_mode = problem
        sufficient = bool(context) and (
            not _TASK_VERBS.isdisjoint(all_question_words)
            or covered >= self.config.min_question_coverage * len(question_words)
            or (covered > 0 and bool(claims) and len(supported) * 2 >= len(claims))
        )
        return Verdict(
            claims=claims,
            supported=supported,
            unsupported=unsupported,
            outcome="scored" if claims else "no_claims",
            failure_mode=failure_mode,
            context_sufficient=sufficient,
            rationale=f"heuristic: {len(supported)} of {len(claims)} claims found in the context",
        )

    def _problem(self, claim: str, ctx: _Context) -> FailureMode | None:
        """Why the context does not support a claim, or None when it does."""
        for name in _NAME.findall(claim):
            words = _content(_words(name))
            if len(words) > 1 and not ctx.has_phrase(_words(name)) and not ctx.has_phrase(words):
                return "wrong_entity"
            if any(w not in ctx.words for w in words):
                return "wrong_entity"
        missing_numbers = _numbers(claim) - ctx.numbers
        if missing_numbers:
            return "contradiction" if ctx.numbers else "fabrication"
        words = _words(claim)
        if any(w in _QUANTIFIERS and w not in ctx.words for w in words):
            return "overgeneralization"
        content = _content(words)
        if not content:
            return None  # "yes", "no": nothing the context could confirm or refute
        found = sum(1 for w in content if w in ctx.words)
        return None if found >= self.config.min_overlap * len(content) else "fabrication"

    async def judge(self, trace: RagTrace) -> Judgment:
        """Judge one trace offline: `failed` only when it has no answer or no chunk text."""
        started, judged_at = time.perf_counter(), datetime.now(UTC)
        texts = [c.content for c in trace.retrieval.context if c.content]
        titles = [
            value
            for c in trace.retrieval.context
            for key in _TITLE_KEYS
            if isinstance(value := (c.metadata or {}).get(key), str) and value
        ]
        reason: FailureReason | None = None
        if not trace.answer or not trace.answer.strip():
            reason = "no_answer"
        elif trace.retrieval.context and not texts:
            reason = "no_context"
        if reason is not None:
            return Judgment.failed(
                trace,
                reason,
                judge="heuristic",
                judge_version=self.version,
                judge_model=None,
                calls=(),
                latency_s=time.perf_counter() - started,
                judged_at=judged_at,
            )
        # in a thread: ~20 ms for a long answer, which on the event loop delays ingest requests
        # titles join the context (an answer cites its source by name) but do not make it non-empty
        verdict = await asyncio.to_thread(
            self.verdict, trace.query or "", [*texts, *titles] if texts else texts, trace.answer or ""
        )
        return Judgment.from_verdict(
            trace,
            verdict,
            judge="heuristic",
            judge_version=self.version,
            judge_model=None,
            calls=(),
            latency_s=time.perf_counter() - started,
            judged_at=judged_at,
        )
