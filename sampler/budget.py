"""The judge budget: token buckets for judge calls per minute and USD per day.

The judge worker asks the budget as it takes a trace from the judge queue
(`SqlJudgeQueue.claim_within`), tenant by tenant in fair shares
(`sampler.fair`). A refusal is not a loss: the trace goes back to the queue,
deferred, and is asked for again as the budget refills; only one still
deferred after `max_deferral_s` ends skipped (reason `expired`), and the
estimator corrects the inclusion probabilities of the cells that lost traces
(see `sampler.estimate`).

`JudgeBudget` keeps the buckets in one process (`scope: process`). The
running service uses one budget for the whole deployment instead (`scope:
deployment`, the default): the same buckets kept in the database and handed
out to the processes in leased slices (`service/judge/shared_budget.py`), so
N replicas admit what one would. Both answer `AdmissionBudget`.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "REFUSAL_REASONS",
    "AdmissionBudget",
    "BudgetConfig",
    "BudgetCounts",
    "JudgeBudget",
    "RefusalReason",
    "TokenBucket",
]

RefusalReason = Literal["budget_calls", "budget_usd"]
"""Why the budget had no room for a judgment: the call bucket, or the spend bucket, is empty."""
REFUSAL_REASONS: tuple[RefusalReason, ...] = get_args(RefusalReason)

_SECONDS_PER_DAY = 86_400.0


class BudgetConfig(BaseModel):
    """Limits on judging. Defaults suit one embedded instance with a paid endpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    calls_per_minute: float = Field(default=60.0, gt=0, description="sustained judge calls per minute")
    burst_calls: float | None = Field(
        default=None, gt=0, description="bucket size for calls; defaults to one minute of calls"
    )
    usd_per_day: float = Field(default=5.0, gt=0, description="sustained judge spend per day")
    burst_usd: float | None = Field(
        default=None, gt=0, description="bucket size for spend; defaults to one day of spend"
    )
    scope: Literal["deployment", "process"] = Field(
        default="deployment",
        description="deployment: one budget in the database for every replica, leased in slices; "
        "process: each process has the whole budget (N replicas spend N times it)",
    )
    lease_calls: int = Field(
        default=5, ge=1, description="judgments a process leases from the deployment's budget at a time"
    )
    lease_ttl_s: float = Field(
        default=30.0,
        gt=0,
        description="a lease its process did not return by then (it died) goes back to the budget, "
        "less what it had recorded as spent",
    )
    lease_retry_s: float = Field(
        default=1.0,
        gt=0,
        description="after the budget refused a lease, how long a process refuses before it asks again",
    )
    tenant_weights: dict[str, float] = Field(
        default_factory=dict,
        description="tenant -> weight: among the tenants with traces waiting for the judge, each gets "
        "weight / sum of their weights of the budget; a tenant with nothing waiting lends its share",
    )
    default_tenant_weight: float = Field(default=1.0, gt=0, description="the weight of a tenant not named")
    max_deferral_s: float = Field(
        default=6 * 3600.0,
        gt=0,
        description="a trace the budget kept deferring this long after it was selected ends skipped "
        "(reason expired), counted and corrected for in the estimate, instead of waiting on",
    )

    @field_validator("tenant_weights")
    @classmethod
    def _positive_weights(cls, weights: dict[str, float]) -> dict[str, float]:
        for tenant, weight in weights.items():
            if not (math.isfinite(weight) and weight > 0):
                raise ValueError(f"the weight of tenant {tenant!r} must be a positive number, got {weight!r}")
        return weights

    def capacity(self) -> tuple[float, float]:
        """(call tokens, USD tokens) the buckets hold when full."""
        calls = self.burst_calls if self.burst_calls is not None else self.calls_per_minute
        usd = self.burst_usd if self.burst_usd is not None else self.usd_per_day
        return calls, usd

    def rates_per_s(self) -> tuple[float, float]:
        """(call tokens, USD tokens) the buckets refill per second."""
        return self.calls_per_minute / 60.0, self.usd_per_day / _SECONDS_PER_DAY


class AdmissionBudget(Protocol):
    """What the judge queue asks before a worker takes a trace to judge (`sampler.fair`)."""

    def try_admit(self, cost_usd: float) -> RefusalReason | None:
        """Admit one judgment of estimated `cost_usd`: None if admitted, else the reason it refused."""
        ...


