"""Tests for sampler/policy.py: strata, inclusion probabilities, determinism, late feedback."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pydantic
import pytest
from scipy.stats import binom
from sqlalchemy import create_engine

from sampler.policy import (
    STRATA,
    SamplerConfig,
    StrataRates,
    TraceSampler,
    TraceSummary,
    selection_u,
)
from sampler.queue_table import create_tables
from sampler.sql_queue import SqlJudgeQueue
from service.model import Chunk, Feedback, RagTrace, Retrieval

T0 = datetime(2025, 3, 1, tzinfo=UTC)


def trace_ids(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"{a:016x}{b:016x}" for a, b in rng.integers(0, 2**63, size=(n, 2))]


def summary(trace_id: str, **facts: object) -> TraceSummary:
    return TraceSummary(trace_id=trace_id, tenant="default", app="shop", start_time=T0, **facts)  # type: ignore[arg-type]


def rag_trace(trace_id: str, *, top1: float | None = 0.8, **fields: object) -> RagTrace:
    chunks = () if top1 is None else (Chunk(id="c0", rank=0, score=top1, content="context"),)
    return RagTrace(
        trace_id=trace_id,
        app="shop",
        release="2025.03",
        intent="billing",
        start_time=T0,
        query="how do I pay?",
        answer="By card.",
        retrieval=Retrieval(chunks=chunks),
        **fields,  # type: ignore[arg-type]
    )


def feedback(trace_id: str, kind: str = "down") -> Feedback:
    return Feedback(event_id=f"fb-{trace_id}", trace_id=trace_id, kind=kind, time=T0)  # type: ignore[arg-type]


def binomial_bounds(n: int, p: float, alpha: float = 1e-4) -> tuple[int, int]:
    """Range that holds the count of n Bernoulli(p) draws with probability 1 - alpha."""
    return int(binom.ppf(alpha / 2, n, p)), int(binom.ppf(1 - alpha / 2, n, p))


def test_decisions_are_the_same_on_every_instance() -> None:
    ids = trace_ids(5000, seed=1)
    config = SamplerConfig(salt="replica-test", rates=StrataRates(base=0.3))
    a = TraceSampler(config, judge_version="v1")
    b = TraceSampler(SamplerConfig.model_validate(config.model_dump()), judge_version="v1")
    decided_a = [a.decide(summary(t)) for t in ids]
    assert decided_a == [b.decide(summary(t)) for t in ids]
    assert [d.u for d in decided_a] == [selection_u("replica-test", t) for t in ids]
    other_salt = TraceSampler(SamplerConfig(salt="other", rates=StrataRates(base=0.3)), judge_version="v1")
    assert [d.selected for d in decided_a] != [other_salt.decide(summary(t)).selected for t in ids]


def test_u_is_uniform() -> None:
    us = np.array([selection_u("s", t) for t in trace_ids(20_000, seed=2)])
    assert ((us >= 0) & (us < 1)).all()
    counts, _ = np.histogram(us, bins=10, range=(0, 1))
    low, high = binomial_bounds(len(us), 0.1)
    assert ((counts >= low) & (counts <= high)).all(), counts


@pytest.mark.parametrize(
    ("facts", "rate"),
    [
        ({}, "base"),
        ({"thumbs_down": True}, "thumbs_down"),
        ({"is_regeneration": True}, "regeneration"),
        ({"top1_score": 0.1}, "low_retrieval"),
        ({"is_probe": True}, "probe"),
    ],
)
def test_realized_rate_per_stratum_is_within_binomial_bounds(facts: dict[str, object], rate: str) -> None:
    rates = StrataRates(base=0.05, thumbs_down=0.9, regeneration=0.4, low_retrieval=0.3, probe=0.6)
    sampler = TraceSampler(SamplerConfig(rates=rates), judge_version="v1")
    ids = trace_ids(10_000, seed=3)
    items = sampler.select(summary(t, **facts) for t in ids)
    p = rates.of(rate)  # type: ignore[arg-type]
    low, high = binomial_bounds(len(ids), p)
    assert low <= len(items) <= high, (rate, len(items), low, high)
    assert {(i.stratum, i.inclusion_probability) for i in items} == {(rate, p)}
    counts = sampler.counts()
    assert counts.seen == len(ids) and counts.selected[rate] == len(items)  # type: ignore[index]


def test_several_strata_take_the_largest_rate() -> None:
    rates = StrataRates(base=0.02, regeneration=0.25, low_retrieval=0.5, thumbs_down=1.0)
    sampler = TraceSampler(SamplerConfig(rates=rates), judge_version="v1")
    both = summary(trace_ids(1, 4)[0], is_regeneration=True, top1_score=0.05)
    decision = sampler.decide(both)
    assert decision.strata == ("regeneration", "low_retrieval", "base")
    assert (decision.stratum, decision.inclusion_probability) == ("low_retrieval", 0.5)
    tie = TraceSampler(
        SamplerConfig(rates=StrataRates(regeneration=0.5, low_retrieval=0.5)), judge_version="v"
    )
    assert tie.decide(both).stratum == "regeneration"
    # Selected by the union of its strata is exactly u < max(rates), because u is shared.
    ids = trace_ids(4000, seed=5)
    for t in ids:
        d = sampler.decide(summary(t, is_regeneration=True, top1_score=0.05))
        assert d.selected == any(d.u < rates.of(s) for s in d.strata)


def test_summary_of_a_trace_reads_its_strata() -> None:
    sampler = TraceSampler(SamplerConfig(low_retrieval_threshold=0.3), judge_version="v1")
    tid = trace_ids(1, 6)[0]
    assert sampler.strata(TraceSummary.of(rag_trace(tid))) == ("base",)
    assert sampler.strata(TraceSummary.of(rag_trace(tid, top1=0.2))) == ("low_retrieval", "base")
    assert sampler.strata(TraceSummary.of(rag_trace(tid, top1=None))) == ("base",)
    assert sampler.strata(TraceSummary.of(rag_trace(tid, probe_run_id="run-1"))) == ("probe", "base")
    regen = TraceSummary.of(rag_trace(tid, is_regeneration=True, regeneration_source="attribute"))
    assert sampler.strata(regen) == ("regeneration", "base")
    with_fb = TraceSummary.of(rag_trace(tid), [feedback(tid, "down"), feedback(tid, "regenerate")])
    assert sampler.strata(with_fb) == ("thumbs_down", "regeneration", "base")
    assert TraceSummary.of(rag_trace(tid), [feedback(tid, "up")]) == TraceSummary.of(rag_trace(tid))
    s = TraceSummary.of(rag_trace(tid))
    assert (s.app, s.release, s.intent, s.top1_score) == ("shop", "2025.03", "billing", 0.8)
    assert s.text_chars == len("how do I pay?") + len("By card.") + len("context")


def test_select_takes_rag_traces_and_items_carry_the_design() -> None:
    now = T0 + timedelta(minutes=5)
    sampler = TraceSampler(
        SamplerConfig(rates=StrataRates(base=1.0)), judge_version="judge-v7", clock=lambda: now
    )
    tid = trace_ids(1, 7)[0]
    (item,) = sampler.select([rag_trace(tid).model_copy(update={"tenant": "acme"})])
    assert (item.trace_id, item.tenant, item.app, item.release, item.intent) == (
        tid,
        "acme",
        "shop",
        "2025.03",
        "billing",
    )
    assert (item.stratum, item.inclusion_probability, item.judge_version) == ("base", 1.0, "judge-v7")
    assert (item.enqueued_at, item.trace_time, item.skip_reason) == (now, T0, None)


def test_late_thumbs_down_enqueues_exactly_the_newly_selected() -> None:
    rates = StrataRates(base=0.05, thumbs_down=0.5)
    sampler = TraceSampler(SamplerConfig(rates=rates), judge_version="v1")
    ids = trace_ids(6000, seed=8)
    before = [summary(t) for t in ids]
    at_trace_time = {i.trace_id for i in sampler.select(before)}
    late = {t: sampler.on_feedback(feedback(t), s) for t, s in zip(ids, before, strict=True)}
    late_items = {t: i for t, i in late.items() if i is not None}
    assert all(i.stratum == "thumbs_down" and i.inclusion_probability == 0.5 for i in late_items.values())
    # Exactly the traces with u < 0.5 end selected, whenever their feedback came.
    expected = {t for t in ids if selection_u(sampler.config.salt, t) < 0.5}
    assert at_trace_time | set(late_items) == expected
    low, high = binomial_bounds(len(ids), 0.5)
    assert low <= len(expected) <= high
    # A thumbs-up changes nothing; feedback for another trace is refused.
    assert sampler.on_feedback(feedback(ids[0], "up"), before[0]) is None
    with pytest.raises(ValueError):
        sampler.on_feedback(feedback(ids[1]), before[0])
    # Feedback already known to the summary does not enqueue twice.
    assert sampler.on_feedback(feedback(ids[0]), before[0].with_feedback(feedback(ids[0]))) is None


def test_late_thumbs_down_reaches_the_queue_once_with_the_final_probability(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'q.db'}")
    create_tables(engine)
    queue = SqlJudgeQueue(engine)
    sampler = TraceSampler(SamplerConfig(rates=StrataRates(base=0.3, thumbs_down=1.0)), judge_version="v1")
    ids = trace_ids(200, seed=9)
    before = [summary(t) for t in ids]
    first = queue.enqueue(sampler.select(before))
    late = [i for t, s in zip(ids, before, strict=True) if (i := sampler.on_feedback(feedback(t), s))]
    second = queue.enqueue(late)
    assert first + second == len(ids) == queue.depth()
    records = queue.records(since=T0)
    assert {(r.item.stratum, r.item.inclusion_probability) for r in records} == {("thumbs_down", 1.0)}
    engine.dispose()


def test_drift_outlier_hook_as_set_or_predicate() -> None:
    ids = trace_ids(3, seed=10)
    rates = StrataRates(base=0.0, drift_outlier=1.0)
    outliers = {ids[0]}
    by_set = TraceSampler(SamplerConfig(rates=rates), judge_version="v1", drift_outliers=outliers)
    by_fn = TraceSampler(
        SamplerConfig(rates=rates), judge_version="v1", drift_outliers=lambda s: s.trace_id == ids[1]
    )
    assert [i.trace_id for i in by_set.select(summary(t) for t in ids)] == [ids[0]]
    assert [i.trace_id for i in by_fn.select(summary(t) for t in ids)] == [ids[1]]
    # The drift side marks a trace after it passed: it is enqueued then.
    outliers.add(ids[2])
    late = by_set.on_drift_outlier(summary(ids[2]))
    assert late is not None and late.stratum == "drift_outlier"
    none_base = TraceSampler(SamplerConfig(rates=StrataRates(base=1.0, drift_outlier=0.5)), judge_version="v")
    assert none_base.on_drift_outlier(summary(ids[2])) is None  # already selected at a higher rate


def test_config_is_strict() -> None:
    with pytest.raises(pydantic.ValidationError):
        SamplerConfig(rates=StrataRates(base=1.5))
    with pytest.raises(pydantic.ValidationError):
        SamplerConfig.model_validate({"rates": {"thumbs_up": 0.5}})
    with pytest.raises(pydantic.ValidationError):
        SamplerConfig.model_validate({"sample_rate": 0.5})
    with pytest.raises(ValueError):
        TraceSampler(judge_version="")
    defaults = StrataRates()
    assert (defaults.base, defaults.thumbs_down) == (0.02, 1.0)
    assert set(STRATA) == set(StrataRates.model_fields)
