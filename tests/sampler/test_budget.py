"""Tests for sampler/budget.py: token buckets for judge calls per minute and USD per day."""

from __future__ import annotations

import threading

import pydantic
import pytest

from sampler.budget import REFUSAL_REASONS, BudgetConfig, JudgeBudget, TokenBucket


class ManualClock:
    """Monotonic seconds, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_bucket_starts_full_and_refills_at_its_rate() -> None:
    clock = ManualClock()
    bucket = TokenBucket(capacity=5, rate_per_s=0.5, clock=clock)
    assert bucket.level == 5
    bucket.charge(5)
    assert not bucket.can_take(1)
    clock.now += 4
    assert bucket.level == pytest.approx(2)
    clock.now += 3600
    assert bucket.level == 5, "never above capacity"
    clock.now -= 10  # a clock stepping back must not drain it
    assert bucket.level == 5


def test_calls_per_minute_admits_the_burst_then_the_rate() -> None:
    clock = ManualClock()
    budget = JudgeBudget(BudgetConfig(calls_per_minute=30, burst_calls=5), clock=clock)
    first = [budget.try_admit(0.0) for _ in range(8)]
    assert first == [None] * 5 + ["budget_calls"] * 3
    clock.now += 10  # 30/min = one call every 2 s
    assert [budget.try_admit(0.0) for _ in range(7)] == [None] * 5 + ["budget_calls"] * 2
    counts = budget.counts()
    assert (counts.admitted, counts.refused["budget_calls"], counts.refused["budget_usd"]) == (10, 5, 0)


def test_usd_per_day_refuses_without_spending_a_call() -> None:
    clock = ManualClock()
    budget = JudgeBudget(BudgetConfig(calls_per_minute=60, usd_per_day=1.0), clock=clock)
    assert budget.try_admit(0.6) is None
    assert budget.try_admit(0.6) == "budget_usd"
    calls, usd = budget.levels()
    assert calls == pytest.approx(59) and usd == pytest.approx(0.4)
    clock.now += 86_400 * 0.2  # a fifth of the day refills a fifth of the spend
    assert budget.try_admit(0.6) is None
    assert budget.counts().admitted_usd == pytest.approx(1.2)


def test_calls_are_checked_before_usd() -> None:
    budget = JudgeBudget(BudgetConfig(calls_per_minute=1, usd_per_day=0.5), clock=ManualClock())
    assert budget.try_admit(0.5) is None
    assert budget.try_admit(0.5) == "budget_calls"


def test_settle_charges_underestimates_and_refunds_overestimates() -> None:
    budget = JudgeBudget(BudgetConfig(usd_per_day=1.0), clock=ManualClock())
    assert budget.try_admit(0.1) is None
    budget.settle(estimated_usd=0.1, actual_usd=1.5)
    assert budget.levels()[1] == pytest.approx(-0.5)
    assert budget.try_admit(0.0) == "budget_usd", "in debt, nothing is admitted"
    budget.settle(estimated_usd=0.6, actual_usd=0.0)
    assert budget.levels()[1] == pytest.approx(0.1)
    assert budget.try_admit(0.1) is None


def test_concurrent_admissions_never_exceed_the_bucket() -> None:
    budget = JudgeBudget(BudgetConfig(calls_per_minute=100, usd_per_day=1e9), clock=ManualClock())
    results: list[str | None] = []
    lock = threading.Lock()

    def admit() -> None:
        for _ in range(50):
            r = budget.try_admit(0.0)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=admit) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(None) == 100 and results.count("budget_calls") == 100


def test_bad_arguments_are_rejected() -> None:
    budget = JudgeBudget(clock=ManualClock())
    for bad in (-0.01, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            budget.try_admit(bad)
    with pytest.raises(ValueError):
        budget.settle(estimated_usd=-1, actual_usd=0)
    with pytest.raises(ValueError):
        TokenBucket(capacity=0, rate_per_s=1, clock=ManualClock())
    with pytest.raises(pydantic.ValidationError):
        BudgetConfig(calls_per_minute=0)
    with pytest.raises(pydantic.ValidationError):
        BudgetConfig.model_validate({"usd_per_month": 10})
    assert REFUSAL_REASONS == ("budget_calls", "budget_usd")
    for weights in ({"acme": 0.0}, {"acme": -1.0}, {"acme": float("nan")}):
        with pytest.raises(pydantic.ValidationError, match="weight of tenant 'acme'"):
            BudgetConfig(tenant_weights=weights)
    with pytest.raises(pydantic.ValidationError):
        BudgetConfig(max_deferral_s=0)
