"""Request dependencies as named `Annotated` aliases; each route declares what it needs."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.errors import Unauthenticated
from service.pipeline import Pipeline


def _pipeline(request: Request) -> Pipeline:
    pipeline: Pipeline = request.app.state.pipeline
    return pipeline


def _tenant(request: Request) -> str:
    """The caller's tenant, set by `TenantMiddleware` (which already refused unknown callers)."""
    tenant = request.scope.get("state", {}).get("tenant")
    if not isinstance(tenant, str):
        raise Unauthenticated("no tenant resolved for this request")
    return tenant


PipelineDep = Annotated[Pipeline, Depends(_pipeline)]
TenantDep = Annotated[str, Depends(_tenant)]
