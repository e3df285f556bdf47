"""Tests for sampler/estimate.py: the Hájek estimate and its interval, driven through the real sampler."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import norm
from sqlalchemy import create_engine

from sampler.budget import BudgetConfig, JudgeBudget
from sampler.estimate import FaithfulnessEstimate, JudgedSample, estimate_by, hajek
from sampler.policy import SamplerConfig, StrataRates, TraceSampler, TraceSummary
from sampler.queue import JudgeItem
from sampler.queue_table import create_tables
from sampler.sql_queue import SqlJudgeQueue
from service.model import Chunk, Feedback, RagTrace, Retrieval

T0 = datetime(2025, 3, 1, tzinfo=UTC)
RATES = StrataRates(base=0.02, thumbs_down=1.0, low_retrieval=0.2, regeneration=0.0, probe=0.0)


def wilson(k: int, n: int, confidence: float) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials."""
    z = float(norm.ppf(0.5 + confidence / 2))
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


@dataclass
class Population:
    """A synthetic production population with known faithfulness per trace.

    5 % thumbs-down (faithfulness 0.35, half of the feedback arrives after
    the trace), 10 % low top-1 retrieval score (0.6), the rest 0.93. Scores
    are supported/extracted over 4 claims; 3 % of answers make no claim.
    """

    summaries: list[TraceSummary]
    late_feedback: list[tuple[int, Feedback]]
    score: np.ndarray
    has_claims: np.ndarray
    index: dict[str, int] = field(default_factory=dict)

    @property
    def truth(self) -> float:
        return float(self.score[self.has_claims].mean())


def build_population(n: int, seed: int) -> Population:
    rng = np.random.default_rng(seed)
    kind = rng.choice(3, size=n, p=[0.05, 0.10, 0.85])  # 0 thumbs-down, 1 low retrieval, 2 rest
    faithful_p = np.array([0.35, 0.6, 0.93])[kind]
    score = rng.binomial(4, faithful_p) / 4.0
    has_claims = rng.random(n) >= 0.03
    late = rng.random(n) < 0.5
    summaries: list[TraceSummary] = []
    late_feedback: list[tuple[int, Feedback]] = []
    for i in range(n):
        trace_id = f"{rng.integers(0, 2**63):016x}{i:016x}"
        top1 = 0.1 if kind[i] == 1 else 0.8
        trace = RagTrace(
            trace_id=trace_id,
            app="shop",
            start_time=T0 + timedelta(seconds=i),
            query="q",
            answer="a",
            retrieval=Retrieval(chunks=(Chunk(id="c0", rank=0, score=top1, content="ctx"),)),
        )
        feedback = Feedback(event_id=f"e{i}", trace_id=trace_id, kind="down", time=trace.start_time)
        if kind[i] == 0 and late[i]:
            summaries.append(TraceSummary.of(trace))
            late_feedback.append((i, feedback))
        else:
            summaries.append(TraceSummary.of(trace, [feedback] if kind[i] == 0 else []))
    pop = Population(summaries, late_feedback, score, has_claims)
    pop.index = {s.trace_id: i for i, s in enumerate(summaries)}
    return pop


