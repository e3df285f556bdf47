"""`create_app(config)`: the FastAPI app that receives traces and serves the API, `/metrics` and probes.

Resources (store, bus, pipeline, gRPC receiver) are built in the lifespan,
never at import, so a test process can build many apps side by side.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from service.api import dead_letters as dead_letters_api
from service.api import docs
from service.api import drift as drift_api
from service.api import faithfulness as faithfulness_api
from service.api import probes as probes_api
from service.api import reports as reports_api
from service.api import traces as traces_api
from service.api.request_pool import RequestPool
from service.config import RagmonConfig
from service.errors import DecodeError, InvalidInput, RagmonError
from service.ingest import http_receivers as ingest
from service.ingest.auth import TenantMiddleware, TenantResolver, is_loopback
from service.ingest.grpc_receiver import OtlpGrpcReceiver
from service.ingest.limits import BodyLimitMiddleware
from service.ingest.responses import error_response, readiness_response
from service.metrics import Metrics
from service.pipeline import Pipeline
from service.review import page as review
from service.scrape import scrape_response

log = logging.getLogger(__name__)

VERSION = "0.1.0"


def create_app(config: RagmonConfig, metrics: Metrics | None = None) -> FastAPI:
    metrics = metrics or Metrics(config.metrics, tenants=config.auth.tenants)
    resolver = TenantResolver(config.auth)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pipeline = Pipeline(config, metrics, process="ragmon-serve")
        await pipeline.start()
        app.state.pipeline = pipeline
        # requests' CPU-heavy work (golden-set uploads) in a process of its own; threads where the
        # ingest pools use none (server.ingest_processes 0)
        request_pool = app.state.request_pool = RequestPool(1 if pipeline.ingest_pool.processes else 0)
        grpc_receiver = None
        if config.server.grpc_port:
            grpc_receiver = OtlpGrpcReceiver(
                pipeline, resolver, config.server.host, config.server.grpc_port, config.server.max_body_bytes
            )
            await grpc_receiver.start()
        app.state.grpc_receiver = grpc_receiver
        if resolver.open_to_loopback:
            log.warning("no API keys configured: accepting unauthenticated clients on loopback only")
            if not is_loopback(config.server.host) and config.server.host != "localhost":
                # listening for other machines, which will all be refused: say how to let them in
                log.warning(
                    "listening on %s, but clients on other machines get 403 until API keys are set "
                    '(RAGMON_AUTH__API_KEYS=\'{"<key>": "<tenant>"}\'; README: From another machine)',
                    config.server.host,
                )
        try:
            yield
        finally:
            if grpc_receiver is not None:
                await grpc_receiver.stop()
            await request_pool.stop()
            await pipeline.stop()

    app = FastAPI(
        title="ragmon",
        version=VERSION,
        lifespan=lifespan,
        description="Monitor RAG applications in production from their live traces.",
        # FastAPI's own pages load Swagger UI from a CDN: blank on a machine without internet
        docs_url=None,
        redoc_url=None,
    )
    app.state.metrics = metrics
    app.state.config = config
    app.include_router(docs.router)

    @app.exception_handler(RagmonError)
    async def _ragmon_error(request: Request, exc: RagmonError) -> Response:
        metrics.reject(exc.reason)
        return error_response(exc, request.url.path, request.headers.get("content-type"))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        undecodable = any(e.get("type") == "json_invalid" for e in errors)
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
        error: RagmonError = (
            DecodeError(f"body is not valid JSON: {first.get('msg')}")
            if undecodable
            else InvalidInput(f"{where}: {first.get('msg')}")
        )
        metrics.reject(error.reason)
        return error_response(error, request.url.path, request.headers.get("content-type"))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 400:  # FastAPI's answer to a body it could not parse (e.g. invalid UTF-8)
            metrics.reject("decode_error")
            return error_response(
                DecodeError(f"body could not be decoded: {exc.detail}"), request.url.path, None
            )
        return JSONResponse({"error": "http_error", "detail": exc.detail}, exc.status_code, exc.headers)

    app.include_router(ingest.otlp_router)
    app.include_router(ingest.api_router)
    app.include_router(traces_api.router)
    app.include_router(dead_letters_api.router)
    app.include_router(drift_api.router)
    app.include_router(faithfulness_api.router)
    app.include_router(reports_api.router)
    app.include_router(probes_api.router)
    app.include_router(review.router)  # reviewer sign-in of its own (service/review/session.py)

    @app.get("/healthz", tags=["ops"], summary="Liveness: the event loop answers, the Kafka send loop runs")
    async def healthz(request: Request) -> Response:
        pipeline: Pipeline | None = getattr(request.app.state, "pipeline", None)
        ok, detail = (True, "ok") if pipeline is None else pipeline.alive()
        if not ok:
            log.error("liveness failed: %s", detail)
            return JSONResponse({"status": "dead", "detail": detail}, 503)
        return JSONResponse({"status": "ok"})

    @app.get(
        "/readyz",
        tags=["ops"],
        summary="Readiness: started and able to answer (503 + Retry-After while Kafka is down is an answer)",
    )
    async def readyz(request: Request) -> Response:
        pipeline: Pipeline | None = getattr(request.app.state, "pipeline", None)
        ok, detail = (False, "starting") if pipeline is None else await pipeline.ready()
        return readiness_response(ok, detail)

    scrape_token = config.metrics.scrape_token

    @app.get("/metrics", tags=["ops"], summary="Prometheus metrics (`name[]` to ask for some only)")
    async def prometheus_metrics(request: Request) -> Response:
        return await scrape_response(request, metrics, scrape_token)

    # The last added runs first: the key check (headers only) before the body is read against its cap.
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=config.server.max_body_bytes,
        on_reject=metrics.reject,
        timeout_s=config.server.body_timeout_s,
    )
    app.add_middleware(TenantMiddleware, resolver=resolver, on_reject=metrics.reject)
    return app
