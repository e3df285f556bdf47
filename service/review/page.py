"""The review page and its JSON API: sign-in, the queue list, the item view, labels, progress, export.

Pages (`/review`, `/review/items/{id}`, `/review/login`) are static HTML
shells; `static/review.js` fills them from the JSON API under
`/api/v1/review` and writes every piece of trace text with `textContent`, so
an answer or chunk holding HTML or script shows as text and never runs. Every
response carries a Content-Security-Policy that allows scripts and styles
from this origin only (no inline script), and `no-store` caching.

Access: reviewers only (see `service/review/session.py`); a reviewer sees the
tenants granted to them and nothing else: an item of another tenant answers
404 exactly as an item that does not exist. The ingest API key middleware
lets these paths through; this router does its own authentication.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from service.errors import Unauthenticated, UnknownTenant
from service.ingest.auth import TenantResolver, key_from_headers
from service.ingest.wire import TimeInRange
from service.judge.judgment import FailureMode
from service.probes.golden import ExpectedBehaviour
from service.review.calibration import calibrate
from service.review.export import golden_rows, to_jsonl
from service.review.item_view import claim_marks_error, item_detail, listed
from service.review.records import (
    ClaimRefused,
    ItemFilters,
    ItemState,
    Queue,
    Reason,
    ReviewIn,
)
from service.review.session import LOGIN_COOKIE, LOGIN_TTL_S, SESSION_COOKIE, Reviewer, ReviewerAuth

__all__ = ["CSP", "ReviewerDep", "router"]

HERE = Path(__file__).resolve().parent
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
_SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}
_STATIC = {"review.js": "text/javascript; charset=utf-8", "review.css": "text/css; charset=utf-8"}

router = APIRouter(tags=["review"])


def _secure(response: Response) -> Response:
    response.headers.update(_SECURITY_HEADERS)
    return response


def _page(name: str, status: int = 200, fill: dict[str, str] | None = None) -> Response:
    """A template as the page; `fill` replaces its `<!-- name -->` placeholders with static HTML."""
    html = (HERE / "templates" / name).read_text(encoding="utf-8")
    for placeholder, content in (fill or {}).items():
        html = html.replace(f"<!-- {placeholder} -->", content)
    return _secure(Response(html, status, media_type="text/html; charset=utf-8"))


def _json(body: Any, status: int = 200) -> Response:
    return _secure(JSONResponse(body, status))


def _error(status: int, error: str, detail: str) -> Response:
    return _json({"error": error, "detail": detail}, status)


def _pipeline(request: Request) -> Any:
    pipeline = getattr(request.app.state, "pipeline", None)
    if pipeline is None:
        raise RuntimeError("the review API needs the running pipeline")
    return pipeline


def _auth(request: Request) -> ReviewerAuth:
    auth: ReviewerAuth | None = getattr(request.app.state, "review_auth", None)
    if auth is None:
        auth = ReviewerAuth(request.app.state.config.review)
        request.app.state.review_auth = auth
    return auth


def _bearer(request: Request) -> str | None:
    value = request.headers.get("authorization", "")
    if not value.lower().startswith("bearer "):
        return None
    return value[7:].strip() or None


def _signed_in(request: Request) -> Reviewer | None:
    """The reviewer of the request's bearer token or session cookie, or None."""
    auth = _auth(request)
    token = _bearer(request)
    if token is not None:
        return auth.by_token(token)
    session = auth.read(request.cookies.get(SESSION_COOKIE))
    if session is None:
        return None
    if request.method not in ("GET", "HEAD") and not auth.same(
        request.headers.get("x-csrf-token"), session.csrf
    ):
        raise HTTPException(403, "missing or wrong X-CSRF-Token header")
    return session.reviewer


def _reviewer(request: Request) -> Reviewer:
    """The signed-in reviewer (401 otherwise); writes made with the session cookie need its CSRF token."""
    reviewer = _signed_in(request)
    if reviewer is None:
        raise HTTPException(401, "sign in at /review/login")
    return reviewer


ReviewerDep = Annotated[Reviewer, Depends(_reviewer)]


# -- pages and static files ----------------------------------------------------------------------


