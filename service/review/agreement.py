"""Judge-human agreement as a live signal: per app over the rolling window, and whether it fell.

From the blind sample's answer-level pairs (judge: no unsupported claim or
not; reviewer: faithful or unfaithful; `unsure` left out) of one app:

* agreement, the share of pairs where both say the same, with Wilson's
  interval, and Cohen's kappa with its interval (`calibration.cohen_kappa`);
  over the pairs as drawn (the blind sample follows the judged sample's
  strata, so thumbs-down answers weigh more than in traffic), as the
  calibration page counts them;
* the drift test: the window's disagreement share against the reference's,
  the blind pairs of the `agreement_reference_s` before the window (an
  earlier period, so it moves with the window and never overlaps it), by a
  one-sided Fisher exact test (H1: the window disagrees more). Its p-value is
  a gauge and `RagmonJudgeHumanDisagreementRose` fires under the alpha of
  `thresholds.yaml`. Under no change the test rejects in at most alpha of
  windows per app (Fisher's test is conservative for the one-sided
  alternative, `tests/service/review/test_agreement.py` measures it); the
  alert's `for` does not add alarms. A change in the app's traffic mix
  between the periods (more hard questions) can move disagreement without
  the judge changing; the alert says "look", not "the judge broke".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from scipy.stats import fisher_exact, norm

from sampler.corrected import LabelledSample
from service.review.calibration import Rate, cohen_kappa

__all__ = ["Agreement", "agreement", "disagreement_p_value"]


@dataclass(frozen=True, slots=True)
class Agreement:
    """Judge-human agreement of one app in the window, and the disagreement test against the reference."""

    agreement: Rate
    kappa: float | None
    kappa_lower: float | None
    kappa_upper: float | None
    reference_disagreement: Rate
    p_value: float | None
    """One-sided Fisher exact p-value of 'the window disagrees more than the reference'; None when
    either period has no pairs."""

    @property
    def pairs(self) -> int:
        return self.agreement.total


def _table(pairs: Iterable[LabelledSample]) -> tuple[int, int, int, int]:
    """(judge faithful & human faithful, judge faithful & human not, judge not & human faithful, neither)."""
    ff = fu = uf = uu = 0
    for p in pairs:
        judge, human = p.judge_score >= 0.5, p.human_score >= 0.5
        if judge and human:
            ff += 1
        elif judge:
            fu += 1
        elif human:
            uf += 1
        else:
            uu += 1
    return ff, fu, uf, uu


def disagreement_p_value(
    disagree: int, pairs: int, reference_disagree: int, reference_pairs: int
) -> float | None:
    """One-sided Fisher exact test that the window's disagreement share exceeds the reference's."""
    if pairs == 0 or reference_pairs == 0:
        return None
    table = [[disagree, pairs - disagree], [reference_disagree, reference_pairs - reference_disagree]]
    return float(fisher_exact(table, alternative="greater").pvalue)


def agreement(
    window: Iterable[LabelledSample], reference: Iterable[LabelledSample], *, confidence: float = 0.95
) -> Agreement:
    """Agreement and kappa over the window's answer-level pairs, and the test against the reference's."""
    z = float(norm.ppf(0.5 + confidence / 2.0))
    ff, fu, uf, uu = _table(window)
    n = ff + fu + uf + uu
    kappa, lower, upper = cohen_kappa(ff, fu, uf, uu, z)
    rff, rfu, ruf, ruu = _table(reference)
    n_ref = rff + rfu + ruf + ruu
    return Agreement(
        agreement=Rate.of(ff + uu, n, confidence),
        kappa=kappa,
        kappa_lower=lower,
        kappa_upper=upper,
        reference_disagreement=Rate.of(rfu + ruf, n_ref, confidence),
        p_value=disagreement_p_value(fu + uf, n, rfu + ruf, n_ref),
    )