class TokenBucket:
    """A token bucket: `capacity` tokens, refilled continuously at `rate_per_s`.

    The bucket starts full. `level` may go below zero when a charge is
    corrected upwards after the fact (`charge`); it then refills from there.
    Not thread-safe on its own; `JudgeBudget` holds the lock.
    """

    def __init__(self, capacity: float, rate_per_s: float, clock: Callable[[], float]) -> None:
        if not (math.isfinite(capacity) and capacity > 0):
            raise ValueError(f"capacity must be a positive finite number, got {capacity!r}")
        if not (math.isfinite(rate_per_s) and rate_per_s > 0):
            raise ValueError(f"rate_per_s must be a positive finite number, got {rate_per_s!r}")
        self.capacity = capacity
        self.rate_per_s = rate_per_s
        self._clock = clock
        self._level = capacity
        self._at = clock()

    @property
    def level(self) -> float:
        """Tokens available now."""
        self._refill()
        return self._level

    def can_take(self, amount: float) -> bool:
        self._refill()
        return self._level >= amount

    def charge(self, amount: float) -> None:
        """Remove `amount` tokens (or add them back when negative), without a check."""
        self._refill()
        self._level = min(self.capacity, self._level - amount)

    def _refill(self) -> None:
        now = self._clock()
        # A clock that steps backwards must not drain the bucket.
        elapsed = max(0.0, now - self._at)
        self._at = now
        self._level = min(self.capacity, self._level + elapsed * self.rate_per_s)


@dataclass(frozen=True, slots=True)
class BudgetCounts:
    """Cumulative counts since the budget was built: admitted, and refused per reason."""

    admitted: int
    refused: Mapping[RefusalReason, int]
    admitted_usd: float


class JudgeBudget:
    """Both buckets together: a judgment is admitted only if both have room.

    `try_admit(cost)` takes one call token and `cost` USD tokens, or takes
    nothing and returns the reason it refused. The call bucket is checked
    first, so a refusal while both are empty reads `budget_calls`. Thread-safe.
    """

    def __init__(self, config: BudgetConfig | None = None, *, clock: Callable[[], float] = time.monotonic):
        self.config = config or BudgetConfig()
        (calls, usd), (calls_rate, usd_rate) = self.config.capacity(), self.config.rates_per_s()
        self._calls = TokenBucket(calls, calls_rate, clock)
        self._usd = TokenBucket(usd, usd_rate, clock)
        self._lock = threading.Lock()
        self._admitted = 0
        self._admitted_usd = 0.0
        self._refused: dict[RefusalReason, int] = dict.fromkeys(REFUSAL_REASONS, 0)

    def try_admit(self, cost_usd: float) -> RefusalReason | None:
        """Admit one judgment of estimated `cost_usd`; None if admitted, else the reason."""
        if not (math.isfinite(cost_usd) and cost_usd >= 0):
            raise ValueError(f"cost_usd must be a finite number >= 0, got {cost_usd!r}")
        with self._lock:
            reason: RefusalReason | None = None
            if not self._calls.can_take(1.0):
                reason = "budget_calls"
            elif not self._usd.can_take(cost_usd):
                reason = "budget_usd"
            if reason is not None:
                self._refused[reason] += 1
                return reason
            self._calls.charge(1.0)
            self._usd.charge(cost_usd)
            self._admitted += 1
            self._admitted_usd += cost_usd
            return None

    def settle(self, estimated_usd: float, actual_usd: float) -> None:
        """Correct the spend bucket once a judgment's real cost is known.

        An underestimate is charged (the bucket may go negative and admits
        nothing until it refills); an overestimate is refunded.
        """
        for name, value in (("estimated_usd", estimated_usd), ("actual_usd", actual_usd)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        with self._lock:
            self._usd.charge(actual_usd - estimated_usd)
            self._admitted_usd += actual_usd - estimated_usd

    def counts(self) -> BudgetCounts:
        with self._lock:
            return BudgetCounts(
                admitted=self._admitted, refused=dict(self._refused), admitted_usd=self._admitted_usd
            )

    def levels(self) -> tuple[float, float]:
        """(call tokens, USD tokens) available now."""
        with self._lock:
            return self._calls.level, self._usd.level
