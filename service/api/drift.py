"""Drift API under `/api/v1/drift`: pin a reference, list references, run the detectors now, list runs.

Everything is scoped to the caller's tenant. Work that touches the database
or runs detectors happens in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field

from service.api.deps import PipelineDep, TenantDep
from service.drift.pinning import pin_references
from service.ingest.wire import TimeInRange

__all__ = ["PinIn", "RunIn", "router"]

router = APIRouter(prefix="/api/v1/drift", tags=["drift"])


class PinIn(BaseModel):
    """Pin from a time range (`from` and `to`, on trace start time) or from a release, optionally one app."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    since: TimeInRange | None = Field(default=None, alias="from")
    until: TimeInRange | None = Field(default=None, alias="to")
    release: str | None = None
    app: str | None = None


class RunIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    app: str | None = None


@router.post("/references", summary="Pin a new reference version per app and embedding model")
async def pin(body: PinIn, tenant: TenantDep, pipeline: PipelineDep) -> dict[str, Any]:
    await asyncio.to_thread(pipeline.drift.flush)
    try:
        outcome = await asyncio.to_thread(
            pin_references,
            pipeline.drift_store,
            tenant,
            since=body.since,
            until=body.until,
            release=body.release,
            app=body.app,
            capacity=pipeline.config.drift.reference_capacity,
            min_size=pipeline.config.drift.min_window,
            seed=pipeline.config.drift.seed,
        )
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from exc
    return outcome.to_json()


@router.get("/references", summary="Every reference version, newest version first")
async def references(tenant: TenantDep, pipeline: PipelineDep, app: str | None = None) -> dict[str, Any]:
    found = await asyncio.to_thread(pipeline.drift_store.references, tenant, app=app)
    return {"items": [r.to_json() for r in found]}


@router.post("/runs", summary="Run every drift detector now and return the results")
async def run_now(tenant: TenantDep, pipeline: PipelineDep, body: RunIn | None = None) -> dict[str, Any]:
    app = body.app if body is not None else None
    records = await asyncio.to_thread(pipeline.drift.run, tenant=tenant, app=app, trigger="manual")
    without = await asyncio.to_thread(pipeline.drift.unreferenced, tenant, app=app)
    return {
        "items": [r.to_json() for r in records],
        "without_reference": [{"app": a, "model_key": m} for a, m in without],
    }


@router.get("/runs", summary="Stored drift runs, newest first")
async def runs(
    tenant: TenantDep,
    pipeline: PipelineDep,
    app: str | None = None,
    detector: str | None = None,
    model_key: str | None = None,
    alarm: bool | None = None,
    since: TimeInRange | None = None,
    until: TimeInRange | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
) -> dict[str, Any]:
    await asyncio.to_thread(pipeline.drift.flush_events)
    found = await asyncio.to_thread(
        lambda: pipeline.drift_store.runs(
            tenant,
            app=app,
            detector=detector,
            model_key=model_key,
            alarm=alarm,
            since=since,
            until=until,
            limit=limit,
        )
    )
    return {"items": [r.to_json() for r in found]}
