"""Probes API under `/api/v1/probes`: load golden sets, register and list runs, score, compare, pin.

Everything is scoped to the caller's tenant and runs its database and
scoring work off the event loop. Scoring a run reads the run's stored
traces (send the probes, let ragmon store them, then score), judges the
answers' correctness, stores the score (scoring again replaces it and
reuses correctness already judged for the same traces), compares it with the
previous run and the pinned baseline, and, when it is its golden set's
newest scored run, sets the probe gauges.

    POST /golden                {name, jsonl}           load a golden set (idempotent by content hash; parsed
                                                        in a worker process: service/api/request_pool.py)
    GET  /golden                                        stored golden sets, every version
    POST /runs                  {golden, run_id?}       register a run before sending it
    GET  /runs?golden=NAME                              runs, newest first
    GET  /runs/{run_id}                                 one run with its stored score
    POST /runs/{run_id}/score   {golden?}               score (golden needed only for unregistered runs)
    GET  /runs/{run_id}/compare?against=previous|baseline|RUN_ID
    POST /baseline              {run_id}                pin a scored run as its golden set's baseline
    GET  /baseline?golden=NAME
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from service.api.deps import PipelineDep, RequestPoolDep, TenantDep
from service.judge.correctness import build_correctness
from service.pipeline import Pipeline
from service.probes.gauges import against_baseline, publish_probe_run
from service.probes.golden import GoldenSet, GoldenText
from service.probes.scoring import compare_runs, score_run
from service.probes.store import GoldenStore, ProbeRun
from service.probes.upload import GoldenIn, read_golden_upload

__all__ = ["GoldenIn", "PinIn", "RunIn", "ScoreIn", "router"]

router = APIRouter(prefix="/api/v1/probes", tags=["probes"])


class RunIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    golden: str = Field(min_length=1, description="golden set name; its latest version is used")
    run_id: str | None = Field(default=None, min_length=1, max_length=200)


class ScoreIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    golden: str | None = Field(default=None, description="golden set name, for a run never registered")


class PinIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(min_length=1)


def _golden_store(pipeline: Pipeline) -> GoldenStore:
    store: GoldenStore = pipeline.golden
    return store


def _compare(pipeline: Pipeline, new: ProbeRun, old: ProbeRun | None) -> dict[str, Any] | None:
    if old is None or old.result is None or new.result is None:
        return None
    p = pipeline.config.probes
    return compare_runs(
        new.result, old.result, resamples=p.bootstrap_resamples, confidence=p.confidence, seed=p.seed
    )


@router.post(
    "/golden",
    summary="Load a golden set (JSONL); the same content twice is stored once",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": GoldenIn.model_json_schema()}},
        }
    },
)
async def load_golden_set(
    request: Request, tenant: TenantDep, pipeline: PipelineDep, workers: RequestPoolDep
) -> dict[str, Any]:
    """The body (`GoldenIn`) arrives within `server.max_body_bytes` (413 past it, as every body) and
    is parsed in a worker process (`service/api/request_pool.py`): a 10 MB set held every other
    request on the event loop for seconds. With redaction on, its rows come back too and are
    redacted (as `redaction.FIELDS` says, its version anew) in a thread before they are kept."""
    body = await request.body()
    redacting = pipeline.redactor is not None
    upload = await workers.run(functools.partial(read_golden_upload, body, keep_rows=redacting))
    golden: GoldenSet | GoldenText = upload.text
    if upload.rows is not None:
        golden = await asyncio.to_thread(_redacted_golden, pipeline, upload.rows)
    info = await asyncio.to_thread(_golden_store(pipeline).load, tenant, golden, upload.name)
    return info.to_json()


def _redacted_golden(pipeline: Pipeline, golden: GoldenSet) -> GoldenSet:
    redactor = pipeline.redactor
    if redactor is None:
        return golden
    return GoldenSet([pipeline.redacted(q) for q in golden], source=redactor.text(golden.source) or "")


@router.get("/golden", summary="Stored golden sets, every version, newest first")
async def golden_sets(tenant: TenantDep, pipeline: PipelineDep) -> dict[str, Any]:
    found = await asyncio.to_thread(_golden_store(pipeline).golden_sets, tenant)
    return {"items": [g.to_json() for g in found]}


@router.post("/runs", summary="Register a probe run before its questions are sent")
async def register_run(body: RunIn, tenant: TenantDep, pipeline: PipelineDep) -> dict[str, Any]:
    store = _golden_store(pipeline)
    golden = await asyncio.to_thread(store.golden, tenant, body.golden)
    if golden is None:
        raise HTTPException(404, f"no golden set named {body.golden!r}; load it first")
    run_id = body.run_id or f"probe-{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"
    run = await asyncio.to_thread(
        store.register_run, tenant, run_id, body.golden, golden.version, datetime.now(UTC)
    )
    return run.to_json()


@router.get("/runs", summary="Probe runs, newest first, with their headline numbers")
async def runs(
    tenant: TenantDep,
    pipeline: PipelineDep,
    golden: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
) -> dict[str, Any]:
    found = await asyncio.to_thread(_golden_store(pipeline).runs, tenant, golden, limit)
    items = []
    for run in found:
        item = run.to_json()
        if run.result is not None:
            item["overall"] = run.result["overall"]
            item["denominators"] = run.result["denominators"]
            item["filter_false_exclusion"] = run.result["filter_false_exclusion"]["rate"]
            item["correct"] = run.result["correctness"]["rate"]
        items.append(item)
    return {"items": items}


async def _run_or_404(pipeline: Pipeline, tenant: str, run_id: str) -> ProbeRun:
    run = await asyncio.to_thread(_golden_store(pipeline).run, tenant, run_id)
    if run is None:
        raise HTTPException(404, f"no probe run {run_id!r}")
    return run


@router.get("/runs/{run_id}", summary="One probe run with its stored score")
async def get_run(run_id: str, tenant: TenantDep, pipeline: PipelineDep) -> dict[str, Any]:
    return (await _run_or_404(pipeline, tenant, run_id)).to_json(with_result=True)


async def _unregistered(pipeline: Pipeline, tenant: str, run_id: str, golden_name: str | None) -> ProbeRun:
    if golden_name is None:
        raise HTTPException(404, f"probe run {run_id!r} was never registered; name its golden set")
    golden = await asyncio.to_thread(_golden_store(pipeline).golden, tenant, golden_name)
    if golden is None:
        raise HTTPException(404, f"no golden set named {golden_name!r}; load it first")
    return ProbeRun(run_id, golden_name, golden.version, datetime.now(UTC), None, None)


def _faithfulness(pipeline: Pipeline, tenant: str, trace_ids: list[str]) -> dict[str, float | None]:
    version = pipeline.judge.version
    outcomes = pipeline.judgments.outcomes((tenant, t, version) for t in trace_ids)
    return {
        trace_id: faithfulness
        for (_, trace_id, _), (outcome, faithfulness) in outcomes.items()
        if outcome == "scored"
    }


@router.post("/runs/{run_id}/score", summary="Score a run from its stored traces and compare it")
async def score(
    run_id: str, tenant: TenantDep, pipeline: PipelineDep, body: ScoreIn | None = None
) -> dict[str, Any]:
    store = _golden_store(pipeline)
    run = await asyncio.to_thread(store.run, tenant, run_id)
    registered = run is not None
    if run is None:
        run = await _unregistered(pipeline, tenant, run_id, body.golden if body else None)
    golden = await asyncio.to_thread(store.golden, tenant, run.golden_name, run.golden_version)
    if golden is None:
        raise HTTPException(404, f"golden set {run.golden_name!r} version {run.golden_version} is gone")
    records = await asyncio.to_thread(store.run_traces, tenant, run_id)
    started_at = run.started_at
    if not registered:
        if not records:
            raise HTTPException(404, f"no stored traces carry probe run id {run_id!r}")
        started_at = min(datetime.fromisoformat(r["start_time"]) for r in records)
    faithfulness = await asyncio.to_thread(
        _faithfulness, pipeline, tenant, [str(r["trace_id"]) for r in records]
    )
    reuse = {
        str(row["trace_id"]): row["correctness"]
        for row in (run.result or {}).get("per_question", {}).values()
        if row.get("trace_id") and row.get("correctness")
    }
    p = pipeline.config.probes

    async def run_scoring() -> dict[str, Any]:
        judge = build_correctness(p.correctness, pipeline.config.judge)
        try:
            return await score_run(
                run_id,
                tenant,
                golden,
                records,
                ks=p.ks,
                relevance_level=p.relevance_level,
                correctness=judge,
                faithfulness=faithfulness,
                supported_threshold=p.supported_threshold,
                reuse=reuse,
                concurrency=p.correctness_concurrency,
            )
        finally:
            await judge.aclose()

    # in a thread with an event loop of its own: the retrieval metrics of every question of a large
    # golden set are seconds of CPU, which on the server's loop held every request of every tenant
    result = await asyncio.to_thread(asyncio.run, run_scoring())
    scored = ProbeRun(run_id, run.golden_name, run.golden_version, started_at, datetime.now(UTC), result)
    await asyncio.to_thread(store.save_score, tenant, scored)
    previous = await asyncio.to_thread(store.previous_run, tenant, scored)
    baseline = await asyncio.to_thread(against_baseline, store, tenant, run_id, run.golden_name)
    vs_previous = await asyncio.to_thread(_compare, pipeline, scored, previous)
    vs_baseline = await asyncio.to_thread(_compare, pipeline, scored, baseline)
    newest = await asyncio.to_thread(_newest_scored, store, tenant, run.golden_name)
    if newest == run_id:
        publish_probe_run(pipeline.metrics, tenant, run.golden_name, result, started_at, vs_baseline)
    return {
        "run": scored.to_json(),
        "published": newest == run_id,
        "score": result,
        "against_previous": vs_previous,
        "against_baseline": vs_baseline,
    }


def _newest_scored(store: GoldenStore, tenant: str, golden_name: str) -> str | None:
    for _, run in store.latest_scored_runs(tenant):
        if run.golden_name == golden_name:
            return run.run_id
    return None


@router.get(
    "/runs/{run_id}/compare", summary="Paired comparison with the previous run, the baseline or a run"
)
async def compare(
    run_id: str, tenant: TenantDep, pipeline: PipelineDep, against: str = "baseline"
) -> dict[str, Any]:
    store = _golden_store(pipeline)
    run = await _run_or_404(pipeline, tenant, run_id)
    if run.result is None:
        raise HTTPException(409, f"probe run {run_id!r} has not been scored")
    if against == "previous":
        other = await asyncio.to_thread(store.previous_run, tenant, run)
    elif against == "baseline":
        other = await asyncio.to_thread(store.baseline, tenant, run.golden_name)
    else:
        other = await _run_or_404(pipeline, tenant, against)
    if other is None or other.result is None:
        raise HTTPException(404, f"no scored {against} run to compare {run_id!r} with")
    return await asyncio.to_thread(_compare, pipeline, run, other) or {}


@router.post("/baseline", summary="Pin a scored run as the baseline of its golden set")
async def pin(body: PinIn, tenant: TenantDep, pipeline: PipelineDep) -> dict[str, Any]:
    store = _golden_store(pipeline)
    run = await asyncio.to_thread(store.pin_baseline, tenant, body.run_id)
    # the delta gauges of the golden set's newest run are against the baseline: refresh them
    newest_id = await asyncio.to_thread(_newest_scored, store, tenant, run.golden_name)
    if newest_id is not None:
        newest = await asyncio.to_thread(store.run, tenant, newest_id)
        if newest is not None and newest.result is not None:
            other = None if newest_id == run.run_id else run
            comparison = await asyncio.to_thread(_compare, pipeline, newest, other)
            publish_probe_run(
                pipeline.metrics, tenant, newest.golden_name, newest.result, newest.started_at, comparison
            )
    return run.to_json()


@router.get("/baseline", summary="The pinned baseline run of a golden set")
async def baseline(golden: str, tenant: TenantDep, pipeline: PipelineDep) -> dict[str, Any]:
    run = await asyncio.to_thread(_golden_store(pipeline).baseline, tenant, golden)
    if run is None:
        raise HTTPException(404, f"no baseline pinned for golden set {golden!r}")
    return run.to_json()
