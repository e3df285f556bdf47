"""`GET /reports/latest` (HTML) and `/reports/latest.md` (Markdown): the newest weekly report.

`ragmon report` writes the report to its `--out` directory and also to
`<data-dir>/reports/latest.html` and `latest.md`; these routes serve those two
files. Before any report was written they answer 404 with the command to run.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, PlainTextResponse

from service.config import RagmonConfig
from service.report.latest import LATEST_HTML, LATEST_MD, reports_dir

__all__ = ["router"]

router = APIRouter(prefix="/reports", tags=["reports"])


async def _read(request: Request, name: str) -> str:
    config: RagmonConfig = request.app.state.config
    path = reports_dir(config) / name
    try:
        return await asyncio.to_thread(path.read_text, encoding="utf-8")
    except FileNotFoundError:
        raise HTTPException(
            404, f"no report yet; write one with: ragmon report --since 7d --data-dir {config.data_dir}"
        ) from None


@router.get("/latest", response_class=HTMLResponse, summary="The latest drift and quality report (HTML)")
async def latest_html(request: Request) -> HTMLResponse:
    return HTMLResponse(await _read(request, LATEST_HTML))


@router.get("/latest.md", response_class=PlainTextResponse, summary="The latest report's Markdown summary")
async def latest_markdown(request: Request) -> PlainTextResponse:
    return PlainTextResponse(await _read(request, LATEST_MD), media_type="text/markdown; charset=utf-8")
