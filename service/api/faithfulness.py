"""Read API: `GET /api/v1/faithfulness`, the caller's faithfulness estimates in both readings.

Two numbers answer "how faithful are the answers", and users read one as the other:

* `claims`: claim-level faithfulness, the mean share of an answer's claims that the context
  supports (the `ragmon_faithfulness_estimate` gauge);
* `answers`: the answer-level faithful share, answers with no unsupported claim
  (`ragmon_faithful_answers_ratio`). An answer with 4 of 5 claims supported counts 0.8 in the
  first and 0 in the second, so the second is never above the first.

Each is the judge's Hájek estimate over the judged sample of the rolling window
(`sampler/estimate.py`) with its 95 % interval, the number of scored answers it rests on
(`n_judged`) and what is left out of its denominator (`n_no_claims`, `n_failed`, `n_skipped`). It
describes the judge's verdicts, sampling error only: the judge's own error is in none of it.

`human_corrected` is the same reading corrected by the blind review sample (`sampler/corrected.py`,
`service/review/correction.py`): `estimate` with its 95 % interval `low`-`high`, which carries the
sampling error of both the judged and the labelled sample and the judge's error as the labels
measure it, and `n_human`, the blind labels it rests on. It is null, with `human_corrected_reason`,
below `review.min_labels` labels. Where it exists it is the number to read; the judge's is kept
beside it, named as such. Scoped to the caller's tenant, where the gauges sum every tenant; per
app, per (app, release) or per (app, intent).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import APIRouter

from sampler import CorrectedEstimate, FaithfulnessEstimate, Grouping
from service.api.deps import PipelineDep, TenantDep
from service.review.correction import HumanCorrection

__all__ = ["router"]

router = APIRouter(prefix="/api/v1", tags=["faithfulness"])

By = Literal["app", "release", "intent"]
_GROUPING: dict[By, Grouping] = {"app": "app", "release": "app_release", "intent": "app_intent"}


def _reading(est: FaithfulnessEstimate, fixed: CorrectedEstimate | None) -> dict[str, Any]:
    reading = asdict(est)
    if fixed is None or fixed.estimate is None or fixed.lower is None or fixed.upper is None:
        reading["human_corrected"] = None
        reading["human_corrected_reason"] = (
            fixed.reason if fixed is not None and fixed.reason else "no blind labels in the window"
        )
        reading["n_human"] = 0 if fixed is None else fixed.n_human
        return reading
    reading["human_corrected"] = {
        "estimate": fixed.estimate,
        "low": fixed.lower,
        "high": fixed.upper,
        "n_human": fixed.n_human,
        "n_judged": fixed.n_judged,
        "judge_estimate": fixed.judge_estimate,
        "mean_difference": fixed.mean_difference,
        "labelled_share": fixed.labelled_share,
        "method": fixed.method,
        "confidence": fixed.confidence,
    }
    return reading


@router.get("/faithfulness", summary="Faithfulness estimates, claim-level and answer-level, with intervals")
async def faithfulness(
    tenant: TenantDep,
    pipeline: PipelineDep,
    by: By = "app",
    app: str | None = None,
    release: str | None = None,
    intent: str | None = None,
) -> dict[str, Any]:
    """One item per app (`by=app`), per app and release (`by=release`) or per app and intent;
    `app`, `release` and `intent` filter the items (a `release` or `intent` filter implies its `by`)."""
    if by == "app" and release is not None:
        by = "release"
    elif by == "app" and intent is not None:
        by = "intent"
    config = pipeline.config
    correction = HumanCorrection(
        config.judging, config.review, pipeline.judgments, pipeline.metrics, tenant=tenant
    )
    now = datetime.now(UTC)
    claims, answers = await asyncio.gather(
        asyncio.to_thread(correction.compute, now, "claims"),
        asyncio.to_thread(correction.compute, now, "answers"),
    )
    grouping = _GROUPING[by]
    items = []
    for key, claim_est in claims.judge[grouping].items():
        item: dict[str, Any] = {"app": key[0]}
        if by != "app":
            item[by] = key[1]
        if app is not None and item["app"] != app:
            continue
        if release is not None and item.get("release") != release:
            continue
        if intent is not None and item.get("intent") != intent:
            continue
        item["claims"] = _reading(claim_est, claims.corrected[grouping].get(key))
        item["answers"] = _reading(answers.judge[grouping][key], answers.corrected[grouping].get(key))
        items.append(item)
    return {
        "tenant": tenant,
        "computed_at": now.isoformat(),
        "window_s": pipeline.config.judging.estimate_window_s,
        "by": by,
        "readings": {
            "claims": "mean share of an answer's claims the context supports",
            "answers": "share of answers with no unsupported claim",
        },
        "min_labels": config.review.min_labels,
        "items": items,
    }
