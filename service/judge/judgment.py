"""What a faithfulness judge says about one trace: the wire `Verdict` and the stored `Judgment`.

`Verdict` is the structured output a judge model must return. It validates
itself: the supported and unsupported claim indexes must form a complete,
disjoint partition of the extracted claims, `outcome` must agree with the
claim list and `failure_mode` with the partition. A reply that breaks any of
these fails pydantic validation with the error type `partition_violation` or
`inconsistent_verdict`, so callers can tell a judge error from a score.

`Judgment` is the record every judge (LLM or heuristic) produces, one per
judged trace, with the cost of every call that went into it. Its identity for
idempotent storage is (tenant, trace_id, judge_version).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal, Protocol, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from service.judge.evidence import DiagnosisEvidence, diagnosis_evidence
from service.labels import FailureReason
from service.model import RagTrace

__all__ = [
    "TRANSIENT_REASONS",
    "CostFn",
    "Diagnosis",
    "FailureMode",
    "FailureReason",
    "Judge",
    "JudgeCall",
    "JudgeName",
    "Judgment",
    "Outcome",
    "Verdict",
    "VerdictOutcome",
    "check_verdict",
    "diagnose",
]

CostFn = Callable[[str, int, int], float | None]
"""(model, input_tokens, output_tokens) -> USD, or None when the model has no price."""

JudgeName = Literal["llm", "heuristic"]
VerdictOutcome = Literal["scored", "no_claims"]
Outcome = Literal["scored", "no_claims", "failed"]
FailureMode = Literal[
    "none", "fabrication", "overgeneralization", "wrong_entity", "stale_fact", "contradiction"
]
Diagnosis = Literal[
    "ok", "retrieval_failure", "generation_failure", "correct_abstention", "unnecessary_abstention"
]
# Reasons that say nothing about the trace: the same trace may well be judged later.
TRANSIENT_REASONS: frozenset[FailureReason] = frozenset(
    {"rate_limited", "server_error", "timeout", "connection_error"}
)


def _lean_schema(schema: dict[str, Any]) -> None:
    # The schema travels with every judge call and counts as prompt tokens: drop what
    # the model does not need (this docstring, generated titles).
    schema.pop("description", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)


class Verdict(BaseModel):
    """A judge's structured verdict on one answer: claims, their partition, and what went wrong.

    Validation guarantees: every claim index appears in exactly one of `supported` and
    `unsupported` (error type `partition_violation`); `outcome` is `no_claims` exactly
    when there are no claims, and `failure_mode` is `none` exactly when no claim is
    unsupported (error type `inconsistent_verdict`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra=_lean_schema)

    claims: list[str] = Field(description="atomic factual claims of the answer")
    supported: list[int] = Field(description="0-based indexes of claims the context supports")
    unsupported: list[int] = Field(description="0-based indexes of the other claims")
    outcome: VerdictOutcome
    failure_mode: FailureMode
    context_sufficient: bool
    rationale: str

    @model_validator(mode="after")
    def _partition(self) -> Self:
        check_verdict(self)
        return self


def check_verdict(verdict: Verdict) -> None:
    """Raise a pydantic custom error unless the verdict's partition and labels are consistent."""
    n = len(verdict.claims)
    indexes = [*verdict.supported, *verdict.unsupported]
    if len(set(indexes)) != len(indexes):
        raise PydanticCustomError("partition_violation", "a claim index is listed twice")
    if set(indexes) != set(range(n)):
        raise PydanticCustomError(
            "partition_violation",
            "supported and unsupported must cover claim indexes 0..{last} exactly",
            {"last": n - 1},
        )
    if (verdict.outcome == "no_claims") != (n == 0):
        raise PydanticCustomError(
            "inconsistent_verdict", "outcome no_claims exactly when there are no claims"
        )
    if (verdict.failure_mode == "none") != (not verdict.unsupported):
        raise PydanticCustomError(
            "inconsistent_verdict", "failure_mode is none exactly when no claim is unsupported"
        )


def diagnose(outcome: VerdictOutcome, context_sufficient: bool, unsupported: int) -> Diagnosis:
    """Where an answer went wrong, from whether the context sufficed and the verdict.

    An answer with no claims is an abstention, correct when the context was
    insufficient. A faithful answer is `ok` even on insufficient context: nothing
    was made up, the answer is only as complete as what was retrieved.
    """
    if outcome == "no_claims":
        return "unnecessary_abstention" if context_sufficient else "correct_abstention"
    if unsupported == 0:
        return "ok"
    return "generation_failure" if context_sufficient else "retrieval_failure"