NO_REVIEWERS = (
    '<div class="panel" id="no-reviewers" role="note"><p><strong>No reviewers are configured on this ragmon'
    "</strong>, so nobody can sign in yet. To add one, pick a long random token and give ragmon its SHA-256, "
    "with the tenants the reviewer may see, then restart it:</p>"
    '<pre class="mono small">python3 -c \'import hashlib, secrets; t = secrets.token_urlsafe(24); '
    "print(t, hashlib.sha256(t.encode()).hexdigest())'\n"
    "RAGMON_REVIEW__REVIEWERS='{&quot;me&quot;: {&quot;token_sha256&quot;: &quot;&lt;the sha256&gt;&quot;, "
    "&quot;tenants&quot;: [&quot;default&quot;]}}' ragmon serve</pre>"
    "<p>(or <code>review.reviewers</code> in the config file). Then sign in here with the token; "
    "docs/review.md has the rest.</p></div>"
)
"""What the sign-in page says when `review.reviewers` is empty: how to add a reviewer (static text)."""


@router.get("/review/login", include_in_schema=False)
async def login_page(request: Request) -> Response:
    none = not request.app.state.config.review.reviewers
    response = _page("review_login.html", fill={"no-reviewers": NO_REVIEWERS if none else ""})
    response.set_cookie(
        LOGIN_COOKIE,
        _auth(request).new_login_token(),
        httponly=False,  # the page echoes it in a header (double-submit)
        samesite="strict",
        secure=request.app.state.config.review.secure_cookie,
        path="/",
        max_age=LOGIN_TTL_S,
    )
    return response


def _to_sign_in() -> Response:
    return _secure(RedirectResponse("/review/login", 303))


@router.get("/review", include_in_schema=False)
async def list_page(request: Request) -> Response:
    if _signed_in(request) is None:
        return _to_sign_in()
    return _page("review_list.html")


@router.get("/review/items/{item_id}", include_in_schema=False)
async def item_page(item_id: int, request: Request) -> Response:
    reviewer = _signed_in(request)
    if reviewer is None:
        return _to_sign_in()
    item = await asyncio.to_thread(_pipeline(request).reviews.get, item_id, reviewer.tenants)
    if item is None:
        return _page("review_missing.html", 404)
    return _page("review_item.html")


@router.get("/static/{name}", include_in_schema=False)
async def static_file(name: str) -> Response:
    if name not in _STATIC:
        return _error(404, "not_found", "no such file")
    body = (HERE / "static" / name).read_bytes()
    return _secure(Response(body, media_type=_STATIC[name]))


# -- session ------------------------------------------------------------------------------------


class SignIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: str = Field(min_length=1, max_length=4096)


@router.post("/api/v1/review/session", summary="Sign a reviewer in (sets the session cookie)")
async def sign_in(body: SignIn, request: Request) -> Response:
    auth = _auth(request)
    if not auth.login_token_ok(request.headers.get("x-csrf-token"), request.cookies.get(LOGIN_COOKIE)):
        return _error(403, "csrf", "open /review/login first; the sign-in form sends its token")
    reviewer = auth.by_token(body.token)
    if reviewer is None and not request.app.state.config.review.reviewers:
        return _error(
            401, "unauthenticated", "no reviewers are configured: set review.reviewers (see /review/login)"
        )
    if reviewer is None:
        return _error(401, "unauthenticated", "unknown reviewer token")
    response = _json({"reviewer": reviewer.name, "tenants": list(reviewer.tenants)})
    response.set_cookie(
        SESSION_COOKIE,
        auth.issue(reviewer),
        httponly=True,
        samesite="strict",
        secure=request.app.state.config.review.secure_cookie,
        path="/",
        max_age=int(request.app.state.config.review.session_ttl_s),
    )
    response.delete_cookie(LOGIN_COOKIE, path="/")
    return response


@router.get("/api/v1/review/session", summary="Who is signed in, and the CSRF token for writes")
async def whoami(request: Request, reviewer: ReviewerDep) -> Response:
    session = _auth(request).read(request.cookies.get(SESSION_COOKIE))
    return _json(
        {
            "reviewer": reviewer.name,
            "tenants": list(reviewer.tenants),
            "csrf": None if session is None else session.csrf,
            "lease_s": request.app.state.config.review.lease_s,
        }
    )


@router.delete("/api/v1/review/session", summary="Sign out")
async def sign_out(reviewer: ReviewerDep) -> Response:
    response = _json({"signed_out": reviewer.name})
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


# -- items --------------------------------------------------------------------------------------


def _filters(
    queue: Queue | None = None,
    app: str | None = None,
    reason: Reason | None = None,
    diagnosis: str | None = None,
    state: ItemState | None = None,
) -> ItemFilters:
    return ItemFilters(queue=queue, app=app or None, reason=reason, diagnosis=diagnosis or None, state=state)


