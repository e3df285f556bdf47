"""Read API: `GET /api/v1/dead-letters`, the records a sink refused for good, newest first.

The bus sets such a record aside one at a time (`service/bus/memory.py`)
instead of losing its whole batch; this is where an operator finds it, with
the error and the record as JSON (bounded: `truncated` says it was
shortened), to fix the cause and send it again. Scoped to the caller's
tenant like every read, and paged by an opaque cursor (`next_cursor`).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel

from service.api.deps import PipelineDep, TenantDep
from service.store.trace_query import MAX_PAGE_SIZE

router = APIRouter(prefix="/api/v1", tags=["dead letters"])


class DeadLetterListOut(BaseModel):
    items: list[dict[str, Any]]
    next_cursor: str | None


@router.get(
    "/dead-letters",
    response_model=DeadLetterListOut,
    summary="Records a sink refused for good (kept with their error), newest first",
)
async def list_dead_letters(
    tenant: TenantDep,
    pipeline: PipelineDep,
    kind: Literal["trace", "feedback"] | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = 50,
    cursor: str | None = None,
) -> DeadLetterListOut:
    """Each item: `id`, `kind` (trace | feedback), `record_id`, `error`, `record`, `truncated`,
    `created_at`. A malformed cursor is a 422."""
    items, next_cursor = await asyncio.to_thread(
        lambda: pipeline.store.list_dead_letters(tenant, limit=limit, cursor=cursor, kind=kind)
    )
    return DeadLetterListOut(items=items, next_cursor=next_cursor)