def judge_sample(
    pop: Population,
    sampler: TraceSampler,
    rng: np.random.Generator,
    arrive: Callable[[], None] = lambda: None,
    failure_rate: float = 0.02,
    budget: JudgeBudget | None = None,
) -> list[JudgedSample]:
    """Run the population through the sampler, then the late feedback, and 'judge' what it selected.

    Traces arrive in random order, `arrive()` called before each trace and each late feedback.
    Selected items wait in a queue merged the way the judge queue merges them (a key once; a
    higher inclusion probability replaces the recorded one, judged or not). After each arrival
    the worker takes the oldest waiting items as long as `budget` admits them (all, without
    one); what is still waiting at the end is `pending`: deferred by the budget, not judged yet.
    """
    waiting: dict[str, JudgeItem] = {}  # in arrival order: the worker takes the oldest first
    judged: dict[str, JudgeItem] = {}

    def offer(item: JudgeItem) -> None:
        held = judged if item.trace_id in judged else waiting
        seen = held.get(item.trace_id)
        if seen is None or item.inclusion_probability > seen.inclusion_probability:
            held[item.trace_id] = item

    def work() -> None:
        while waiting and (budget is None or budget.try_admit(0.0) is None):
            trace_id = next(iter(waiting))
            judged[trace_id] = waiting.pop(trace_id)

    for i in rng.permutation(len(pop.summaries)):
        arrive()
        for item in sampler.select([pop.summaries[i]]):
            offer(item)
        work()
    for i, fb in pop.late_feedback:
        arrive()
        if item := sampler.on_feedback(fb, pop.summaries[i]):
            offer(item)
        work()
    samples = []
    for item in [*judged.values(), *waiting.values()]:
        i = pop.index[item.trace_id]
        if item.trace_id in waiting:
            outcome, score = "pending", None
        elif not pop.has_claims[i]:
            outcome, score = "no_claims", None
        elif rng.random() < failure_rate:
            outcome, score = "failed", None
        else:
            outcome, score = "scored", float(pop.score[i])
        samples.append(
            JudgedSample(
                inclusion_probability=item.inclusion_probability,
                outcome=outcome,  # type: ignore[arg-type]
                score=score,
                stratum=item.stratum,
                app=item.app,
                trace_time=item.trace_time,
            )
        )
    return samples


class ManualClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class CoverageRun:
    seeds: int
    covered: int = 0
    plain_covered: int = 0
    errors: list[float] = field(default_factory=list)
    plain_errors: list[float] = field(default_factory=list)
    unadjusted_errors: list[float] = field(default_factory=list)

    def report(self) -> str:
        lo, hi = wilson(self.covered, self.seeds, 0.95)
        return (
            f"Hájek 95% CI covered the truth in {self.covered}/{self.seeds} seeds "
            f"({self.covered / self.seeds:.3f}, 95% CI {lo:.3f}-{hi:.3f}); plain mean covered it in "
            f"{self.plain_covered}/{self.seeds}; mean error weighted {np.mean(self.errors):+.4f}, "
            f"plain {np.mean(self.plain_errors):+.4f}, items the budget deferred ignored "
            f"{np.mean(self.unadjusted_errors):+.4f}"
        )


def run_coverage(
    pop: Population,
    seeds: int,
    budget: Callable[[Callable[[], float]], JudgeBudget] | None = None,
    seconds_between_arrivals: float = 1.0,
) -> CoverageRun:
    truth = pop.truth
    run = CoverageRun(seeds)
    for seed in range(seeds):
        clock = ManualClock()
        sampler = TraceSampler(SamplerConfig(salt=f"coverage-{seed}", rates=RATES), judge_version="v1")
        samples = judge_sample(
            pop,
            sampler,
            np.random.default_rng(10_000 + seed),
            partial(clock.advance, seconds_between_arrivals),
            budget=None if budget is None else budget(clock),
        )
        est = hajek(samples)
        assert est.estimate is not None and est.lower is not None and est.upper is not None
        run.covered += est.lower <= truth <= est.upper
        run.errors.append(est.estimate - truth)
        scores = [s.score for s in samples if s.score is not None]
        plain = float(np.mean(scores))
        plain_lo, plain_hi = wilson(round(plain * len(scores)), len(scores), 0.95)
        run.plain_covered += plain_lo <= truth <= plain_hi
        run.plain_errors.append(plain - truth)
        unadjusted = hajek(s for s in samples if s.outcome != "pending").estimate
        assert unadjusted is not None
        run.unadjusted_errors.append(unadjusted - truth)
    return run


