"""The controller's HTTP API: thin FastAPI routes over :class:`~federation.controller.Controller`.

Errors are ``application/problem+json`` (RFC 9457 style) naming the field: 422 for a bad
body, 404 for an unknown child/shard/target, 409 for a stale plan, 401/403 for tokens,
413 for a body over the limit, 429 (with ``Retry-After``) for a token over its
registration rate or a full registry, 503 on a replica that may not write or a state
store that refused the write. GETs are open (HTTP
SD must be, for children); every POST/PUT/DELETE needs a bearer token with its scope.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from federation.controller.base import errors
from federation.controller.controller import Controller
from federation.controller.http import cursors, routes_changes, routes_registry
from federation.controller.http.api_deps import Forbidden
from federation.controller.http.auth import Authenticator
from federation.controller.http.client_address import ClientAddress
from federation.controller.http.http_guards import BodyGuard, RelativeRedirects, problem
from federation.controller.http.ratelimit import RateLimited, RateLimiter
from federation.controller.http.read_guard import (
    ReadAdmission,
    Reader,
    etag,
    limited_response,
    metered,
    not_modified,
    read_limiter,
)
from federation.controller.http.redact import MaskedFiles
from federation.controller.stores.store import StoreError
from federation.controller.stores.store_watch import StoreHealth, StoreSlow, WriteGate
from federation.master import meta_monitoring
from sharder.kernel.errors import SharderError
from sharder.sources.registry import RegistryFull

log = logging.getLogger(__name__)
PROBLEM = "application/problem+json"
VERSION_HEADER = "X-Gpufed-Assignment-Version"
MAX_BODY = 1 << 20
MAX_BATCH_BODY = 16 << 20
"""``POST /v1/registry/batch`` only: about 50,000 registrations per request."""
MAX_PAGE = 1000
"""``GET /v1/targets`` pages: a bigger page would let unauthenticated reads starve HTTP SD."""
WEB_DIR = Path(__file__).resolve().parents[2] / "web"
WEB_MEDIA = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
# The page's scripts and styles come only from /web/ (no inline code): with API strings
# inserted as text, this policy is the second fence against markup from a registry.
WEB_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
}


def _cut(text: str, most: int = 200) -> str:
    """A field name or message from the request, short enough to echo (a key may be 100 kB)."""
    return text if len(text) <= most else f"{text[:most]}... ({len(text)} characters)"


FREE_PATHS = frozenset({"/healthz", "/readyz", "/metrics", meta_monitoring.SD_CHILDREN_PATH})
"""Never charged to a client without a token (with ``/v1/sd/...``): HTTP SD and health."""


def _store_busy(why: str) -> JSONResponse:
    busy = problem(503, "State store busy", why)
    busy.headers["Retry-After"] = "5"
    return busy


def free_of_charge(path: str) -> bool:
    return path in FREE_PATHS or path.startswith("/v1/sd/")


def create_app(
    controller: Controller,
    *,
    auth: Authenticator,
    leader: Callable[[], str | None] | None = None,
    clients: ClientAddress | None = None,
    store_health: StoreHealth | None = None,
) -> FastAPI:
    app = FastAPI(
        title="gpufed controller",
        version="1",
        description="Shard map, HTTP SD for child Prometheus servers, plans and rebalances.",
    )
    metrics = controller.metrics
    views, publication, children = controller.views, controller.publication, controller.children
    """What the read routes depend on directly: the read model, the SD snapshot, the children."""

    app.state.auth = auth
    masked = MaskedFiles()
    app.state.controller = controller
    app.state.limiter = RateLimiter(
        rate=controller.options.registry_rate, burst=controller.options.registry_burst
    )
    app.state.read_limiter = read_limiter(
        rate=controller.options.read_rate, burst=controller.options.read_burst
    )

    # ---- errors -------------------------------------------------------------------------
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {
                "field": ".".join(_cut(str(p)) for p in e.get("loc", ()) if p != "body") or "body",
                "message": _cut(str(e.get("msg", ""))),
            }
            for e in exc.errors()[:20]
        ]
        first = errors[0] if errors else {"field": "body", "message": "invalid"}
        return problem(422, "Invalid request", f"field '{first['field']}': {first['message']}", errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem(exc.status_code, str(exc.detail), str(exc.detail))

    @app.exception_handler(errors.ControllerError)
    async def _domain(request: Request, exc: errors.ControllerError) -> JSONResponse:
        if isinstance(exc, errors.Conflict):
            return problem(409, "Conflict", str(exc), current_version=exc.current_version)
        if isinstance(exc, errors.NotFound):
            return problem(404, "Not found", str(exc))
        if isinstance(exc, errors.Invalid):
            return problem(422, "Invalid change", str(exc), field=exc.field)
        if isinstance(exc, errors.Unavailable):
            return problem(503, "Not the leader", str(exc), leader=exc.leader)
        if isinstance(exc, Forbidden):
            return problem(403, "Forbidden", str(exc))
        unauthorized = problem(401, "Unauthorized", "a bearer token is required (Authorization: Bearer ...)")
        unauthorized.headers["WWW-Authenticate"] = 'Bearer realm="gpufed"'
        return unauthorized

    @app.exception_handler(RateLimited)
    async def _limited(request: Request, exc: RateLimited) -> JSONResponse:
        return limited_response(exc)

    @app.exception_handler(RegistryFull)
    async def _full(request: Request, exc: RegistryFull) -> JSONResponse:
        # Room comes back as entries expire: ask again after one TTL (not a 5xx: nothing broke).
        retry = max(1, math.ceil(controller.registry.ttl_s))
        response = problem(429, "Registry full", str(exc), retry_after_s=retry)
        response.headers["Retry-After"] = str(retry)
        return response

    @app.exception_handler(StoreError)
    async def _store(request: Request, exc: StoreError) -> JSONResponse:
        if isinstance(exc, StoreSlow):  # a read that would have waited on a sick store
            slow = problem(503, "State store not answering", str(exc))
            slow.headers["Retry-After"] = "5"
            return slow
        log.error("state store write failed: %s", exc)
        return problem(503, "State store unavailable", f"the change was not stored: {exc}")

    @app.exception_handler(SharderError)
    async def _input(request: Request, exc: SharderError) -> JSONResponse:
        return problem(422, "Invalid target", str(exc), field=getattr(exc, "field", ""))

    # ---- health ---------------------------------------------------------------------------
    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz() -> JSONResponse:
        # Readiness is about HTTP SD, which a failed config render does not stop; the
        # failure is a field here, in /v1/status and gpufed_controller_config_render_ok.
        # "settling": SD is served but the start-up work (first bundle, the engine's index)
        # goes on: 503, told apart from "starting" so an orchestrator can tell the two.
        state = controller.readiness()
        ready = state == "ready"
        body: dict[str, Any] = {"ready": ready, "state": state,
                                "assignment_version": controller.state.assignment_version}  # fmt: skip
        if state == "settling":
            body["settling"] = True
        if controller.startup.settled_after_s is not None:
            body["settled_after_s"] = controller.startup.settled_after_s
        if store_health is not None:  # a store that stopped answering: let the orchestrator act
            body["store"] = store_health.report()
            ready = ready and body["store"]["answering"]
            body["ready"] = ready
        if controller.publisher is not None:
            published = controller.publisher.status
            body["configs_ok"] = published.ok
            if not published.ok:
                body["configs_error"] = published.error[:500]
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics", tags=["health"])
    async def prometheus_metrics() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    # ---- HTTP SD --------------------------------------------------------------------------------
    sd_ok = metrics.sd_requests.labels(code="200")
    sd_missing = metrics.sd_requests.labels(code="404")

    def sd_answer(child: str, job: str | None) -> Response:
        started = time.perf_counter()
        snapshot = publication.sd
        body = snapshot.answer(child, job)
        if body is None:
            sd_missing.inc()
            what = f"child {child!r}" if snapshot.child_shard.get(child) is None else f"job {job!r}"
            return problem(404, "Not found", f"unknown {what}")
        sd_ok.inc()
        children.note_fetch(snapshot.child_shard[child])
        metrics.sd_latency.observe(time.perf_counter() - started)
        return Response(body, media_type="application/json", headers={VERSION_HEADER: str(snapshot.version)})

    @app.get("/v1/sd/{child}", tags=["sd"], summary="HTTP SD: every job's targets of one child")
    async def sd_child(child: str) -> Response:
        return sd_answer(child, None)

    @app.get("/v1/sd/{child}/{job}", tags=["sd"], summary="HTTP SD: one job's targets of one child")
    async def sd_child_job(child: str, job: str) -> Response:
        return sd_answer(child, job)

    @app.get(meta_monitoring.SD_CHILDREN_PATH, tags=["sd"], summary="HTTP SD: every child, for the master")
    def sd_children() -> list[dict[str, Any]]:
        return meta_monitoring.children_groups(controller.spec, controller.state.assignment)

    # ---- shards and targets ------------------------------------------------------------------
    @app.get("/v1/shards", tags=["shards"])
    @metered
    def shards(budget: Reader) -> dict[str, Any]:
        rows = views.shard_rows()
        budget.charge(len(rows))
        return {"assignment_version": controller.state.assignment_version, "shards": rows}

    @app.get("/v1/load", tags=["shards"], summary="Observed samples/s per shard next to the GPU load")
    @metered
    def load(budget: Reader) -> dict[str, Any]:
        return controller.load_report()

    @app.get("/v1/targets", tags=["targets"], response_model=None)
    @metered
    def targets(
        request: Request,
        budget: Reader,
        region: Annotated[str | None, Query(max_length=200)] = None,
        shard: Annotated[str | None, Query(max_length=200)] = None,
        q: Annotated[str | None, Query(max_length=200)] = None,
        offset: Annotated[int, Query(ge=0, le=2**53)] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
        cursor: Annotated[str | None, Query(max_length=cursors.MAX_CURSOR)] = None,
    ) -> Response:
        """One page of targets, by identity; rows are built for the page only (an index kept
        per assignment). ``ETag``/``If-None-Match`` answer 304 while nothing changed.
        ``cursor`` (``next_cursor`` of the previous page) continues after its last row, so a
        walk over a changing set neither skips nor repeats; ``version`` names what was read."""
        after = None if cursor is None else cursors.decode(cursor)
        version = views.read_version()
        tag = etag("targets", version, region, shard, q, offset, limit, after)
        unchanged = not_modified(request, tag)
        if unchanged is not None:
            return unchanged
        total, rows = views.target_page(
            region=region, shard=shard, q=q, offset=offset, limit=limit, after=after
        )
        budget.charge(len(rows))
        body = {
            "total": total,
            "offset": offset,
            "limit": limit,
            "version": controller.state.assignment_version,
            "next_cursor": cursors.next_cursor([r["identity"] for r in rows], limit=limit),
            "targets": rows,
        }
        return JSONResponse(body, headers={"ETag": tag})

    @app.get(
        "/v1/targets/{identity:path}", tags=["targets"], summary="Which children scrape a target, and why"
    )
    @metered
    def target(identity: str, budget: Reader) -> dict[str, Any]:
        return views.explain(identity)

    @app.get("/v1/handovers", tags=["shards"])
    @metered
    def handovers(budget: Reader) -> dict[str, Any]:
        now = time.time()
        moving = controller.state.handovers
        budget.charge(len(moving))
        return {
            "handovers": [
                {
                    **h.model_dump(mode="json"),
                    "age_s": round(now - h.started_at, 1),
                    "remaining_s": round(max(0.0, h.deadline - now), 1),
                }
                for h in moving
            ]
        }

    @app.get("/v1/status", tags=["health"])
    @metered
    def status(budget: Reader) -> dict[str, Any]:
        state = controller.state
        publish = controller.publisher.status if controller.publisher is not None else None
        return {
            "ready": controller.ready,
            "assignment_version": state.assignment_version,
            "version": controller.current_version(),
            "desired": state.desired.model_dump(mode="json"),
            "targets": len(state.assignment.targets) if state.assignment else 0,
            "shards": len(state.assignment.shards) if state.assignment else 0,
            "handovers": len(state.handovers),
            "discovery": controller.discovery_rows(),
            **controller.replica_status(),
            **({"leader": leader()} if leader is not None else {}),
            "configs": None if publish is None else vars(publish),
            "auth": "dev (no token needed)" if auth.dev else "bearer token",
        }

    app.include_router(routes_changes.router)
    app.include_router(routes_registry.router)

    # ---- configs --------------------------------------------------------------------------------
    @app.get("/v1/configs", tags=["configs"], summary="Published config files and the last check")
    @metered
    def configs(budget: Reader) -> dict[str, Any]:
        if controller.publisher is None:
            return {"files": [], "status": None}
        files = controller.publisher.files
        return {
            "files": [{"path": p, "bytes": len(files[p])} for p in sorted(files)],
            "status": vars(controller.publisher.status),
        }

    @app.get("/v1/configs/{path:path}", tags=["configs"], summary="One published file (secrets never shown)")
    @metered
    def config_file(path: str, budget: Reader) -> Response:
        files = controller.publisher.files if controller.publisher is not None else {}
        if path not in files:
            raise errors.NotFound(f"no published file {path!r}")
        media = "application/json" if path.endswith(".json") else "application/yaml"
        return Response(masked.get(files, path), media_type=media)

    # ---- the web page -------------------------------------------------------------------------
    @app.get("/", include_in_schema=False)
    def index() -> HTMLResponse:
        page = WEB_DIR / "index.html"
        if page.is_file():
            return HTMLResponse(page.read_text(encoding="utf-8"), headers=WEB_HEADERS)
        return HTMLResponse("<h1>gpufed controller</h1><p>See <a href='/docs'>/docs</a>.</p>")

    @app.get("/web/{name}", include_in_schema=False)
    def web_asset(name: str) -> Response:
        # Flat names with a known suffix only: nothing outside WEB_DIR can be asked for.
        media = WEB_MEDIA.get(Path(name).suffix)
        path = WEB_DIR / name
        if media is None or path.parent != WEB_DIR or not path.is_file():
            raise errors.NotFound(f"no web asset {name!r}")
        return Response(path.read_bytes(), media_type=media, headers=WEB_HEADERS)

    if store_health is not None:  # innermost: a slot is taken once the body has arrived
        app.add_middleware(
            WriteGate,  # type: ignore[arg-type]
            health=store_health,
            refuse=_store_busy,
        )
    app.add_middleware(
        BodyGuard,  # type: ignore[arg-type]
        limit=MAX_BODY,
        larger={"/v1/registry/batch": MAX_BATCH_BODY},
    )
    app.add_middleware(RelativeRedirects)  # type: ignore[arg-type]
    app.add_middleware(
        ReadAdmission,  # type: ignore[arg-type]
        limiter=lambda: app.state.read_limiter,
        auth=auth,
        clients=clients or ClientAddress(),
        free=free_of_charge,
    )  # outermost: a refused client costs no body read
    return app
