"""The population faithfulness rate, estimated from the judged sample (Hájek, with a 95 % CI).

The sample is stratified on purpose (every thumbs-down, 2 % of the rest), so
the plain mean of judged scores describes the sample, not production. Each
judged item is weighted by w = 1/π, its inverse inclusion probability, and

    p̂ = Σ w·y / Σ w                                          (Hájek)

over the items with a score. The sampler draws each trace independently
(Poisson sampling), so the linearization variance is

    V̂(p̂) = Σ (1 - π)·w²·(y - p̂)² / (Σ w)²

and the interval is p̂ ± 1.96·√V̂ (method `linearization`). It is used when at
least `min_n` items are scored, V̂ > 0 (beyond rounding) and the interval lies inside [0, 1].
Otherwise (few items, all scores equal, or a bound outside [0, 1]) the
interval is Wilson's score interval on Kish's effective sample size
n_eff = (Σw)²/Σw² (method `wilson_kish`). Wilson stays inside [0, 1] and
never collapses to a point at p̂ = 0 or 1, and it is conservative for scores in
[0, 1]: Bernoulli variance p(1-p) bounds the variance of any [0, 1] score with
mean p, and Kish's n_eff ignores the finite-population gain of π near 1.

What is not in the score's denominator, and how it is reported:

* `no_claims` (refusals, answers without a factual claim) have no
  faithfulness by definition; the estimate is the rate among answers that
  make claims. Counted in `n_no_claims`.
* `failed` (judge failures after retries): excluded, counted in `n_failed`.
  The estimate then assumes failures are unrelated to faithfulness.
* `pending` (selected, not judged yet: waiting for a worker, being judged, or
  deferred because the judge budget had no room: `sampler.fair`) and
  `skipped` (deferred past `max_deferral_s`, reason `expired`; or refused by
  the budget of an earlier version): both thin a cell (stratum and π) by a
  fraction the design did not plan. Within each cell the judged share
  f = judged / (judged + pending + skipped) is observed, and the judged items
  get π·f as their effective inclusion probability: the standard
  weighting-class adjustment for nonresponse. A deferred item judged later
  keeps its π and simply moves from `pending` to judged. Leaving pending
  items out instead would weight a cell one tenant flooded (600 thumbs-downs
  at π = 1, 69 judged so far) as if it held 69 traces. The adjustment is
  unbiased if, within a cell, whether an item was judged yet is unrelated to
  faithfulness (items are judged oldest first and the budget empties by time
  of day, so a window where quality moves with the hour and the budget binds
  at peak is the case it cannot fix). A cell with no judged item cannot be
  adjusted; its traces are missing from the estimate, and
  `n_skipped_unadjusted` says how many (skipped and pending together).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal, Protocol, get_args

import numpy as np

from sampler.interval import NEGLIGIBLE_VARIANCE, check_confidence, normal_quantile, wilson
from sampler.queue import QueueRecord

__all__ = [
    "GROUPINGS",
    "OUTCOMES",
    "FaithfulnessEstimate",
    "Grouping",
    "HasGroupFields",
    "JudgedSample",
    "Outcome",
    "SampleCell",
    "admitted_shares",
    "cells_of",
    "check_grouping",
    "check_inclusion_probability",
    "estimate_by",
    "estimate_cells_by",
    "group_key",
    "hajek",
    "hajek_cells",
]

Outcome = Literal["scored", "no_claims", "failed", "skipped", "pending"]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
_STATE_OUTCOMES: dict[str, Outcome] = {"skipped": "skipped", "failed": "failed"}
_NOT_JUDGED: frozenset[str] = frozenset({"skipped", "pending"})
"""Outcomes of selected items with no judgment (yet): the nonresponse of their cell."""

Grouping = Literal["app", "app_release", "app_intent"]
GROUPINGS: tuple[Grouping, ...] = get_args(Grouping)


def check_inclusion_probability(inclusion_probability: float) -> None:
    """Raise ValueError unless the probability is in (0, 1]."""
    if not (math.isfinite(inclusion_probability) and 0.0 < inclusion_probability <= 1.0):
        raise ValueError(f"inclusion_probability must be in (0, 1], got {inclusion_probability!r}")


def _check_design(inclusion_probability: float, outcome: str) -> None:
    """Raise ValueError unless the probability is in (0, 1] and the outcome is known."""
    check_inclusion_probability(inclusion_probability)
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")


@dataclass(frozen=True, slots=True)
class JudgedSample:
    """One selected trace as the estimator sees it.

    `score` is the faithfulness in [0, 1] (1.0/0.0 for a binary verdict) and
    is given exactly when `outcome` is `scored`. `stratum` and
    `inclusion_probability` come from the queue record. Raises ValueError on
    inconsistent fields.
    """

    inclusion_probability: float
    outcome: Outcome
    score: float | None = None
    stratum: str = "base"
    app: str = "unknown"
    release: str | None = None
    intent: str | None = None
    trace_time: datetime | None = None

    @classmethod
    def from_record(
        cls, record: QueueRecord, outcome: Outcome | None = None, score: float | None = None
    ) -> JudgedSample:
        """The sample for a queue record. A `skipped` or `failed` record gives its own outcome, a
        `pending` or `leased` one (not judged yet) `pending`; a `done` one needs the judgment's
        outcome (`scored` with its score, or `no_claims`). Raises ValueError on a mismatched outcome."""
        state = record.state
        own: Outcome | None = "pending" if state in ("pending", "leased") else _STATE_OUTCOMES.get(state)
        if own is not None:
            if outcome not in (None, own):
                raise ValueError(f"a {state} record cannot have outcome {outcome!r}")
            outcome = own
        elif outcome not in ("scored", "no_claims"):
            raise ValueError(f"a done record needs outcome 'scored' or 'no_claims', got {outcome!r}")
        item = record.item
        return cls(
            inclusion_probability=item.inclusion_probability,
            outcome=outcome,
            score=score,
            stratum=item.stratum,
            app=item.app,
            release=item.release,
            intent=item.intent,
            trace_time=item.trace_time,
        )

    def __post_init__(self) -> None:
        _check_design(self.inclusion_probability, self.outcome)
        if self.outcome == "scored":
            if self.score is None or not (0.0 <= self.score <= 1.0):
                raise ValueError(f"a scored sample needs a score in [0, 1], got {self.score!r}")
        elif self.score is not None:
            raise ValueError(f"an outcome of {self.outcome!r} carries no score")


@dataclass(frozen=True, slots=True)
class FaithfulnessEstimate:
    """The weighted faithfulness rate with its interval and everything left out of it.

    `estimate`, `lower` and `upper` are None when no item has a score.
    `n_judged` counts scored items (the denominator); `n_effective` is Kish's
    (Σw)²/Σw² over them; `sum_weights` estimates how many traces with claims
    they stand for. `n_no_claims`, `n_failed`, `n_skipped` and `n_pending`
    are not in the denominator; `n_skipped_unadjusted` are skipped and
    pending items in cells with no judged item, which the adjustment could
    not carry.
    """

    estimate: float | None
    lower: float | None
    upper: float | None
    n_judged: int
    n_effective: float
    n_failed: int
    n_no_claims: int
    n_skipped: int
    n_skipped_unadjusted: int
    sum_weights: float
    method: Literal["linearization", "wilson_kish", "none"]
    confidence: float
    n_pending: int = 0


@dataclass(frozen=True, slots=True)
class SampleCell:
    """Samples of one outcome that share a group, a stratum and an inclusion probability, summed.

    What the estimate reads of a sample, so that a database can add up a
    window's samples (`GROUP BY`) instead of handing over every record:
    `count` samples; for `scored` ones also the sum of their scores and the
    sum of squared deviations from the cell's own mean (`score_m2`, kept
    centred so that equal scores give exactly 0).
    """

    stratum: str
    inclusion_probability: float
    outcome: Outcome
    count: int
    score_sum: float = 0.0
    score_m2: float = 0.0
    app: str = "unknown"
    release: str | None = None
    intent: str | None = None

    def __post_init__(self) -> None:
        _check_design(self.inclusion_probability, self.outcome)
        if self.count < 1:
            raise ValueError(f"a cell holds at least one sample, got {self.count}")
        if self.outcome == "scored" and not 0.0 <= self.score_sum <= self.count:
            raise ValueError(f"{self.count} scores in [0, 1] cannot sum to {self.score_sum!r}")
        if self.score_m2 < 0.0:
            raise ValueError(f"a sum of squared deviations cannot be negative, got {self.score_m2!r}")


def cells_of(samples: Iterable[JudgedSample]) -> list[SampleCell]:
    """`samples` summed into cells of (group fields, stratum, inclusion probability, outcome)."""
    grouped: dict[tuple[str, str | None, str | None, str, float, Outcome], list[JudgedSample]] = defaultdict(
        list
    )
    for s in samples:
        grouped[(s.app, s.release, s.intent, s.stratum, s.inclusion_probability, s.outcome)].append(s)
    cells = []
    for (app, release, intent, stratum, pi, outcome), members in grouped.items():
        scores = np.array([m.score for m in members if m.score is not None], dtype=float)
        mean = float(scores.mean()) if scores.size else 0.0
        cells.append(
            SampleCell(
                stratum=stratum,
                inclusion_probability=pi,
                outcome=outcome,
                count=len(members),
                score_sum=float(scores.sum()) if scores.size else 0.0,
                score_m2=float(np.sum((scores - mean) ** 2)) if scores.size else 0.0,
                app=app,
                release=release,
                intent=intent,
            )
        )
    return cells


def hajek(
    samples: Iterable[JudgedSample], *, confidence: float = 0.95, min_n: int = 30
) -> FaithfulnessEstimate:
    """The Hájek estimate of the mean faithfulness score over `samples` (see the module doc)."""
    return hajek_cells(cells_of(samples), confidence=confidence, min_n=min_n)


def hajek_cells(
    cells: Iterable[SampleCell], *, confidence: float = 0.95, min_n: int = 30
) -> FaithfulnessEstimate:
    """`hajek` over samples already summed into cells (their group fields are not read)."""
    check_confidence(confidence)
    if min_n < 2:
        raise ValueError(f"min_n must be >= 2, got {min_n}")
    cells = list(cells)
    counts = dict.fromkeys(OUTCOMES, 0)
    for c in cells:
        counts[c.outcome] += c.count
    design = _design(cells)
    unadjusted = sum(skipped for admitted, skipped in design.values() if admitted == 0)

    scored = [c for c in cells if c.outcome == "scored"]
    if not scored:
        return FaithfulnessEstimate(
            estimate=None,
            lower=None,
            upper=None,
            n_judged=0,
            n_effective=0.0,
            n_failed=counts["failed"],
            n_no_claims=counts["no_claims"],
            n_skipped=counts["skipped"],
            n_skipped_unadjusted=unadjusted,
            n_pending=counts["pending"],
            sum_weights=0.0,
            method="none",
            confidence=confidence,
        )

    n = np.array([c.count for c in scored], dtype=float)
    y_sum = np.array([c.score_sum for c in scored])
    m2 = np.array([c.score_m2 for c in scored])
    pi = np.empty(len(scored))
    for i, c in enumerate(scored):
        admitted, skipped = design[(c.stratum, c.inclusion_probability)]
        pi[i] = c.inclusion_probability * admitted / (admitted + skipped)
    w = 1.0 / pi  # every sample of a cell has the same weight
    total = float(np.dot(n, w))
    p_hat = float(np.dot(w, y_sum) / total)
    n_eff = total**2 / float(np.dot(n, w * w))
    # Σ over a cell of (y - p̂)² = its own squared deviations + n·(mean - p̂)²
    squares = m2 + n * (y_sum / n - p_hat) ** 2
    variance = float(np.sum((1.0 - pi) * w * w * squares)) / total**2
    z = normal_quantile(confidence)
    half = z * math.sqrt(variance)
    lower, upper = p_hat - half, p_hat + half
    method: Literal["linearization", "wilson_kish"] = "linearization"
    n_judged = int(n.sum())
    if n_judged < min_n or variance <= NEGLIGIBLE_VARIANCE or lower < 0.0 or upper > 1.0:
        lower, upper = wilson(p_hat, n_eff, z)
        method = "wilson_kish"
    # Rounding can put p̂ a hair outside its own Wilson interval at the edges.
    lower, upper = min(lower, p_hat), max(upper, p_hat)
    return FaithfulnessEstimate(
        estimate=p_hat,
        lower=lower,
        upper=upper,
        n_judged=n_judged,
        n_effective=n_eff,
        n_failed=counts["failed"],
        n_no_claims=counts["no_claims"],
        n_skipped=counts["skipped"],
        n_skipped_unadjusted=unadjusted,
        n_pending=counts["pending"],
        sum_weights=total,
        method=method,
        confidence=confidence,
    )


def _design(cells: Iterable[SampleCell]) -> dict[tuple[str, float], tuple[int, int]]:
    """(stratum, inclusion probability) -> (judged, not judged) counts of the design cell: skipped by
    the budget and still pending (waiting, deferred, in progress) are its nonresponse."""
    design: dict[tuple[str, float], list[int]] = defaultdict(lambda: [0, 0])
    for c in cells:
        design[(c.stratum, c.inclusion_probability)][c.outcome in _NOT_JUDGED] += c.count
    return {key: (admitted, skipped) for key, (admitted, skipped) in design.items()}


def admitted_shares(cells: Iterable[SampleCell]) -> dict[tuple[str, float], float]:
    """(stratum, inclusion probability) -> the share of the design cell the budget admitted, for cells
    with at least one admitted sample: an admitted item's effective inclusion probability is π times
    this (the weighting-class adjustment of the module doc)."""
    return {
        key: admitted / (admitted + skipped)
        for key, (admitted, skipped) in _design(cells).items()
        if admitted > 0
    }


def estimate_by(
    samples: Iterable[JudgedSample],
    grouping: Grouping,
    *,
    now: datetime,
    window: timedelta,
    confidence: float = 0.95,
    min_n: int = 30,
) -> dict[tuple[str, ...], FaithfulnessEstimate]:
    """Hájek estimates per group over the rolling window (now - window, now] of trace time.

    Groups are (app,), (app, release) or (app, intent); samples without the
    release or intent a grouping needs, or without a trace time, are left
    out of that grouping. The budget adjustment is computed within each group.
    """
    check_grouping(grouping)
    if window <= timedelta(0):
        raise ValueError(f"window must be positive, got {window}")
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    start = now - window
    groups: dict[tuple[str, ...], list[JudgedSample]] = defaultdict(list)
    for s in samples:
        if s.trace_time is None or not (start < s.trace_time <= now):
            continue
        key = group_key(s, grouping)
        if key is not None:
            groups[key].append(s)
    return {k: hajek(v, confidence=confidence, min_n=min_n) for k, v in sorted(groups.items())}


def estimate_cells_by(
    cells: Iterable[SampleCell], grouping: Grouping, *, confidence: float = 0.95, min_n: int = 30
) -> dict[tuple[str, ...], FaithfulnessEstimate]:
    """`estimate_by` over cells already limited to the window (what a database sums, see `SampleCell`)."""
    check_grouping(grouping)
    groups: dict[tuple[str, ...], list[SampleCell]] = defaultdict(list)
    for c in cells:
        key = group_key(c, grouping)
        if key is not None:
            groups[key].append(c)
    return {k: hajek_cells(v, confidence=confidence, min_n=min_n) for k, v in sorted(groups.items())}


class HasGroupFields(Protocol):
    """Anything that carries the group fields: a sample, a cell, a labelled sample."""

    @property
    def app(self) -> str: ...
    @property
    def release(self) -> str | None: ...
    @property
    def intent(self) -> str | None: ...


def check_grouping(grouping: str) -> None:
    """Raise ValueError unless `grouping` is one of `GROUPINGS`."""
    if grouping not in GROUPINGS:
        raise ValueError(f"grouping must be one of {GROUPINGS}, got {grouping!r}")


def group_key(s: HasGroupFields, grouping: Grouping) -> tuple[str, ...] | None:
    """(app,), (app, release) or (app, intent) of `s`; None when it lacks the field the grouping needs."""
    if grouping == "app":
        return (s.app,)
    extra = s.release if grouping == "app_release" else s.intent
    return None if extra is None else (s.app, extra)