def check_coverage(run: CoverageRun) -> None:
    # Coverage is a rate over seeds: judge it by its own interval (99 %), not by a point.
    _, upper = wilson(run.covered, run.seeds, 0.99)
    assert upper >= 0.93, run.report()
    errors = np.array(run.errors)
    assert abs(errors.mean()) <= 3 * errors.std(ddof=1) / math.sqrt(run.seeds) + 1e-3, run.report()
    plain = np.array(run.plain_errors)
    assert plain.mean() < -10 * plain.std(ddof=1) / math.sqrt(run.seeds), run.report()
    _, plain_upper = wilson(run.plain_covered, run.seeds, 0.99)
    assert plain_upper < 0.5, run.report()


@pytest.fixture(scope="module")
def population() -> Population:
    return build_population(10_000, seed=7)


def test_weighted_estimate_covers_truth_while_plain_mean_does_not(population: Population) -> None:
    run = run_coverage(population, seeds=80)
    print(run.report())  # shown with pytest -rP
    check_coverage(run)


def test_budget_deferrals_are_reweighted_within_their_cell(population: Population) -> None:
    # The late thumbs-down arrive in a burst after the traces, when the bucket is nearly empty:
    # the budget defers much of the thumbs-down cell, which is still waiting at the end. Counted
    # as its cell's nonresponse the estimate stays right; left out, the cell counts for too little.
    def budget(clock: Callable[[], float]) -> JudgeBudget:
        return JudgeBudget(BudgetConfig(calls_per_minute=3.0, burst_calls=20.0), clock=clock)

    run = run_coverage(population, seeds=30, budget=budget)
    print(run.report())  # shown with pytest -rP
    _, upper = wilson(run.covered, run.seeds, 0.99)
    assert upper >= 0.93, run.report()
    errors, ignored = np.array(run.errors), np.array(run.unadjusted_errors)
    assert abs(errors.mean()) <= 3 * errors.std(ddof=1) / math.sqrt(run.seeds) + 1e-3, run.report()
    assert ignored.mean() > 5 * ignored.std(ddof=1) / math.sqrt(run.seeds), run.report()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_coverage_on_100k_traces() -> None:
    run = run_coverage(build_population(100_000, seed=11), seeds=100)
    print(run.report())  # shown with pytest -rP
    check_coverage(run)


def scored(score: float, p: float, stratum: str = "base") -> JudgedSample:
    return JudgedSample(inclusion_probability=p, outcome="scored", score=score, stratum=stratum)


def test_equal_probabilities_give_the_plain_mean() -> None:
    rng = np.random.default_rng(1)
    scores = rng.binomial(1, 0.7, size=200).astype(float)
    est = hajek([scored(float(y), 0.1) for y in scores])
    assert est.estimate == pytest.approx(scores.mean())
    assert est.method == "linearization"
    assert est.n_judged == 200
    assert est.n_effective == pytest.approx(200)
    assert est.sum_weights == pytest.approx(2000)
    assert est.lower is not None and est.upper is not None and est.estimate is not None
    assert est.lower < est.estimate < est.upper


def test_failures_and_no_claims_are_counted_not_scored() -> None:
    base = [scored(1.0, 0.5), scored(0.0, 0.1), scored(0.5, 0.2)] * 20
    extra = [JudgedSample(inclusion_probability=0.02, outcome="failed")] * 7 + [
        JudgedSample(inclusion_probability=0.02, outcome="no_claims")
    ] * 4
    with_extra, without = hajek(base + extra), hajek(base)
    assert with_extra.estimate == without.estimate
    assert (with_extra.n_failed, with_extra.n_no_claims, with_extra.n_judged) == (7, 4, 60)
    assert (without.n_failed, without.n_no_claims) == (0, 0)


def test_small_samples_stay_inside_unit_interval() -> None:
    for scores in ([1.0, 1.0, 1.0], [0.0, 0.0], [1.0], [0.9, 1.0, 1.0, 1.0]):
        est = hajek([scored(y, 0.05) for y in scores])
        assert est.method == "wilson_kish"
        assert est.lower is not None and est.upper is not None and est.estimate is not None
        assert 0.0 <= est.lower <= est.estimate <= est.upper <= 1.0
        assert est.upper - est.lower > 0.1, "a handful of items must not look certain"


