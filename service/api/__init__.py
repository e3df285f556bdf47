"""The HTTP surface on top of everything: `create_app`, the request dependencies and the read APIs.

Owns: `app.py` (the FastAPI app: middleware, routers, `/metrics`, `/healthz`, `/readyz`, the gRPC
receiver's lifespan), `deps.py` (named `Annotated` dependencies), and the read APIs under `/api/v1`
(`traces.py`, `drift.py`, `probes.py`) and `/reports` (`reports.py`).

May import: anything in `service` except `cli` and `worker`. Nothing below imports `service.api`.
"""
