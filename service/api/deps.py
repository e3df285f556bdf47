"""Request dependencies as named `Annotated` aliases; each route declares what it needs.

`TenantDep` is defined beside the middleware that resolves the tenant
(`service/ingest/auth.py`), which the receivers use too; it is re-exported here
so that every route finds its dependencies in one module.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.api.request_pool import RequestPool
from service.ingest.auth import TenantDep
from service.pipeline import Pipeline

__all__ = ["PipelineDep", "RequestPoolDep", "TenantDep"]


async def _pipeline(request: Request) -> Pipeline:  # async: no thread-pool hop (auth._tenant)
    pipeline: Pipeline = request.app.state.pipeline
    return pipeline


PipelineDep = Annotated[Pipeline, Depends(_pipeline)]


async def _request_pool(request: Request) -> RequestPool:  # async: as _pipeline
    pool: RequestPool = request.app.state.request_pool
    return pool


RequestPoolDep = Annotated[RequestPool, Depends(_request_pool)]
"""Where a route runs CPU-heavy work: a worker process, not the event loop (`request_pool.py`)."""