def test_empty_sample_has_no_estimate_but_keeps_counts() -> None:
    est = hajek([JudgedSample(inclusion_probability=1.0, outcome="failed")])
    assert (est.estimate, est.lower, est.upper, est.method) == (None, None, None, "none")
    assert est.n_failed == 1 and est.n_judged == 0


def test_budget_skips_raise_the_weight_of_their_cell_only() -> None:
    thinned = [scored(0.0, 0.1, "base")] * 10 + [
        JudgedSample(inclusion_probability=0.1, outcome="skipped")
    ] * 10
    full = [scored(1.0, 1.0, "thumbs_down")] * 10
    est = hajek(thinned + full)
    # The base cell's 10 admitted items stand for the 20 the design selected.
    assert est.sum_weights == pytest.approx(20 / 0.1 + 10 / 1.0)
    assert est.estimate == pytest.approx(10 / (20 / 0.1 + 10))
    assert est.n_skipped == 10 and est.n_skipped_unadjusted == 0


def test_items_not_judged_yet_raise_the_weight_of_their_cell() -> None:
    # one tenant's flood: 100 thumbs-downs (pi = 1) of which 10 are judged and 90 wait, deferred by
    # the budget; every base trace selected (pi = 0.5) is judged
    flooded = [scored(0.0, 1.0, "thumbs_down")] * 10 + [
        JudgedSample(inclusion_probability=1.0, outcome="pending", stratum="thumbs_down")
    ] * 90
    base = [scored(1.0, 0.5, "base")] * 20
    est = hajek(flooded + base)
    assert est.sum_weights == pytest.approx(100 + 40)
    assert est.estimate == pytest.approx(40 / 140)
    assert (est.n_judged, est.n_pending, est.n_skipped, est.n_skipped_unadjusted) == (30, 90, 0, 0)
    # left out, the waiting 90 would make the thumbs-down cell count as 10 traces, not 100
    assert hajek([s for s in flooded + base if s.outcome != "pending"]).estimate == pytest.approx(40 / 50)
    # once judged, a deferred item keeps its probability: the estimate is the full sample's
    all_judged = [scored(0.0, 1.0, "thumbs_down")] * 100 + base
    assert hajek(all_judged).estimate == pytest.approx(40 / 140)


def test_cells_emptied_by_the_budget_are_reported() -> None:
    samples = [scored(1.0, 1.0, "thumbs_down")] * 40 + [
        JudgedSample(inclusion_probability=0.02, outcome="skipped", stratum="base")
    ] * 5
    est = hajek(samples)
    assert est.n_skipped == 5 and est.n_skipped_unadjusted == 5


def test_interval_widens_with_unequal_weights() -> None:
    rng = np.random.default_rng(3)
    ys = rng.binomial(1, 0.6, size=300).astype(float)
    equal = hajek([scored(float(y), 0.1) for y in ys])
    mixed = hajek([scored(float(y), 0.01 if i % 2 else 0.5) for i, y in enumerate(ys)])
    assert mixed.n_effective < equal.n_effective
    assert equal.upper is not None and equal.lower is not None
    assert mixed.upper is not None and mixed.lower is not None
    assert mixed.upper - mixed.lower > equal.upper - equal.lower


def sample_at(
    app: str, minutes: float, release: str | None = None, intent: str | None = None
) -> JudgedSample:
    return JudgedSample(
        inclusion_probability=0.5,
        outcome="scored",
        score=1.0 if minutes < 30 else 0.0,
        app=app,
        release=release,
        intent=intent,
        trace_time=T0 + timedelta(minutes=minutes),
    )


