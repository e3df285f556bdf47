"""Judge calibration: how often the faithfulness judge agrees with human reviewers, with intervals.

For each judge version and each sample (`blind`: the random sample of judged
traces, reviewed without seeing the judge; `flagged`: the items the judge or
users flagged), a 2×2 table of judge verdict × reviewer verdict gives:

* agreement: share of pairs where both say the same; Wilson score interval.
* Cohen's kappa: agreement beyond chance, (p_o − p_e) / (1 − p_e), with the
  large-sample standard error of Fleiss, Cohen & Everitt (1969) and a normal
  interval clipped to [−1, 1]; None when p_e = 1 (both raters used one label
  only, so kappa is undefined).
* false-approval rate: among traces the judge called faithful, the share the
  reviewer called unfaithful — how far a "faithful" from the judge can be
  trusted; Wilson interval.
* false-rejection rate: among traces the judge called unfaithful, the share
  the reviewer called faithful; Wilson interval.

The judge calls a trace faithful when it scored it with no unsupported claim
(the `faithful` verdict of `ragmon_judge_verdicts_total`). Reviewer labels
`unsure` are left out and counted; so are pairs where the judge gave no
verdict (failed, or an answer with no claims). Only the blind sample estimates
the judge's error on judged traffic; flagged items were chosen because the
judge (or a user) objected, so their rates describe flags, not traffic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from scipy.stats import binomtest, norm

from service.review.records import CalibrationRow, Queue

__all__ = ["Calibration", "Rate", "calibrate", "cohen_kappa", "judge_says_faithful"]

JudgeLabel = Literal["faithful", "unfaithful"]


@dataclass(frozen=True, slots=True)
class Rate:
    """A proportion with its Wilson score interval; value and bounds are None when `total` is 0."""

    count: int
    total: int
    value: float | None
    lower: float | None
    upper: float | None

    @classmethod
    def of(cls, count: int, total: int, confidence: float) -> Rate:
        if not 0 <= count <= total:
            raise ValueError(f"need 0 <= count <= total, got {count} of {total}")
        if total == 0:
            return cls(count, total, None, None, None)
        interval = binomtest(count, total).proportion_ci(confidence_level=confidence, method="wilson")
        return cls(count, total, count / total, float(interval.low), float(interval.high))

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "total": self.total,
            "value": self.value,
            "lower": self.lower,
            "upper": self.upper,
        }


@dataclass(frozen=True, slots=True)
class Calibration:
    """Judge-versus-reviewer agreement for one judge version on one sample."""

    judge_version: str
    sample: Queue
    # the 2x2 table: judge label first, reviewer label second
    faithful_faithful: int
    faithful_unfaithful: int
    unfaithful_faithful: int
    unfaithful_unfaithful: int
    unsure: int
    no_judge_verdict: int
    agreement: Rate
    kappa: float | None
    kappa_lower: float | None
    kappa_upper: float | None
    false_approval: Rate
    false_rejection: Rate

    @property
    def pairs(self) -> int:
        return self.agreement.total

    def to_json(self) -> dict[str, Any]:
        return {
            "judge_version": self.judge_version,
            "sample": self.sample,
            "pairs": self.pairs,
            "table": {
                "judge_faithful": {
                    "reviewer_faithful": self.faithful_faithful,
                    "reviewer_unfaithful": self.faithful_unfaithful,
                },
                "judge_unfaithful": {
                    "reviewer_faithful": self.unfaithful_faithful,
                    "reviewer_unfaithful": self.unfaithful_unfaithful,
                },
            },
            "excluded": {"unsure": self.unsure, "no_judge_verdict": self.no_judge_verdict},
            "agreement": self.agreement.to_json(),
            "kappa": {"value": self.kappa, "lower": self.kappa_lower, "upper": self.kappa_upper},
            "false_approval": self.false_approval.to_json(),
            "false_rejection": self.false_rejection.to_json(),
        }


def judge_says_faithful(outcome: str, faithfulness: float | None) -> bool | None:
    """The judge's binary verdict: True (no unsupported claim), False, or None (no verdict)."""
    if outcome != "scored" or faithfulness is None:
        return None
    return faithfulness >= 1.0 - 1e-9


def cohen_kappa(
    ff: int, fu: int, uf: int, uu: int, z: float
) -> tuple[float | None, float | None, float | None]:
    """Cohen's kappa of a 2x2 table (judge label first, reviewer second) with its interval at normal
    quantile `z` (see the module doc); (None, None, None) without pairs or when kappa is undefined."""
    n = ff + fu + uf + uu
    if n == 0:
        return None, None, None
    p = [[ff / n, fu / n], [uf / n, uu / n]]  # rows: judge, columns: reviewer
    rows = [p[0][0] + p[0][1], p[1][0] + p[1][1]]
    cols = [p[0][0] + p[1][0], p[0][1] + p[1][1]]
    p_o = p[0][0] + p[1][1]
    p_e = rows[0] * cols[0] + rows[1] * cols[1]
    if p_e >= 1.0 - 1e-12:
        return None, None, None
    kappa = (p_o - p_e) / (1 - p_e)
    # Fleiss, Cohen & Everitt (1969), the variance of kappa when it is not 0:
    #   ( sum_i p_ii [1 - (p_i. + p_.i)(1 - k)]^2
    #     + (1 - k)^2 sum_{i!=j} p_ij (p_.i + p_j.)^2 - [k - p_e(1 - k)]^2 ) / (n (1 - p_e)^2)
    diagonal = sum(p[i][i] * (1 - (rows[i] + cols[i]) * (1 - kappa)) ** 2 for i in range(2))
    off = sum(p[i][j] * (cols[i] + rows[j]) ** 2 for i in range(2) for j in range(2) if i != j)
    variance = (diagonal + (1 - kappa) ** 2 * off - (kappa - p_e * (1 - kappa)) ** 2) / (n * (1 - p_e) ** 2)
    se = math.sqrt(max(variance, 0.0))
    return kappa, max(-1.0, kappa - z * se), min(1.0, kappa + z * se)


def calibrate(rows: Iterable[CalibrationRow], confidence: float = 0.95) -> list[Calibration]:
    """One `Calibration` per (judge version, sample) present in `rows`, sorted by version then sample."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    z = float(norm.ppf(0.5 + confidence / 2))
    counts: dict[tuple[str, Queue], list[int]] = {}
    for row in rows:
        # [ff, fu, uf, uu, unsure, no_judge_verdict]
        cell = counts.setdefault((row.judge_version, row.queue), [0, 0, 0, 0, 0, 0])
        judge = judge_says_faithful(row.judge_outcome, row.judge_faithfulness)
        if judge is None:
            cell[5] += 1
        elif row.verdict == "unsure":
            cell[4] += 1
        else:
            cell[(0 if judge else 2) + (0 if row.verdict == "faithful" else 1)] += 1
    result = []
    for (version, sample), (ff, fu, uf, uu, unsure, none) in sorted(counts.items()):
        kappa, lower, upper = cohen_kappa(ff, fu, uf, uu, z)
        result.append(
            Calibration(
                judge_version=version,
                sample=sample,
                faithful_faithful=ff,
                faithful_unfaithful=fu,
                unfaithful_faithful=uf,
                unfaithful_unfaithful=uu,
                unsure=unsure,
                no_judge_verdict=none,
                agreement=Rate.of(ff + uu, ff + fu + uf + uu, confidence),
                kappa=kappa,
                kappa_lower=lower,
                kappa_upper=upper,
                false_approval=Rate.of(fu, ff + fu, confidence),
                false_rejection=Rate.of(uf, uf + uu, confidence),
            )
        )
    return result
