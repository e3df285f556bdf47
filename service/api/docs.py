"""`/docs`: the OpenAPI page, served with Swagger UI's own files, so it works without internet.

FastAPI's default page loads Swagger UI from a CDN, and is blank offline (a
user's laptop on a plane, a cluster without egress). Swagger UI 5 (the first
to read OpenAPI 3.1, which FastAPI writes) comes vendored in the
`fastapi-offline` package; this router serves its files under `/docs/assets/`,
an allow-list of the few the page loads.
"""

from __future__ import annotations

import asyncio
from importlib import resources
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response

__all__ = ["router"]

router = APIRouter(include_in_schema=False)

_ASSETS = {
    "swagger-ui-bundle.js": "application/javascript",
    "swagger-ui.css": "text/css",
    "favicon.png": "image/png",
}


def _bundle() -> Path:
    return Path(str(resources.files("fastapi_offline") / "static"))


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url=request.app.openapi_url or "/openapi.json",
        title="ragmon API",
        swagger_js_url="/docs/assets/swagger-ui-bundle.js",
        swagger_css_url="/docs/assets/swagger-ui.css",
        swagger_favicon_url="/docs/assets/favicon.png",
    )


@router.get("/docs/assets/{name}")
async def swagger_asset(name: str) -> Response:
    media_type = _ASSETS.get(name)
    if media_type is None:
        raise HTTPException(404, "no such file")
    body = await asyncio.to_thread((_bundle() / name).read_bytes)
    return Response(body, media_type=media_type, headers={"cache-control": "public, max-age=86400"})
