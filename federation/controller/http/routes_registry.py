"""The built-in registry over HTTP: PUT, a batch POST, DELETE and a listing.

Each registration is validated by the registry (``sharder.sources.registry``) with the same
words as an inventory; writes need a ``register`` (or ``write``) token and are rate-limited
per token (``app.state.limiter``: a batch of N costs what N single calls do).

A write runs forward on the request's thread: the registry offers the change to the reconcile
loop (``Reconciler.offer``: checked and applied under its lock, the worker woken), and the
route itself writes what must be durable before the answer (a deletion's journal, one fenced
``Pipeline.journal``) and the discovery heartbeat (the registry is being fed: a refresh that
changes nothing keeps it healthy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from federation.controller.base import errors
from federation.controller.controller import Controller
from federation.controller.http import cursors
from federation.controller.http.api_deps import Ctl, Registrar
from federation.controller.http.http_guards import problem
from federation.controller.http.ratelimit import RateLimiter
from federation.controller.http.read_guard import Reader, etag, metered, not_modified
from federation.controller.http.redact import mask_labels
from sharder.sources.lastknown import target_document
from sharder.sources.registry import SOURCE, BatchInvalid, EndpointTaken, IdentityMismatch

router = APIRouter()
MAX_PAGE = 1000
"""``GET /v1/registry/targets`` pages (the default and the most)."""


def _limiter(request: Request) -> RateLimiter:
    limiter: RateLimiter = request.app.state.limiter
    return limiter


Limiter = Annotated[RateLimiter, Depends(_limiter)]


class RegistryBatch(BaseModel):
    """Entries are validated one by one by the registry (``parse_target``), so they stay raw here."""

    model_config = ConfigDict(extra="forbid")
    put: list[Any] = Field(default_factory=list)
    delete: list[Any] = Field(default_factory=list)


@router.put("/v1/registry/targets/{identity:path}", tags=["registry"], status_code=200)
def register(
    identity: str, body: dict[str, Any], caller: Registrar, controller: Ctl, limiter: Limiter
) -> JSONResponse:
    limiter.take(caller.name)
    try:
        target, created = controller.registry.put(identity, body)
    except IdentityMismatch as exc:
        return problem(422, "Invalid target", str(exc), field="identity")
    except EndpointTaken as exc:
        return problem(409, "Endpoint taken", str(exc), field="address")
    controller.discovery.heartbeat(SOURCE)
    return JSONResponse(
        {"identity": target.identity, "expires_in_s": controller.registry.ttl_s},
        status_code=201 if created else 200,
    )


@router.post("/v1/registry/batch", tags=["registry"], status_code=200)
def register_batch(body: RegistryBatch, caller: Registrar, controller: Ctl, limiter: Limiter) -> JSONResponse:
    """Many registrations in one request, all or nothing (``gpufed-exporter fleet``).
    Rate-limited per entry: a batch of N costs what N single calls do."""
    limiter.take(caller.name, max(1, len(body.put) + len(body.delete)))
    registry = controller.registry
    try:
        batch = registry.check_batch(body.put, body.delete)
        _journal(controller, batch.deleting)  # durable before anything is applied or answered
        result = registry.apply_batch(batch)
    except BatchInvalid as exc:
        return problem(422, "Invalid batch", str(exc), errors=exc.errors, invalid=exc.total)
    except EndpointTaken as exc:  # taken by a PUT while the batch was being checked
        return problem(409, "Endpoint taken", str(exc), field="address")
    controller.discovery.heartbeat(SOURCE)
    return JSONResponse(
        {
            "put": result.put,
            "created": result.created,
            "deleted": result.deleted,
            "expires_in_s": controller.registry.ttl_s,
        }
    )


@router.delete("/v1/registry/targets/{identity:path}", tags=["registry"], status_code=204)
def deregister(identity: str, caller: Registrar, controller: Ctl, limiter: Limiter) -> Response:
    limiter.take(caller.name)
    _journal(controller, controller.registry.registered([identity]))
    found = controller.registry.delete(identity)
    controller.discovery.heartbeat(SOURCE)
    if not found:
        raise errors.NotFound(f"no registered target {identity!r}")
    return Response(status_code=204)


def _journal(controller: Controller, identities: Sequence[str]) -> None:
    """Store deletions first: a restart must not bring back what a caller was told is gone
    (the loop stores its sets with its next step). One fenced call: a deposed leader writes
    none of it (503)."""
    if identities:
        controller.pipeline.journal({SOURCE: dict.fromkeys(identities)})


@router.get("/v1/registry/targets", tags=["registry"], response_model=None)
@metered
def registered(
    request: Request,
    controller: Ctl,
    budget: Reader,
    offset: Annotated[int, Query(ge=0, le=2**53)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE,
    cursor: Annotated[str | None, Query(max_length=cursors.MAX_CURSOR)] = None,
) -> Response:
    """One page of registrations by identity (sorted once per membership change, then sliced);
    ``cursor`` continues after the previous page's last identity (``cursors``)."""
    registry = controller.registry
    after = None if cursor is None else cursors.decode(cursor)
    tag = etag("registry", id(registry), registry.revision, offset, limit, after)
    unchanged = not_modified(request, tag)
    if unchanged is not None:
        return unchanged
    total, page = registry.page(offset=offset, limit=limit, after=after)
    budget.charge(len(page))
    rows = [_row(target_document(t), identity=t.identity, left=left) for t, left in page]
    body = {
        "total": total,
        "offset": offset,
        "limit": limit,
        "version": registry.revision,
        "next_cursor": cursors.next_cursor([r["identity"] for r in rows], limit=limit),
        "targets": rows,
    }
    return JSONResponse(body, headers={"ETag": tag})


def _row(document: dict[str, Any], *, identity: str, left: float) -> dict[str, Any]:
    """A registration as listed: its labels masked as every surface masks them."""
    if isinstance(document.get("labels"), dict):
        document["labels"] = mask_labels(document["labels"])
    return {**document, "identity": identity, "expires_in_s": round(left, 1)}
