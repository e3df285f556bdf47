"""The ingest routes resolve their dependencies on the event loop, never in FastAPI's thread pool.

FastAPI runs a plain `def` dependency (or endpoint) in its thread pool: a hop
to a worker thread and back on every request. For the ingest routes that was
two hops a request (tenant, pipeline) for functions that only read request
state; made `async`, a request cost ~230 µs less CPU in a FastAPI app alone
(bench/RESULTS.md, "Session 36"). This holds the routes to it.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from service.ingest.http_receivers import api_router, otlp_router

INGEST_PATHS = {"/v1/traces", "/v1/logs", "/v1/metrics", "/api/v1/traces", "/api/v1/feedback"}


def _calls(dependant: Dependant) -> Iterator[object]:
    for dependency in dependant.dependencies:
        if dependency.call is not None:
            yield dependency.call
        yield from _calls(dependency)


def test_every_ingest_route_and_its_dependencies_run_on_the_event_loop() -> None:
    routes = {
        route.path: route
        for route in (*otlp_router.routes, *api_router.routes)
        if isinstance(route, APIRoute) and "POST" in route.methods
    }
    assert set(routes) == INGEST_PATHS  # the walk found every ingest route
    names: set[str] = set()
    for path, route in routes.items():
        assert inspect.iscoroutinefunction(route.endpoint), path
        for call in _calls(route.dependant):
            names.add(getattr(call, "__name__", repr(call)))
            assert inspect.iscoroutinefunction(call), f"{path}: dependency {call!r} is not async"
    assert {"_tenant", "_target"} <= names  # ... and the dependencies it was written for
