"""Read API: `GET /api/v1/traces/{trace_id}` and `GET /api/v1/traces` (filters, keyset pagination).

Every read is scoped to the caller's tenant: another tenant's trace id answers
404, exactly as an unknown one does, so ids cannot be probed across tenants.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Path, Query
from pydantic import BaseModel

from sampler import ItemKey
from service.api.deps import PipelineDep, TenantDep
from service.ingest.wire import TimeInRange
from service.judge.judging import summary_from_record

router = APIRouter(prefix="/api/v1", tags=["traces"])


class TraceListOut(BaseModel):
    items: list[dict[str, Any]]
    next_cursor: str | None


@router.get("/traces/{trace_id}", summary="One stored trace with its context and feedback")
async def get_trace(
    trace_id: Annotated[str, Path(pattern=r"^[0-9a-fA-F]{32}$")], tenant: TenantDep, pipeline: PipelineDep
) -> dict[str, Any]:
    record = await asyncio.to_thread(pipeline.store.get_trace, tenant, trace_id.lower())
    if record is None:
        raise HTTPException(404, f"no trace {trace_id} for this tenant")
    judgments, flags = await asyncio.to_thread(pipeline.judgments.for_trace, tenant, record["trace_id"])
    blind = await asyncio.to_thread(pipeline.reviews.find, tenant, "blind", record["trace_id"])
    hidden = blind is not None and blind.judge_hidden
    # A blind review item's label must not be anchored by the judge: the reviewer who could read it
    # here would see through the blind sample, so judgments and flags wait until it is labelled.
    record["judge_hidden"] = hidden
    record["judgments"] = [] if hidden else judgments
    record["review_flags"] = [] if hidden else flags
    record["sampling"] = await asyncio.to_thread(sampling_view, pipeline, record)
    return record


def sampling_view(pipeline: PipelineDep, record: dict[str, Any]) -> dict[str, Any]:
    """The sampling decision for a stored trace: the queue's record if it was selected, else the decision.

    The decision is a pure function of the trace (and its feedback), so it can
    be recomputed for traces that were never queued.
    """
    decision = pipeline.sampler.decide(summary_from_record(record))
    view: dict[str, Any] = {
        "selected": decision.selected,
        "stratum": decision.stratum,
        "strata": list(decision.strata),
        "inclusion_probability": decision.inclusion_probability,
        "judge_version": pipeline.sampler.judge_version,
    }
    queued = pipeline.judge_queue.get(
        ItemKey(record["tenant"], record["trace_id"], pipeline.sampler.judge_version)
    )
    if queued is not None:
        view.update(
            stratum=queued.item.stratum,
            inclusion_probability=queued.item.inclusion_probability,
            queue_state=queued.state,
            attempts=queued.attempts,
            last_error=queued.last_error,
            skip_reason=queued.item.skip_reason,
            deferred=queued.deferred,  # waiting for the judge budget (sampler/fair.py)
        )
    return view


@router.get("/traces", response_model=TraceListOut, summary="Recent traces, newest first")
async def list_traces(
    tenant: TenantDep,
    pipeline: PipelineDep,
    app: str | None = None,
    since: TimeInRange | None = None,
    until: TimeInRange | None = None,
    regeneration: bool | None = None,
    partial: bool | None = None,
    feedback: Literal["up", "down", "regenerate"] | None = None,
    release: str | None = None,
    intent: str | None = None,
    probe: bool | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    cursor: str | None = None,
) -> TraceListOut:
    given = {
        "app": app,
        "since": since,
        "until": until,
        "regeneration": regeneration,
        "partial": partial,
        "has_feedback": feedback,
        "release": release,
        "intent": intent,
        "probe": probe,
    }
    if pipeline.redactor is not None:  # stored redacted: a raw id finds them (`Redactor.identifier`)
        redact = pipeline.redactor.identifier
        given |= {"app": redact(app), "release": redact(release), "intent": redact(intent)}
    filters: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    items, next_cursor = await asyncio.to_thread(
        lambda: pipeline.store.list_traces(tenant, limit=limit, cursor=cursor, **filters)
    )
    return TraceListOut(items=items, next_cursor=next_cursor)
