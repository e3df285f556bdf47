"""`GET /reports/latest` (HTML) and `/reports/latest.md` (Markdown): the caller's newest report.

`ragmon report` writes the report to its `--out` directory and also to its
tenant's latest copies (`service/report/latest.py`); these routes serve the
caller's tenant's (from its API key), or with `?app=` the latest report for
that app only. Another tenant's report is never served. Before a report was
written they answer 404 with the command to run.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, PlainTextResponse

from service.api.deps import TenantDep
from service.config import RagmonConfig
from service.report.latest import LATEST_HTML, LATEST_MD, latest_dir

__all__ = ["router"]

router = APIRouter(prefix="/reports", tags=["reports"])


async def _read(request: Request, tenant: str, app: str | None, name: str) -> str:
    config: RagmonConfig = request.app.state.config
    path = latest_dir(config, tenant, app) / name
    try:
        return await asyncio.to_thread(path.read_text, encoding="utf-8")
    except FileNotFoundError:
        raise HTTPException(
            404,
            "no report yet; write one with: ragmon report --since 7d"
            + (f" --tenant {tenant}" if tenant != "default" else "")
            + (f" --app {app}" if app else ""),
        ) from None


@router.get("/latest", response_class=HTMLResponse, summary="The latest drift and quality report (HTML)")
async def latest_html(request: Request, tenant: TenantDep, app: str | None = None) -> HTMLResponse:
    return HTMLResponse(await _read(request, tenant, app, LATEST_HTML))


@router.get("/latest.md", response_class=PlainTextResponse, summary="The latest report's Markdown summary")
async def latest_markdown(request: Request, tenant: TenantDep, app: str | None = None) -> PlainTextResponse:
    markdown = await _read(request, tenant, app, LATEST_MD)
    return PlainTextResponse(markdown, media_type="text/markdown; charset=utf-8")