class JudgeCall(BaseModel):
    """One request to a judge model: what it cost and how it ended.

    Tokens are None when the provider sent no usage (`usage_reported` False) or
    there was no reply; `cost_usd` is None when the model has no known price.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    attempt: int = Field(ge=1)
    status: Literal["ok"] | FailureReason
    http_status: int | None = None
    waited_s: float = Field(default=0.0, ge=0, description="backoff slept before this call")
    latency_s: float = Field(ge=0)
    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int | None = Field(default=None, ge=0)
    usage_reported: bool = False
    cost_usd: float | None = Field(default=None, ge=0)


class Judgment(BaseModel):
    """The outcome of judging one trace, from any judge, with every call it took.

    `outcome` is `scored` (with a faithfulness in [0, 1]), `no_claims` (no
    faithfulness; counted apart) or `failed` (with `failure_reason`; the verdict
    fields are empty). Validation enforces these shapes and recomputes nothing:
    `faithfulness` must equal supported / claims.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    trace_id: str
    tenant: str = "default"
    app: str = "unknown"
    judge: JudgeName
    judge_model: str | None = None
    judge_version: str
    outcome: Outcome
    faithfulness: float | None = Field(default=None, ge=0, le=1)
    claims: tuple[str, ...] = ()
    supported: tuple[int, ...] = ()
    unsupported: tuple[int, ...] = ()
    failure_mode: FailureMode | None = None
    context_sufficient: bool | None = None
    diagnosis: Diagnosis | None = None
    evidence: DiagnosisEvidence | None = Field(
        default=None, description="which chunks hold which claim, and what the context lacks"
    )
    rationale: str | None = None
    failure_reason: FailureReason | None = None
    calls: tuple[JudgeCall, ...] = ()
    latency_s: float = Field(
        default=0.0, ge=0, description="wall time of the whole judgment, backoff included"
    )
    judged_at: datetime
    trace_revision: int = Field(
        default=0,
        ge=0,
        description="the revision of the trace version judged: a judgment of a later version (its "
        "answer arrived late) replaces this one",
    )

    @model_validator(mode="after")
    def _shape(self) -> Self:
        if self.outcome == "failed":
            if self.failure_reason is None:
                raise ValueError("a failed judgment needs a failure_reason")
            if (
                self.faithfulness is not None
                or self.claims
                or self.diagnosis is not None
                or self.evidence is not None
            ):
                raise ValueError("a failed judgment carries no verdict")
            return self
        if self.failure_reason is not None:
            raise ValueError("only a failed judgment has a failure_reason")
        if self.failure_mode is None or self.context_sufficient is None or self.diagnosis is None:
            raise ValueError("a verdict needs failure_mode, context_sufficient and diagnosis")
        if self.outcome == "no_claims":
            if self.claims or self.faithfulness is not None:
                raise ValueError("a no_claims judgment has no claims and no faithfulness")
            return self
        if not self.claims or self.faithfulness is None:
            raise ValueError("a scored judgment needs claims and a faithfulness")
        if abs(self.faithfulness - len(self.supported) / len(self.claims)) > 1e-9:
            raise ValueError("faithfulness must equal supported / claims")
        return self

    @classmethod
    def from_verdict(
        cls,
        trace: RagTrace,
        verdict: Verdict,
        *,
        judge: JudgeName,
        judge_version: str,
        judge_model: str | None,
        calls: tuple[JudgeCall, ...],
        latency_s: float,
        judged_at: datetime,
    ) -> Judgment:
        """The judgment a valid verdict gives: faithfulness = supported / claims, plus its diagnosis
        and the evidence for it (`service.judge.evidence`; word lookups over the context, a few
        milliseconds for long contexts: call it off the event loop)."""
        scored = verdict.outcome == "scored"
        diagnosis = diagnose(verdict.outcome, verdict.context_sufficient, len(verdict.unsupported))
        evidence = diagnosis_evidence(
            trace.query or "", trace.retrieval.context, verdict.claims, verdict.supported, diagnosis
        )
        return cls(
            trace_id=trace.trace_id,
            tenant=trace.tenant,
            app=trace.app,
            judge=judge,
            judge_model=judge_model,
            judge_version=judge_version,
            outcome=verdict.outcome,
            faithfulness=len(verdict.supported) / len(verdict.claims) if scored else None,
            claims=tuple(verdict.claims),
            supported=tuple(sorted(verdict.supported)),
            unsupported=tuple(sorted(verdict.unsupported)),
            failure_mode=verdict.failure_mode,
            context_sufficient=verdict.context_sufficient,
            diagnosis=diagnosis,
            evidence=evidence,
            rationale=verdict.rationale,
            calls=calls,
            latency_s=latency_s,
            judged_at=judged_at,
        )

    @classmethod
    def failed(
        cls,
        trace: RagTrace,
        reason: FailureReason,
        *,
        judge: JudgeName,
        judge_version: str,
        judge_model: str | None,
        calls: tuple[JudgeCall, ...],
        latency_s: float,
        judged_at: datetime,
    ) -> Judgment:
        """A recorded judge failure: no verdict, the reason, and the calls it took."""
        return cls(
            trace_id=trace.trace_id,
            tenant=trace.tenant,
            app=trace.app,
            judge=judge,
            judge_model=judge_model,
            judge_version=judge_version,
            outcome="failed",
            failure_reason=reason,
            calls=calls,
            latency_s=latency_s,
            judged_at=judged_at,
        )

    @property
    def retryable(self) -> bool:
        """True when the failure says nothing about the trace, so judging it later may succeed."""
        return self.failure_reason in TRANSIENT_REASONS

    @property
    def prompt_tokens(self) -> int:
        return sum(c.prompt_tokens or 0 for c in self.calls)

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens or 0 for c in self.calls)

    @property
    def cost_usd(self) -> float | None:
        """Summed cost of the calls that could be priced; None when none could."""
        known = [c.cost_usd for c in self.calls if c.cost_usd is not None]
        return sum(known) if known else None

    @property
    def calls_without_usage(self) -> int:
        """Calls that got a reply whose provider reported no token usage."""
        return sum(1 for c in self.calls if c.http_status is not None and not c.usage_reported)


class Judge(Protocol):
    """Anything that judges the faithfulness of one trace (the LLM judge, the heuristic judge).

    `judge` never raises for a problem with one trace or one reply: it returns a
    `Judgment` with outcome `failed` and the reason. An implementation may raise
    `JudgeUnavailable` when its endpoint is down so the caller keeps the work
    queued; it documents when. Judging the same trace twice with the same
    `version` is meant to give the same verdict; callers key results by
    (trace id, version).
    """

    @property
    def name(self) -> JudgeName: ...

    @property
    def version(self) -> str: ...

    async def judge(self, trace: RagTrace) -> Judgment: ...

    async def aclose(self) -> None: ...
