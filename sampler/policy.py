"""The sampling policy: which traces the judge sees, and with what probability.

`TraceSampler` decides per trace, deterministically from the trace id, so
every replica (and every redelivery) decides the same:

    u = first 8 bytes of sha256(salt ":" trace_id), read big-endian, / 2**64

A trace belongs to the `base` stratum and to every other stratum whose
condition holds (thumbs-down, regeneration, low top-1 retrieval score, probe
traffic, drift outlier). Its inclusion probability is the largest rate among
its strata, and its stratum is the one that gave that rate (ties go to the
first in `STRATA` order). It is selected when u < inclusion probability.
Because one u serves all strata, "selected by at least one of its strata"
is exactly the event u < max(rates), so the recorded probability is the true
probability of selection, and a stratum that joins later (a thumbs-down
after the trace) only adds the traces with u between the old and the new
probability: exactly those, no trace twice.

Every selected trace becomes a judge item. The budget is not asked here but when
a worker takes the item from the queue (`sampler.fair`): a trace is selected by
the design alone, whatever the budget has left at the moment it arrives.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from sampler.queue import JudgeItem
from service.model import Feedback, RagTrace

__all__ = [
    "STRATA",
    "Decision",
    "DriftOutlierHook",
    "SamplerConfig",
    "SamplerCounts",
    "StrataRates",
    "Stratum",
    "TraceSampler",
    "TraceSummary",
    "selection_u",
]

Stratum = Literal["thumbs_down", "regeneration", "drift_outlier", "low_retrieval", "probe", "base"]
STRATA: tuple[Stratum, ...] = get_args(Stratum)
_BASE_ONLY: tuple[Stratum, ...] = ("base",)


class StrataRates(BaseModel):
    """Inclusion probability of each stratum, in [0, 1]."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: float = Field(default=0.02, ge=0.0, le=1.0, description="every trace, at random")
    thumbs_down: float = Field(default=1.0, ge=0.0, le=1.0, description="traces a user rated down")
    regeneration: float = Field(default=0.25, ge=0.0, le=1.0, description="regenerated answers")
    drift_outlier: float = Field(
        default=0.5, ge=0.0, le=1.0, description="queries the drift side marks as outliers"
    )
    low_retrieval: float = Field(
        default=0.25, ge=0.0, le=1.0, description="top-1 retrieval score under low_retrieval_threshold"
    )
    probe: float = Field(default=1.0, ge=0.0, le=1.0, description="golden-set probe traffic")

    def of(self, stratum: Stratum) -> float:
        return float(getattr(self, stratum))


class SamplerConfig(BaseModel):
    """The sampling policy. Changing `salt` re-draws every trace's u."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    salt: str = Field(
        default="ragmon-sampler-1", min_length=1, description="changing it re-draws which traces are sampled"
    )
    rates: StrataRates = StrataRates()
    low_retrieval_threshold: float = Field(
        default=0.3, description="a trace whose top-1 retrieval score is below this is in low_retrieval"
    )


@dataclass(frozen=True, slots=True)
class TraceSummary:
    """The facts about a trace the policy reads; small enough to rebuild from a store row.

    `thumbs_down` and `is_regeneration` include feedback known so far.
    `text_chars` (query + answer + context) lets a cost estimate scale.
    """

    trace_id: str
    tenant: str
    app: str
    start_time: datetime
    release: str | None = None
    intent: str | None = None
    top1_score: float | None = None
    is_regeneration: bool = False
    is_probe: bool = False
    thumbs_down: bool = False
    text_chars: int = 0

    @classmethod
    def of(cls, trace: RagTrace, feedback: Iterable[Feedback] = ()) -> TraceSummary:
        """Summarize `trace`, with the feedback already joined to it."""
        summary = cls(
            trace_id=trace.trace_id,
            tenant=trace.tenant,
            app=trace.app,
            start_time=trace.start_time,
            release=trace.release,
            intent=trace.intent,
            top1_score=trace.retrieval.top1_score,
            is_regeneration=trace.is_regeneration,
            is_probe=trace.probe_run_id is not None or trace.probe_question_id is not None,
            text_chars=len(trace.query or "")
            + len(trace.answer or "")
            + sum(len(c.content or "") for c in trace.retrieval.context),
        )
        for fb in feedback:
            summary = summary.with_feedback(fb)
        return summary

    def with_feedback(self, feedback: Feedback) -> TraceSummary:
        """This summary after `feedback`; raises ValueError if it belongs to another trace."""
        if (feedback.tenant, feedback.trace_id) != (self.tenant, self.trace_id):
            raise ValueError(
                f"feedback for {feedback.tenant}/{feedback.trace_id} given for {self.tenant}/{self.trace_id}"
            )
        if feedback.kind == "down":
            return replace(self, thumbs_down=True)
        if feedback.kind == "regenerate":
            return replace(self, is_regeneration=True)
        return self


DriftOutlierHook = Callable[[TraceSummary], bool] | Container[str]
"""Either a predicate on the summary, or a container of trace ids the drift side fills."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The sampling decision for one trace: its strata, probability, and whether u fell below it."""

    trace_id: str
    u: float
    strata: tuple[Stratum, ...]
    stratum: Stratum
    inclusion_probability: float
    selected: bool


@dataclass(frozen=True, slots=True)
class SamplerCounts:
    """Cumulative counts since the sampler was built: traces seen, and selected per deciding stratum."""

    seen: int
    selected: Mapping[Stratum, int]


