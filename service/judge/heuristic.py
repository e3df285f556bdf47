"""`HeuristicJudge`: the offline faithfulness judge used when no model endpoint is configured.

It is a heuristic, labelled `judge="heuristic"` everywhere, and only as good as
`bench/judge/heuristic_accuracy.py` measures it to be. It is deterministic (same
trace, same verdict) and makes no network call. How it decides:

* claims: the answer split into sentences, and sentences into clauses at
  semicolons and contrastive conjunctions; a sentence that only hedges or
  refuses ("Note: the passage does not mention ...", "I don't know") is no
  claim, the other sentences still are; citation markers (`[1]`, `[doc-3]`)
  and an opening "According to <source>:" are not part of a claim (a source
  that is one of the chunks' titles is cut as a whole, colons in it included);
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
import functools
import re
import time
from collections.abc import Sequence
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field

from service.judge.judgment import FailureMode, FailureReason, JudgeName, Judgment, Verdict
from service.judge.text import (
    INSTRUCTION_WORDS,
    TITLE_KEYS,
    ContextIndex,
    content,
    context_index,
    fold,
    numbers,
    sentences,
    words,
)
from service.model import RagTrace

__all__ = ["HEURISTIC_VERSION", "HeuristicConfig", "HeuristicJudge", "split_claims"]

HEURISTIC_VERSION = "3"

_QUANTIFIERS = frozenset({"all", "always", "every", "everyone", "never", "none", "nobody", "only", "entire"})
_REFUSAL = re.compile(
    r"\b(?:i\s+(?:do\s+not|don't|cannot|can't)\s+(?:know|answer|say|find)"
    r"|(?:cannot|can't|unable\s+to)\s+(?:answer|determine|find|tell)"
    r"|not\s+(?:enough|sufficient)\s+(?:information|context)"
    r"|no\s+(?:relevant\s+)?information"
    r"|(?:context|passages?|documents?)\s+(?:does|do)\s+not\s+(?:say|mention|contain|provide))",
    re.IGNORECASE,
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
_CITING = r"^\s*(?:according\s+to|as\s+(?:stated|described)\s+in|per)\s+"
# A source not among the chunk titles: it may be quoted, and a quoted title may hold its own colon
# ("Account: two-factor login"); unquoted, it ends at the first colon or comma.
_ACCORDING_TO = re.compile(
    _CITING + r"(?:\"[^\"]{1,120}\"|\u201c[^\u201d]{1,120}\u201d|'[^']{1,120}'|[^:,]{1,120})\s*[:,]\s*",
    re.IGNORECASE,
)
_TITLE_CHARS = 200  # longer metadata values (a path, a URL) are no title an answer cites in a sentence
_NEGATION = re.compile(r"\b(?:not|never|no|neither|nor|cannot)\b|n['’]t\b")
_CLAUSE_SPLIT = re.compile(r";\s+|,\s+(?:but|while|whereas|although)\s+", re.IGNORECASE)
_WORD = re.compile(r"\w+(?:['’]\w+)*")
_NAME = re.compile(r"[A-Z][\w'’.-]*(?:\s+(?:[A-Z][\w'’.-]*|of|de|la|van|von|der|du|da)(?=\s+[A-Z]|$|\W))*")


# Conversation, not content: an opening interjection ("yes ,", "that's great !"), a lead-in that
# only frames what follows ("i do know that ..."), and a clause about the speaker ("i love it",
# "i've never heard of it"): none of them is a claim about the context.
_INTERJECTION = re.compile(
    r"^\s*(?:(?:yes|yeah|yep|yup|no|nope|well|oh|wow|sure|ok|okay|hmm|haha|lol|right|true|indeed|"
    r"that\s*['’]?\s*s\s+(?:great|awesome|cool|interesting|amazing|true|right|good|nice|sad|funny|"
    r"wonderful|fascinating|neat)|you\s*['’]?\s*re\s+(?:welcome|right)|thanks|thank\s+you)\b[\s,.!?]*)+",
    re.IGNORECASE,
)
_LEAD_IN = re.compile(
    r"^\s*i\s+(?:do\s+|also\s+)?(?:know|think|believe|heard|read|remember|guess|learned)\s+(?:that\s+)?",
    re.IGNORECASE,
)
_SPEAKER_CLAUSE_WORDS = 6
_ABOUT_THE_SPEAKER = re.compile(r"^\s*(?:i|me|my|we|i\s*['’]\s*(?:m|ve|d|ll))\b", re.IGNORECASE)


class HeuristicConfig(BaseModel):
    """Thresholds of the heuristic judge (fixed per `HEURISTIC_VERSION`; chosen on the `tune` half of
    the dev set, `bench/judge/devset_accuracy.py`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_overlap: float = Field(default=0.7, ge=0, le=1)
    window_sentences: int = Field(default=2, ge=1)
    min_question_coverage: float = Field(default=0.5, ge=0, le=1)


def _negates(folded_claim: str) -> bool:
    return _NEGATION.search(folded_claim) is not None


def _conversational(clause: str) -> str:
    """The clause without its interjections and lead-ins; empty when it is a short one about the
    speaker ("i love indian food"; a longer one, "i visited manhattan, the largest borough of
    manhattan", still says something about the world)."""
    clause = _LEAD_IN.sub("", _INTERJECTION.sub("", clause))
    short = len(_WORD.findall(clause)) <= _SPEAKER_CLAUSE_WORDS
    return "" if short and _ABOUT_THE_SPEAKER.match(clause) else clause


@functools.lru_cache(maxsize=256)
def _citing_a_title(titles: tuple[str, ...]) -> re.Pattern[str] | None:
    """The pattern of an opening "According to <one of the titles>:", the title quoted or not, any
    case, the longest title first: a cited title is the source as a whole, colons and commas in it
    included ("Troubleshooting: can't sign in")."""
    names = sorted({" ".join(t.split()) for t in titles if 0 < len(t) <= _TITLE_CHARS}, key=len, reverse=True)
    if not names:
        return None
    name = "(?:" + "|".join(r"\s+".join(map(re.escape, n.split())) for n in names) + ")"
    return re.compile(
        _CITING + rf"(?:\"{name}\"|\u201c{name}\u201d|['\u2018]{name}['\u2019]|{name})\s*[:,]\s*",
        re.IGNORECASE,
    )


def _without_source(sentence: str, citing_a_title: re.Pattern[str] | None) -> str:
    if citing_a_title is not None:
        cut, n = citing_a_title.subn("", sentence, count=1)
        if n:
            return cut
    return _ACCORDING_TO.sub("", sentence)


def split_claims(answer: str, titles: Sequence[str] = ()) -> list[str]:
    """The answer's claims: sentences, split further into clauses, without the sentences that only
    hedge or refuse, citation markers, an opening "According to <source>:" (a source among `titles`,
    the chunks' titles, as a whole) or conversation about the speaker ("i love it"); empty for a
    refusal."""
    citing = _citing_a_title(tuple(titles))
    kept = [
        _without_source(s, citing) for s in sentences(_CITATION.sub("", answer)) if not _REFUSAL.search(s)
    ]
    claims = [_conversational(part).strip(" ,.:!?") for s in kept for part in _CLAUSE_SPLIT.split(s)]
    return [c for c in claims if _WORD.search(c)]


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

    def verdict(
        self, question: str, context: Sequence[str], answer: str, titles: Sequence[str] = ()
    ) -> Verdict:
        """The verdict for one (question, context, answer); the same inputs always give the same verdict.
        `titles` are the chunks' titles (also in `context`), which an answer may cite by."""
        ctx = context_index(context, window=self.config.window_sentences)
        all_question_words = set(content(words(question)))
        question_words = all_question_words - INSTRUCTION_WORDS
        covered = sum(1 for w in question_words if w in ctx.words)
        claims = split_claims(answer, titles)
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

    def _problem(self, claim: str, ctx: ContextIndex) -> FailureMode | None:
        """Why the context does not support a claim, or None when it does."""
        for name in _NAME.findall(claim):
            name_words = content(words(name))
            if len(name_words) > 1 and not ctx.has_phrase(words(name)) and not ctx.has_phrase(name_words):
                return "wrong_entity"
            if any(w not in ctx.words for w in name_words):
                return "wrong_entity"
        missing_numbers = numbers(claim) - ctx.numbers
        if missing_numbers:
            return "contradiction" if ctx.numbers else "fabrication"
        claim_words = words(claim)
        if any(w in _QUANTIFIERS and w not in ctx.words for w in claim_words):
            return "overgeneralization"
        claim_content = content(claim_words)
        if not claim_content:
            return None  # "yes", "no": nothing the context could confirm or refute
        found = sum(1 for w in claim_content if ctx.has(w))
        if found < self.config.min_overlap * len(claim_content):
            return "fabrication"
        # A negated claim needs a negation where its words are: "X did not win" is no reading of
        # "X won". (Requiring the words to come from one window as well, against claims recombined
        # from words spread over the context, lost more faithful summaries than it caught on the
        # dev set's tune half: 0.687 against 0.691 balanced accuracy; it is not a rule.)
        _, _, negated = ctx.best_window(claim_content)
        if _negates(fold(claim)) and not negated:
            return "contradiction"
        return None

    async def judge(self, trace: RagTrace) -> Judgment:
        """Judge one trace offline: `failed` only when it has no answer or no chunk text."""
        started, judged_at = time.perf_counter(), datetime.now(UTC)
        texts = [c.content for c in trace.retrieval.context if c.content]
        titles = [
            value
            for c in trace.retrieval.context
            for key in TITLE_KEYS
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
        # in a thread: ~20 ms for a long answer, which on the event loop delays ingest requests;
        # titles join the context (an answer cites its source by name) but do not make it non-empty
        return await asyncio.to_thread(
            self._judgment, trace, [*texts, *titles] if texts else texts, titles, started, judged_at
        )

    def _judgment(
        self, trace: RagTrace, context: list[str], titles: list[str], started: float, judged_at: datetime
    ) -> Judgment:
        verdict = self.verdict(trace.query or "", context, trace.answer or "", titles)
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
