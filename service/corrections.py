"""`Counted`: what was counted for a stored trace, and the corrections a later version of it makes.

A trace flushed early (its root arrived, or it went idle) is completed when
its late spans arrive: the store replaces the stored row with the fuller
version (service/store/trace_store.py) and the fan-out after the store runs
again for it, as an update (`TraceUpdate`): the new version with what was
counted for the trace before (`Counted`, kept in the `trace_counted` table).
The sinks correct, never count twice:

* Counters grow by the difference: tokens and cost per model, a model newly
  unpriced or with unknown usage, a regeneration flag that appeared. A
  counter is never decreased; a label the first counted version chose (its
  app, intent, release) stays the trace's label for every correction, so the
  trace is counted once, under one app, however often it is updated.
* Histograms cannot take an observation back, so each series of a trace is
  observed once. Per-stage values (embedding, retrieval, rerank, generation,
  TTFT, retrieved chunks, top-1 score) are observed for the first version
  that has them. The per-trace totals (`stage="total"` and the trace's
  cost) of a partial version are not observed at all: a partial version's
  total is the extent of the spans that had arrived, far below the request's
  duration exactly when the request was slow, and its cost lacks the calls
  still running. They are observed for the first version with its root
  span, or, for a trace whose root never comes, when its late window closes
  (`service/span_expiry.py`). A later version that changes a value already
  observed is counted in `ragmon_trace_corrections_total{quantity}` (once a
  trace and series) and the histogram keeps the first value.
* `ragmon_traces_updated_total` counts updates; `ragmon_partial_traces_completed_total`
  those that turned a partial trace whole (partial now = partial - completed).

The judge sink re-judges a trace whose judged content (query, answer,
context) changed; the sampler reconsiders it with the strata of the new
version as it does on feedback (service/judge/judging.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from service.metrics import Metrics
from service.model import RagTrace

__all__ = [
    "DEFERRED_WHILE_PARTIAL",
    "Counted",
    "TraceUpdate",
    "UpdateConsumer",
    "count_expired",
    "count_updates",
    "judged_digest",
    "observed_values",
]

# Histogram series of a trace, by name: (the value a version has, or None). "stage:<name>" is
# ragmon_stage_duration_seconds{stage}; the rest are one histogram each.
_STAGES = ("total", "embedding", "retrieval", "rerank", "generation")
# per-trace totals: not observed for a partial version (see the module docstring)
DEFERRED_WHILE_PARTIAL = frozenset({"stage:total", "trace_cost"})


def observed_values(trace: RagTrace) -> dict[str, float]:
    """The histogram observations `trace` has a value for, by series name, partial or not."""
    t = trace.timings
    values: dict[str, float] = {}
    for stage, value in zip(
        _STAGES, (t.total_s, t.embedding_s, t.retrieval_s, t.rerank_s, t.generation_s), strict=True
    ):
        if value is not None:
            values[f"stage:{stage}"] = value
    if t.ttft_s is not None:
        values["ttft"] = t.ttft_s
    cost = trace.cost_usd
    if cost is not None:
        values["trace_cost"] = cost
    retrieval = trace.retrieval
    if retrieval.retriever is not None or retrieval.chunks:
        values["retrieved_chunks"] = float(len(retrieval.chunks))
    if retrieval.top1_score is not None:
        values["top1_score"] = retrieval.top1_score
    return values


def judged_digest(trace: RagTrace) -> str:
    """A digest of what a judge reads of a trace: question, answer and the context the LLM saw."""
    h = hashlib.blake2b(digest_size=12)
    for part in (trace.query or "", trace.answer or ""):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    for chunk in trace.retrieval.context:
        h.update(chunk.id.encode("utf-8", "surrogatepass"))
        h.update(b"\x01")
        h.update((chunk.content or "").encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class Counted:
    """What was counted for one trace: its labels, additive quantities and histogram observations.

    `of(trace, before)` is what has been counted once `trace` was counted on top of `before`
    (None: nothing yet). Kept as JSON (`to_json` / `from_json`); `revision` is the version it
    describes."""

    app: str
    intent: str | None
    release: str | None
    revision: int
    partial: bool
    regeneration: bool
    tokens: dict[str, int] = field(default_factory=dict)  # "model\x1fkind" -> tokens
    cost: dict[str, float] = field(default_factory=dict)  # model -> USD
    unpriced: frozenset[str] = frozenset()
    unknown_usage: frozenset[str] = frozenset()
    observed: dict[str, float] = field(default_factory=dict)  # series -> value observed
    corrected: frozenset[str] = frozenset()  # series a later version changed (counted once a trace)
    empty_retrieval: bool = False
    top1_score: float | None = None
    probe: bool = False
    judged: str = ""

    @classmethod
    def of(cls, trace: RagTrace, before: Counted | None = None) -> Counted:
        tokens: dict[str, int] = {}
        cost: dict[str, float] = {}
        unpriced: set[str] = set()
        unknown: set[str] = set()
        for usage in trace.usage:
            for kind, n in (("input", usage.input_tokens), ("output", usage.output_tokens)):
                if n:
                    key = f"{usage.model}\x1f{kind}"
                    tokens[key] = tokens.get(key, 0) + n
            if usage.cost_usd is not None:
                cost[usage.model] = cost.get(usage.model, 0.0) + usage.cost_usd
            elif usage.cost_source == "unknown_usage":
                unknown.add(usage.model)
            else:
                unpriced.add(usage.model)
        values = observed_values(trace)
        if trace.partial:
            values = {k: v for k, v in values.items() if k not in DEFERRED_WHILE_PARTIAL}
        observed = dict(values) if before is None else {**values, **before.observed}
        changed = {
            series
            for series, value in observed_values(trace).items()
            if before is not None and before.observed.get(series, value) != value
        }
        # a regeneration the trace's own spans (or re-ask detection) marked: feedback counts its own
        regeneration = trace.is_regeneration and trace.regeneration_source != "feedback"
        retrieval = trace.retrieval
        empty = (retrieval.retriever is not None or bool(retrieval.chunks)) and not retrieval.chunks
        if before is not None:
            tokens = {k: max(v, before.tokens.get(k, 0)) for k, v in {**before.tokens, **tokens}.items()}
            cost = {k: max(v, before.cost.get(k, 0.0)) for k, v in {**before.cost, **cost}.items()}
            unpriced |= before.unpriced
            unknown |= before.unknown_usage
            regeneration = regeneration or before.regeneration
            empty = empty or before.empty_retrieval
        return cls(
            app=before.app if before else trace.app,
            intent=before.intent if before else trace.intent,
            release=before.release if before else trace.release,
            revision=trace.revision,
            partial=trace.partial,
            regeneration=regeneration,
            tokens=tokens,
            cost=cost,
            unpriced=frozenset(unpriced),
            unknown_usage=frozenset(unknown),
            observed=observed,
            corrected=frozenset(changed | (before.corrected if before else set())),
            empty_retrieval=empty,
            top1_score=retrieval.top1_score,
            probe=trace.probe_run_id is not None or trace.probe_question_id is not None,
            judged=judged_digest(trace),
        )

    def to_json(self) -> str:
        data: dict[str, Any] = {
            "app": self.app,
            "intent": self.intent,
            "release": self.release,
            "revision": self.revision,
            "partial": self.partial,
            "regeneration": self.regeneration,
            "tokens": self.tokens,
            "cost": self.cost,
            "unpriced": sorted(self.unpriced),
            "unknown_usage": sorted(self.unknown_usage),
            "observed": self.observed,
            "corrected": sorted(self.corrected),
            "empty_retrieval": self.empty_retrieval,
            "top1_score": self.top1_score,
            "probe": self.probe,
            "judged": self.judged,
        }
        return json.dumps(data, separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> Counted:
        data = json.loads(text)
        return cls(
            app=data["app"],
            intent=data.get("intent"),
            release=data.get("release"),
            revision=int(data.get("revision", 0)),
            partial=bool(data.get("partial")),
            regeneration=bool(data.get("regeneration")),
            tokens={str(k): int(v) for k, v in (data.get("tokens") or {}).items()},
            cost={str(k): float(v) for k, v in (data.get("cost") or {}).items()},
            unpriced=frozenset(data.get("unpriced") or ()),
            unknown_usage=frozenset(data.get("unknown_usage") or ()),
            observed={str(k): float(v) for k, v in (data.get("observed") or {}).items()},
            corrected=frozenset(data.get("corrected") or ()),
            empty_retrieval=bool(data.get("empty_retrieval")),
            top1_score=data.get("top1_score"),
            probe=bool(data.get("probe")),
            judged=str(data.get("judged", "")),
        )


@dataclass(frozen=True, slots=True)
class TraceUpdate:
    """A stored trace replaced by a fuller version: the version, and what was counted before it."""

    trace: RagTrace
    before: Counted

    @property
    def after(self) -> Counted:
        return Counted.of(self.trace, self.before)


def _observe(metrics: Metrics, scope: tuple[str, ...], series: str, value: float) -> None:
    if series.startswith("stage:"):
        metrics.stage_duration.labels(*scope, series.removeprefix("stage:")).observe(value)
        return
    histogram = {
        "ttft": metrics.ttft,
        "trace_cost": metrics.trace_cost,
        "retrieved_chunks": metrics.retrieved_chunks,
        "top1_score": metrics.top1_score,
    }[series]
    histogram.labels(*scope).observe(value)


def _quantity(series: str) -> str:
    return "stage_seconds" if series.startswith("stage:") else series


class UpdateConsumer(Protocol):
    """A sink after the store that takes updates of stored traces (`StoreSink(updated_traces=...)`)."""

    async def consume_updates(self, batch: Sequence[TraceUpdate]) -> None: ...


def count_updates(metrics: Metrics, updates: Sequence[TraceUpdate]) -> None:
    """Correct the counters and histograms for these updates: see the module docstring."""
    m = metrics
    for update in updates:
        before = update.before
        if update.trace.revision <= before.revision:
            continue  # counted already (a fan-out that ran for the newest version first)
        after = update.after
        scope = m.scope(update.trace.tenant, before.app)
        m.traces_updated.labels(*scope).inc()
        if before.partial and not update.trace.partial:
            m.partial_completed.labels(*scope).inc()
        for key, n in after.tokens.items():
            grown = n - before.tokens.get(key, 0)
            if grown > 0:
                model, kind = key.split("\x1f")
                m.tokens.labels(*scope, m.model_label(update.trace.tenant, model), kind).inc(grown)
        for model, usd in after.cost.items():
            grown_usd = usd - before.cost.get(model, 0.0)
            if grown_usd > 0:
                m.cost.labels(*scope, m.model_label(update.trace.tenant, model)).inc(grown_usd)
        for model in after.unpriced - before.unpriced:
            m.unpriced_calls.labels(*scope, m.model_label(update.trace.tenant, model)).inc()
        for model in after.unknown_usage - before.unknown_usage:
            m.usage_unknown_calls.labels(*scope, m.model_label(update.trace.tenant, model)).inc()
        if after.regeneration and not before.regeneration:
            source = update.trace.regeneration_source or "attribute"
            m.regenerations.labels(*scope, m.intent_label(update.trace.tenant, before.intent), source).inc()
        if after.empty_retrieval and not before.empty_retrieval:
            m.empty_retrievals.labels(*scope).inc()
        for series, value in after.observed.items():
            if series not in before.observed:
                _observe(m, scope, series, value)
        for series in after.corrected - before.corrected:
            m.trace_corrections.labels(*scope, _quantity(series)).inc()


def count_expired(metrics: Metrics, expired: Iterable[tuple[str, RagTrace, Counted | None]]) -> None:
    """Observe the per-trace totals a partial trace never had observed, now that its late window
    closed and no later version can come: (tenant, the stored trace, what was counted or None)."""
    for tenant, trace, counted in expired:
        done = counted if counted is not None else Counted.of(trace)
        scope = metrics.scope(tenant, done.app)
        values = observed_values(trace)
        for series in DEFERRED_WHILE_PARTIAL:
            if series in values and series not in done.observed:
                _observe(metrics, scope, series, values[series])
