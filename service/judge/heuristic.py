"""`HeuristicJudge`: the offline faithfulness judge used when no model endpoint is configured.

It is a heuristic, labelled `judge="heuristic"` everywhere, and only as good as
`bench/judge/heuristic_accuracy.py` measures it to be. It is deterministic (same
trace, same verdict) and makes no network call. How it decides:

* claims: as `claims.answer_claims` reads them: sentences and clauses, without
  hedges, refusals, citation markers and talk about the speaker; a bare yes or
  no to a yes/no question claims the question's proposition (or, for a no,
  denies it);
* a claim is supported when every number in it occurs in the context, every
  multi-word proper name occurs there as a phrase and every single proper
  name as a word, an absolute quantifier (all, never, ...) is not new, and at
  least `min_overlap` of its content words occur in the context;
* failure mode of the first unsupported claim: wrong_entity for a missing
  name, contradiction for a number the context does not have (fabrication when
  the context has no numbers at all), overgeneralization for a new quantifier,
  fabrication otherwise;
* a denial (a bare "no" to "Is X Y?") is supported when the context holds the
  question's names and at least half its content words but does not state the
  proposition: it fails as a contradiction when one window of the context
  holds all its content words without a negation ("X is Y" answered "no"), and
  as fabrication or wrong_entity when the context is about something else;
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
from collections.abc import Sequence
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field

from service.judge.claims import answer_claims, split_claims
from service.judge.judgment import FailureMode, FailureReason, JudgeName, Judgment, Verdict
from service.judge.text import (
    INSTRUCTION_WORDS,
    TITLE_KEYS,
    ContextIndex,
    content,
    context_index,
    fold,
    numbers,
    words,
)
from service.model import RagTrace

__all__ = ["HEURISTIC_VERSION", "HeuristicConfig", "HeuristicJudge", "split_claims"]

HEURISTIC_VERSION = "4"

_QUANTIFIERS = frozenset({"all", "always", "every", "everyone", "never", "none", "nobody", "only", "entire"})
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
_NEGATION = re.compile(r"\b(?:not|never|no|neither|nor|cannot)\b|n['’]t\b")
_NAME = re.compile(r"[A-Z][\w'’.-]*(?:\s+(?:[A-Z][\w'’.-]*|of|de|la|van|von|der|du|da)(?=\s+[A-Z]|$|\W))*")


class HeuristicConfig(BaseModel):
    """Thresholds of the heuristic judge (fixed per `HEURISTIC_VERSION`; chosen on the `tune` half of
    the dev set, `bench/judge/devset_accuracy.py`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_overlap: float = Field(default=0.7, ge=0, le=1)
    window_sentences: int = Field(default=2, ge=1)
    min_question_coverage: float = Field(default=0.5, ge=0, le=1)


def _negates(folded_claim: str) -> bool:
    return _NEGATION.search(folded_claim) is not None


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
        found = answer_claims(question, answer, titles)
        claims = found.claims
        supported: list[int] = []
        unsupported: list[int] = []
        failure_mode: FailureMode = "none"
        for i, claim in enumerate(claims):
            problem = self._denial_problem(claim, ctx) if i in found.denied else self._problem(claim, ctx)
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

    def _denial_problem(self, claim: str, ctx: ContextIndex) -> FailureMode | None:
        """Why the context does not support a denial ("no" to the question `claim` states), or None:
        its names must be there and half its content words, the proposition itself must not be."""
        for name in _NAME.findall(claim):
            if any(w not in ctx.words for w in content(words(name))):
                return "wrong_entity"
        claim_content = [w for w in content(words(claim)) if w != "case"]  # "it is not the case that"
        if not claim_content:
            return None
        if sum(1 for w in claim_content if ctx.has(w)) * 2 < len(claim_content):
            return "fabrication"
        share, _, negated = ctx.best_window(claim_content)
        return "contradiction" if share == 1.0 and not negated else None

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