def test_estimate_by_groups_over_a_rolling_window() -> None:
    samples = [
        sample_at("a", 10, release="r1", intent="faq"),
        sample_at("a", 50, release="r2"),
        sample_at("b", 55, intent="faq"),
        sample_at("a", -5, release="r1"),  # before the window
        sample_at("a", 61),  # after now
    ]
    now = T0 + timedelta(minutes=60)
    by_app = estimate_by(samples, "app", now=now, window=timedelta(hours=1))
    assert set(by_app) == {("a",), ("b",)}
    assert by_app[("a",)].n_judged == 2 and by_app[("a",)].estimate == pytest.approx(0.5)
    by_release = estimate_by(samples, "app_release", now=now, window=timedelta(hours=1))
    assert set(by_release) == {("a", "r1"), ("a", "r2")}
    by_intent = estimate_by(samples, "app_intent", now=now, window=timedelta(hours=1))
    assert set(by_intent) == {("a", "faq"), ("b", "faq")}
    assert all(isinstance(v, FaithfulnessEstimate) for v in by_intent.values())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"inclusion_probability": 0.0, "outcome": "scored", "score": 1.0},
        {"inclusion_probability": 1.5, "outcome": "scored", "score": 1.0},
        {"inclusion_probability": 0.5, "outcome": "scored"},
        {"inclusion_probability": 0.5, "outcome": "scored", "score": 1.2},
        {"inclusion_probability": 0.5, "outcome": "failed", "score": 1.0},
        {"inclusion_probability": 0.5, "outcome": "lost"},
    ],
)
def test_inconsistent_samples_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        JudgedSample(**kwargs)  # type: ignore[arg-type]


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError):
        hajek([], confidence=1.0)
    with pytest.raises(ValueError):
        estimate_by([], "app", now=T0, window=timedelta(0))
    with pytest.raises(ValueError):
        estimate_by([], "tenant", now=T0, window=timedelta(hours=1))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        estimate_by([], "app", now=T0.replace(tzinfo=None), window=timedelta(hours=1))


def test_samples_from_queue_records(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'q.db'}")
    create_tables(engine)
    queue = SqlJudgeQueue(engine, max_attempts=1)
    sampler = TraceSampler(SamplerConfig(rates=StrataRates(base=1.0)), judge_version="v1")
    summaries = [
        TraceSummary(trace_id=f"{i:032x}", tenant="default", app="shop", start_time=T0, release="r1")
        for i in range(4)
    ]
    items = sampler.select(summaries)
    items[3] = dataclasses.replace(items[3], skip_reason="budget_usd")
    queue.enqueue(items)
    done, no_claims, failed = queue.claim(3, lease_s=30, worker="w")
    queue.complete(done.key)
    queue.complete(no_claims.key)
    queue.fail(failed.key, worker="w", reason="HTTP 500")
    records = {r.key: r for r in queue.records(since=T0)}
    samples = [
        JudgedSample.from_record(records[done.key], "scored", 0.75),
        JudgedSample.from_record(records[no_claims.key], "no_claims"),
        JudgedSample.from_record(records[failed.key]),
        JudgedSample.from_record(records[items[3].key]),
    ]
    assert [s.outcome for s in samples] == ["scored", "no_claims", "failed", "skipped"]
    assert (
        samples[0].release == "r1" and samples[0].trace_time == T0 and samples[0].inclusion_probability == 1.0
    )
    with pytest.raises(ValueError):
        JudgedSample.from_record(records[done.key])  # a done record needs the judgment's outcome
    with pytest.raises(ValueError):
        JudgedSample.from_record(records[failed.key], "scored", 1.0)
    queue.enqueue([dataclasses.replace(items[0], trace_id=f"{9:032x}")])
    with pytest.raises(ValueError):
        JudgedSample.from_record(queue.records(since=T0)[-1], "scored", 1.0)  # still pending
    assert JudgedSample.from_record(queue.records(since=T0)[-1]).outcome == "pending"
    est = hajek(samples)
    assert (est.n_judged, est.n_no_claims, est.n_failed, est.n_skipped) == (1, 1, 1, 1)
    engine.dispose()
