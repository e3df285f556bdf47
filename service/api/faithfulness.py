"""Read API: `GET /api/v1/faithfulness`, the caller's faithfulness estimates in both readings.

Two numbers answer "how faithful are the answers", and users read one as the other:

* `claims`: claim-level faithfulness, the mean share of an answer's claims that the context
  supports (the `ragmon_faithfulness_estimate` gauge);
* `answers`: the answer-level faithful share, answers with no unsupported claim
  (`ragmon_faithful_answers_ratio`). An answer with 4 of 5 claims supported counts 0.8 in the
  first and 0 in the second, so the second is never above the first.

Each is the Hájek estimate over the judged sample of the rolling window
(`sampler/estimate.py`, computed by `service.judge.judging.FaithfulnessEstimator`) with its
95 % interval, the number of scored answers it rests on (`n_judged`) and what is left out of its
denominator (`n_no_claims`, `n_failed`, `n_skipped`). Scoped to the caller's tenant, where the
gauges sum every tenant; per app, per (app, release) or per (app, intent).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import APIRouter

from sampler import FaithfulnessEstimate, Grouping
from service.api.deps import PipelineDep, TenantDep
from service.judge.judging import FaithfulnessEstimator

__all__ = ["router"]

router = APIRouter(prefix="/api/v1", tags=["faithfulness"])

By = Literal["app", "release", "intent"]
_GROUPING: dict[By, Grouping] = {"app": "app", "release": "app_release", "intent": "app_intent"}


def _reading(est: FaithfulnessEstimate) -> dict[str, Any]:
    return asdict(est)


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
    estimator = FaithfulnessEstimator(
        pipeline.config.judging, pipeline.judgments, pipeline.metrics, tenant=tenant
    )
    now = datetime.now(UTC)
    claims, answers = await asyncio.gather(
        asyncio.to_thread(estimator.compute, now, "claims"),
        asyncio.to_thread(estimator.compute, now, "answers"),
    )
    grouping = _GROUPING[by]
    items = []
    for key, claim_est in claims[grouping].items():
        item: dict[str, Any] = {"app": key[0]}
        if by != "app":
            item[by] = key[1]
        if app is not None and item["app"] != app:
            continue
        if release is not None and item.get("release") != release:
            continue
        if intent is not None and item.get("intent") != intent:
            continue
        item["claims"] = _reading(claim_est)
        item["answers"] = _reading(answers[grouping][key])
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
        "items": items,
    }
