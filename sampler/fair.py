"""Fair shares of the judge: which tenant's queued trace the judge takes next, and the budget's say.

The judge budget (`sampler.budget`) caps judgments for the whole deployment. Before, the sampler
asked it as each trace arrived, first come first served: one tenant's 600 thumbs-downs took every
token and the budget refused everything after them for good, other tenants' traces included.
Now the judge worker asks it as it takes work from the queue (`SqlJudgeQueue.claim_within`), and
takes that work tenant by tenant:

* **shares**: among the tenants with traces waiting, tenant t gets weight_t / Σ weights of the
  rest of the judgments (`BudgetConfig.tenant_weights`; equal by default). A tenant with nothing
  waiting takes nothing, so its share goes to the others (lent, not lost), and it banks no credit
  while it is idle.
* **order**: start-time fair queuing. Each tenant has a virtual time, advanced by 1/weight for each
  judgment admitted; the next trace is the oldest of the tenant with the smallest virtual time. A
  tenant that starts waiting again begins at the virtual time of the last judgment admitted, not
  where it stopped: an idle hour buys no burst.
* **deferral, not skipping**: when the budget has no room, the traces whose turn it was go back
  to the queue, marked deferred (counted once per tenant and trace), and are asked for again as
  the budget refills. They keep their inclusion probability; a trace still deferred after
  `BudgetConfig.max_deferral_s` ends `skipped` with reason `expired`, counted, and the estimator
  treats it as a budget nonresponse in its cell (`sampler.estimate`).

Across processes: each judge worker process orders its own admissions this way, over the one queue
every process sees (and the one budget, leased from the database in distributed mode:
`service/judge/shared_budget.py`). Each process splits what it admits by the shares, so the sum over
processes does too; no fairness state needs to be shared.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping

from sampler.budget import AdmissionBudget, RefusalReason

__all__ = ["FairAdmission", "FairShares"]


class FairShares:
    """Weighted fair order over tenants (start-time fair queuing; see the module doc). Thread-safe."""

    def __init__(self, weights: Mapping[str, float] | None = None, default_weight: float = 1.0) -> None:
        for tenant, weight in {**(weights or {}), "<default>": default_weight}.items():
            if not (math.isfinite(weight) and weight > 0):
                raise ValueError(f"the weight of {tenant} must be a positive number, got {weight!r}")
        self.weights = dict(weights or {})
        self.default_weight = default_weight
        self._lock = threading.Lock()
        self._start: dict[str, float] = {}  # virtual time of each tenant's next judgment
        self._virtual = 0.0  # virtual time of the last judgment admitted
        self._waiting: frozenset[str] = frozenset()

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, self.default_weight)

    def order(self, waiting: Mapping[str, int], n: int) -> list[str]:
        """The tenants of the next `n` judgments (fewer when less is waiting), given how many
        traces each tenant has waiting. Tenants that start waiting are brought up to the virtual
        time now; nothing is charged until `admitted`."""
        with self._lock:
            active = {tenant for tenant, count in waiting.items() if count > 0}
            for tenant in active - self._waiting:
                self._start[tenant] = max(self._start.get(tenant, 0.0), self._virtual)
            self._waiting = frozenset(active)
            start = {tenant: self._start[tenant] for tenant in active}
            left = {tenant: waiting[tenant] for tenant in active}
        picks: list[str] = []
        while len(picks) < n and start:
            tenant = min(start, key=lambda t: (start[t], t))
            picks.append(tenant)
            left[tenant] -= 1
            if left[tenant]:
                start[tenant] += 1.0 / self.weight(tenant)
            else:
                del start[tenant]
        return picks

    def admitted(self, tenant: str) -> None:
        """Charge one admitted judgment to `tenant`."""
        with self._lock:
            start = max(self._start.get(tenant, 0.0), self._virtual)
            self._virtual = start
            self._start[tenant] = start + 1.0 / self.weight(tenant)

    def virtual_times(self) -> dict[str, float]:
        """Each tenant's virtual time (for tests and debugging)."""
        with self._lock:
            return dict(self._start)


class FairAdmission:
    """What the judge queue asks while it claims: the fair order of tenants, and whether the budget
    admits one more judgment (at `cost_usd`), charged to the tenant when it does. Thread-safe."""

    def __init__(self, shares: FairShares, budget: AdmissionBudget | None, cost_usd: float = 0.0) -> None:
        if not (math.isfinite(cost_usd) and cost_usd >= 0):
            raise ValueError(f"cost_usd must be a finite number >= 0, got {cost_usd!r}")
        self.shares = shares
        self.budget = budget
        self.cost_usd = cost_usd

    def order(self, waiting: Mapping[str, int], n: int) -> list[str]:
        return self.shares.order(waiting, n)

    def admit(self, tenant: str) -> RefusalReason | None:
        """None when the budget admits one judgment for `tenant` (then charged to it), else why not.
        Raises what the budget raises (`StoreUnavailable` for the deployment's budget)."""
        reason = None if self.budget is None else self.budget.try_admit(self.cost_usd)
        if reason is None:
            self.shares.admitted(tenant)
        return reason