FiltersDep = Annotated[ItemFilters, Depends(_filters)]


@router.get("/api/v1/review/items", summary="Review items of the reviewer's tenants, by priority")
async def list_items(
    request: Request,
    reviewer: ReviewerDep,
    filters: FiltersDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> Response:
    reviews = _pipeline(request).reviews
    items = await asyncio.to_thread(reviews.list_items, reviewer.tenants, filters, limit=limit)
    apps = await asyncio.to_thread(reviews.apps, reviewer.tenants)
    return _json({"items": [listed(i) for i in items], "apps": apps})


@router.get("/api/v1/review/items/{item_id}", summary="One item with its trace, judgment and review")
async def get_item(item_id: int, request: Request, reviewer: ReviewerDep, filters: FiltersDep) -> Response:
    pipeline = _pipeline(request)
    item = await asyncio.to_thread(pipeline.reviews.get, item_id, reviewer.tenants)
    if item is None:
        return _error(404, "not_found", "no such review item")
    detail = await asyncio.to_thread(item_detail, pipeline, item, filters, reviewer.tenants)
    return _json(detail)


def _refused(exc: ClaimRefused) -> Response:
    body = {
        "error": "conflict",
        "detail": str(exc),
        "state": exc.state,
        "reviewer": exc.reviewer,
        "lease_until": None if exc.lease_until is None else exc.lease_until.isoformat(),
    }
    return _json(body, 409)


@router.post("/api/v1/review/items/{item_id}/claim", summary="Lease an item to the signed-in reviewer")
async def claim(item_id: int, request: Request, reviewer: ReviewerDep) -> Response:
    pipeline = _pipeline(request)
    lease_s = request.app.state.config.review.lease_s
    try:
        item = await asyncio.to_thread(
            pipeline.reviews.claim, item_id, reviewer.name, reviewer.tenants, lease_s
        )
    except ClaimRefused as exc:
        return _refused(exc)
    if item is None:
        return _error(404, "not_found", "no such review item")
    return _json(item.to_json() if item.queue != "blind" else listed(item))


@router.post("/api/v1/review/items/{item_id}/release", summary="Give a claimed item back")
async def release(item_id: int, request: Request, reviewer: ReviewerDep) -> Response:
    released = await asyncio.to_thread(
        _pipeline(request).reviews.release, item_id, reviewer.name, reviewer.tenants
    )
    if released is None:
        return _error(404, "not_found", "no such review item")
    return _json({"released": released})


@router.post("/api/v1/review/next", summary="Lease the highest-priority open item matching the filters")
async def claim_next(request: Request, reviewer: ReviewerDep, filters: FiltersDep) -> Response:
    pipeline = _pipeline(request)
    lease_s = request.app.state.config.review.lease_s
    item = await asyncio.to_thread(
        pipeline.reviews.claim_next, reviewer.name, reviewer.tenants, lease_s, filters
    )
    if item is None:
        return _json({"item": None})
    return _json({"item": listed(item)})


class ReviewBody(BaseModel):
    """A reviewer's label for one item."""

    model_config = ConfigDict(extra="forbid")
    verdict: Literal["faithful", "unfaithful", "unsure"]
    failure_mode: FailureMode | None = None
    expected_chunk_ids: list[Annotated[str, Field(min_length=1, max_length=512)]] = Field(
        default_factory=list, max_length=100
    )
    reference_answer: str | None = Field(None, max_length=20_000)
    category: str | None = Field(None, max_length=200)
    expected_behaviour: ExpectedBehaviour = "answer"
    note: str | None = Field(None, max_length=20_000)
    claims_supported: list[bool] | None = Field(
        None,
        max_length=500,
        description="true or false for each of the judge's claims, in order (`claims_to_label` of the item)",
    )


@router.post(
    "/api/v1/review/items/{item_id}/review",
    summary="Record a review; closes the item (201). The reviewer who labelled an item may label it "
    "again: the later label replaces theirs (200, replaced)",
    status_code=201,
)
async def submit(item_id: int, body: ReviewBody, request: Request, reviewer: ReviewerDep) -> Response:
    pipeline = _pipeline(request)
    item = await asyncio.to_thread(pipeline.reviews.get, item_id, reviewer.tenants)
    if item is None:
        return _error(404, "not_found", "no such review item")
    error = await asyncio.to_thread(claim_marks_error, pipeline, item, body.claims_supported)
    if error is not None:
        return _error(422, "invalid_claim_marks", error)
    try:
        review = ReviewIn(
            verdict=body.verdict,
            failure_mode=body.failure_mode,
            expected_chunk_ids=tuple(c.strip() for c in body.expected_chunk_ids if c.strip()),
            reference_answer=(body.reference_answer or "").strip() or None,
            category=(body.category or "").strip() or None,
            expected_behaviour=body.expected_behaviour,
            note=(body.note or "").strip() or None,
            claims_supported=None if body.claims_supported is None else tuple(body.claims_supported),
        )
    except ValueError as exc:
        return _error(422, "invalid_review", str(exc))
    review = pipeline.redacted(review)  # with redaction on, a reviewer's text is redacted too
    try:
        record = await asyncio.to_thread(
            pipeline.reviews.submit, item_id, reviewer.name, reviewer.tenants, review
        )
    except ClaimRefused as exc:
        return _refused(exc)
    if record is None:
        return _error(404, "not_found", "no such review item")
    await pipeline.after_review(record)
    body_out = {
        "item_id": record.item_id,
        "verdict": body.verdict,
        "reviewer": record.reviewer,
        "replaced": record.replaced,
    }
    return _json(body_out, 200 if record.replaced else 201)


class SendBody(BaseModel):
    """A trace someone wants reviewed."""

    model_config = ConfigDict(extra="forbid")
    trace_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    tenant: str | None = Field(None, description="needed only by reviewers granted several tenants")
    note: str | None = Field(None, max_length=2000)


@router.post("/api/v1/review/items", summary="Send a trace to the review queue (API key or reviewer)")
async def send(body: SendBody, request: Request) -> Response:
    """Reviewers send with their session or token; apps and scripts with an ingest API key."""
    pipeline = _pipeline(request)
    bearer = _bearer(request)
    tenants: tuple[str, ...]
    if request.cookies.get(SESSION_COOKIE) or (bearer and _auth(request).by_token(bearer)):
        tenants = _reviewer(request).tenants
    else:
        resolver = TenantResolver(request.app.state.config.auth)
        client = request.client.host if request.client else None
        try:
            tenants = (resolver.resolve(key_from_headers(request.headers.items()), client),)
        except (Unauthenticated, UnknownTenant) as exc:
            return _error(401 if isinstance(exc, Unauthenticated) else 403, exc.reason, str(exc))
    tenant = body.tenant or (tenants[0] if len(tenants) == 1 else None)
    if tenant is None or tenant not in tenants:
        return _error(404, "not_found", "no such trace")
    trace = await asyncio.to_thread(pipeline.store.get_trace, tenant, body.trace_id)
    if trace is None:
        return _error(404, "not_found", "no such trace")
    new = await pipeline.review_intake.send(tenant, body.trace_id, trace["app"], body.note)
    item = await asyncio.to_thread(pipeline.reviews.find, tenant, "flagged", body.trace_id)
    return _json({"item_id": item.id if item else None, "new": new}, 201 if new else 200)


# -- progress, calibration, export ---------------------------------------------------------------


@router.get("/api/v1/review/progress", summary="Open, claimed and done counts per queue and reviewer")
async def progress(request: Request, reviewer: ReviewerDep) -> Response:
    found = await asyncio.to_thread(_pipeline(request).reviews.progress, reviewer.tenants)
    return _json(found.to_json(datetime.now(UTC)))


@router.get("/api/v1/review/calibration", summary="Judge versus reviewer agreement per judge version")
async def calibration(request: Request, reviewer: ReviewerDep) -> Response:
    rows = await asyncio.to_thread(_pipeline(request).reviews.calibration_rows, reviewer.tenants)
    return _json({"calibration": [c.to_json() for c in calibrate(rows)]})


@router.get("/api/v1/review/export", summary="Reviewed items as golden-set JSONL (download)")
async def export(
    request: Request,
    reviewer: ReviewerDep,
    since: TimeInRange | None = None,
    format: Literal["review", "golden"] = "review",
) -> Response:
    pipeline = _pipeline(request)

    def export_jsonl() -> str:
        # reading and serializing every reviewed item is work for a thread, not the event loop
        rows, _skipped = golden_rows(
            pipeline.reviews, pipeline.store, reviewer.tenants, since=since, provenance=format == "review"
        )
        return to_jsonl(rows)

    body = await asyncio.to_thread(export_jsonl)
    response = Response(body, media_type="application/x-ndjson; charset=utf-8")
    response.headers["Content-Disposition"] = f'attachment; filename="ragmon-golden-{format}.jsonl"'
    return _secure(response)