def selection_u(salt: str, trace_id: str) -> float:
    """The trace's uniform draw in [0, 1): the same on every replica for the same salt."""
    digest = hashlib.sha256(f"{salt}:{trace_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


class TraceSampler:
    """The sampling processor: decides per trace and returns the judge items to enqueue.

    `select` and the late hooks (`on_feedback`, `on_drift_outlier`) return
    `JudgeItem`s; the caller hands all of them to `JudgeQueue.enqueue`, which
    is idempotent, so redelivered traces are harmless. Thread-safe.
    """

    def __init__(
        self,
        config: SamplerConfig | None = None,
        *,
        judge_version: str,
        drift_outliers: DriftOutlierHook | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if not judge_version:
            raise ValueError("judge_version must not be empty")
        self.config = config or SamplerConfig()
        self.judge_version = judge_version
        self.drift_outliers = drift_outliers
        self._clock = clock
        self._rates: dict[Stratum, float] = {s: self.config.rates.of(s) for s in STRATA}
        self._low_threshold = self.config.low_retrieval_threshold
        self._salted = hashlib.sha256(f"{self.config.salt}:".encode())
        self._lock = threading.Lock()
        self._seen = 0
        self._selected: dict[Stratum, int] = dict.fromkeys(STRATA, 0)

    def u(self, trace_id: str) -> float:
        """`selection_u(config.salt, trace_id)`, from a pre-salted hash."""
        h = self._salted.copy()
        h.update(trace_id.encode())
        return int.from_bytes(h.digest()[:8], "big") / 2.0**64

    def strata(self, summary: TraceSummary, *, drift_outlier: bool | None = None) -> tuple[Stratum, ...]:
        """Every stratum the trace belongs to, in `STRATA` order; always includes `base`.

        Drift-outlier membership comes from the hook unless `drift_outlier` overrides it.
        """
        if drift_outlier is None:
            drift_outlier = self._is_drift_outlier(summary)
        top1 = summary.top1_score
        low = top1 is not None and top1 < self._low_threshold
        member = (summary.thumbs_down, summary.is_regeneration, drift_outlier, low, summary.is_probe)
        if not any(member):
            return _BASE_ONLY
        return (*(s for s, m in zip(STRATA, member, strict=False) if m), "base")

    def decide(self, summary: TraceSummary, *, drift_outlier: bool | None = None) -> Decision:
        """The decision for one trace. Pure: counts nothing, consults no budget."""
        strata = self.strata(summary, drift_outlier=drift_outlier)
        # max() keeps the first of equal rates, so ties go to the earlier stratum in STRATA.
        stratum = "base" if strata is _BASE_ONLY else max(strata, key=self._rates.__getitem__)
        p = self._rates[stratum]
        u = self.u(summary.trace_id)
        return Decision(summary.trace_id, u, strata, stratum, p, u < p)

    def select(self, traces: Iterable[RagTrace | TraceSummary]) -> list[JudgeItem]:
        """Decide each trace; the selected ones come back as items."""
        items: list[JudgeItem] = []
        seen = 0
        for trace in traces:
            summary = trace if isinstance(trace, TraceSummary) else TraceSummary.of(trace)
            decision = self.decide(summary)
            seen += 1
            if decision.selected:
                items.append(self._item(summary, decision))
        with self._lock:
            self._seen += seen
        return items

    def on_feedback(self, feedback: Feedback, summary: TraceSummary) -> JudgeItem | None:
        """Reconsider a trace when feedback arrives after it was decided.

        `summary` is the trace as it was decided (without this feedback).
        Returns an item only when the feedback raised the trace's inclusion
        probability and its u falls below the new one; that includes a trace
        already selected before, so the queue can record the higher probability.
        Raises ValueError if the feedback is for another trace.
        """
        return self._reconsider(summary, summary.with_feedback(feedback))

    def on_update(self, before: TraceSummary, after: TraceSummary) -> JudgeItem | None:
        """Reconsider a trace when a later version of it was stored (its late spans arrived).

        `before` is the trace as it was decided, `after` the new version (both with the feedback
        known). The draw u is the trace id's, so the decision changes only where the new version
        joins a stratum of a higher rate (a regeneration flag or a retrieval score that came late):
        then, as for feedback, an item comes back when u falls below the new probability.
        """
        return self._reconsider(before, after)

    def on_drift_outlier(self, summary: TraceSummary) -> JudgeItem | None:
        """Reconsider a trace the drift side marked as an outlier after it was decided.

        Compares the decision without and with drift-outlier membership,
        whatever the hook says now; otherwise as `on_feedback`.
        """
        return self._late(
            self.decide(summary, drift_outlier=False), self.decide(summary, drift_outlier=True), summary
        )

    def counts(self) -> SamplerCounts:
        with self._lock:
            return SamplerCounts(seen=self._seen, selected=dict(self._selected))

    def _reconsider(self, before: TraceSummary, after: TraceSummary) -> JudgeItem | None:
        return self._late(self.decide(before), self.decide(after), after)

    def _late(self, old: Decision, new: Decision, summary: TraceSummary) -> JudgeItem | None:
        if new.inclusion_probability <= old.inclusion_probability or not new.selected:
            return None
        return self._item(summary, new)

    def _item(self, summary: TraceSummary, decision: Decision) -> JudgeItem:
        stratum = decision.stratum
        with self._lock:
            self._selected[stratum] += 1
        return JudgeItem(
            trace_id=summary.trace_id,
            tenant=summary.tenant,
            app=summary.app,
            stratum=stratum,
            inclusion_probability=decision.inclusion_probability,
            judge_version=self.judge_version,
            enqueued_at=self._clock(),
            trace_time=summary.start_time,
            release=summary.release,
            intent=summary.intent,
        )

    def _is_drift_outlier(self, summary: TraceSummary) -> bool:
        hook = self.drift_outliers
        if hook is None:
            return False
        if callable(hook):
            return bool(hook(summary))
        return summary.trace_id in hook
